"""A sweep's launcher and sweeper settings that would make it run other than it reads, each
refused in one line before any job: DDP that relaunches the command line inside a local
multirun, an Optuna search that would crash, tune a seed or pick the worst trial, a SLURM job
folder the launcher would ignore, a jigsaw learner sweep whose settings would share one folder.
lipt.run.sweep_overrides calls them on the jobs it reads from the command line; the learner
sweep's check runs again in lipt.run.hydra_callbacks, on the multirun's own overrides."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from lipt.core.errors import UserError
from lipt.core.host import trainer_world_size
from lipt.run.slurm import LIPT_LAUNCHER

# paths.output_dir as the configs set it: the folder Hydra makes for the job.
HYDRA_JOB_FOLDER = "${hydra:runtime.output_dir}"
# What lipt's SLURM launcher sets paths.output_dir to, spelled without spaces.
LAUNCHER_JOB_FOLDERS = (HYDRA_JOB_FOLDER, "${hydra:sweep.dir}/${hydra:sweep.subdir}")


# DDP's strategies that start their processes from this one (spawned or forked), not by running
# the command line again.
IN_PROCESS_STRATEGIES = ("ddp_spawn", "ddp_fork", "ddp_notebook")


def check_ddp_in_multirun(trainer: DictConfig) -> None:
    """Lightning starts DDP's extra processes by running the command line again (its
    subprocess launcher): under -m that is the whole sweep again in each of them, whose jobs
    wait on each other. `strategy: auto` on several processes is DDP too (Lightning's choice
    outside a notebook), and so are FSDP and DeepSpeed (the same launcher). A SLURM launcher's
    tasks are the processes instead (srun starts them)."""
    strategy = str(trainer.get("strategy", "auto"))
    auto = strategy == "auto"
    relaunched = strategy.startswith(("ddp", "fsdp", "deepspeed"))
    if not auto and (not relaunched or strategy.startswith(IN_PROCESS_STRATEGIES)):
        return
    processes = trainer_world_size(trainer)
    if processes == 1 or (auto and (processes is None or processes < 2)):
        return
    what = (
        f"trainer.strategy=auto on {processes} processes (trainer.devices="
        f"{trainer.get('devices')}) is Lightning's DDP: it"
        if auto
        else f"trainer.strategy={strategy} on {processes or 'several'} processes"
    )
    raise UserError(
        f"{what} starts each extra one by running the command again, which under -m runs the "
        f"whole sweep again; run the jobs one at a time (python train.py trainer.strategy="
        f"{strategy if not auto else 'ddp'} seed=0 ...), or submit the sweep with "
        "hydra/launcher=slurm hydra.launcher.tasks_per_node=<the processes>"
    )


def check_optuna_sweeper(sweeper: DictConfig, metric: Any) -> None:
    """An Optuna search (hparams_search=lr_wd) asks each trial for one number and maximises it:
    settings under which it would train every trial and end in Optuna's traceback (a job that
    returns the whole summary, no trial to run or none at a time), or choose the worst trial."""
    for key in ("n_trials", "n_jobs"):
        value = sweeper.get(key)
        if type(value) is int and value < 1:
            what = "runs no trial" if key == "n_trials" else "launches no trial at a time"
            raise UserError(f"hydra.sweeper.{key}={value} {what}; give 1 or more")
    check_optuna_storage(sweeper.get("storage"))
    if metric is None:
        raise UserError(
            "the Optuna sweeper optimises the number each trial returns, but "
            "optimized_metric=null returns the whole summary, which every trial would fail on "
            "after training; set optimized_metric=val_accuracy (or use Hydra's basic sweeper)"
        )
    directions = sweeper.get("direction")
    if not isinstance(directions, str) and directions is not None:
        directions = [str(d) for d in directions]
        if len(directions) != 1:
            raise UserError(
                f"hydra.sweeper.direction={directions} optimises {len(directions)} objectives, "
                f"but optimized_metric={metric} is one number; give one direction (maximize)"
            )
        (directions,) = directions
    if directions is not None and str(directions).lower().endswith("minimize"):
        raise UserError(
            f"hydra.sweeper.direction={directions} would choose the trial of the lowest "
            f"{metric}; use hydra.sweeper.direction=maximize"
        )


def check_optuna_storage(storage: Any) -> None:
    """A study kept in a database (`hydra.sweeper.storage`, a URL) goes through SQLAlchemy,
    whose 2.x releases Optuna 2's database storage fails on (an assertion as it creates the
    study, before the first trial): refused in a line where both are installed."""
    if storage is None or not str(storage).strip() or str(storage).startswith("redis"):
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        optuna, sqlalchemy = version("optuna"), version("sqlalchemy")
    except PackageNotFoundError:
        return
    if int(optuna.split(".")[0]) < 3 and int(sqlalchemy.split(".")[0]) >= 2:
        raise UserError(
            f"hydra.sweeper.storage={storage}: Optuna {optuna}'s database storage does not run "
            f"on the SQLAlchemy {sqlalchemy} installed here (the study would stop in a "
            f"traceback before its first trial); leave hydra.sweeper.storage=null, a study "
            f"in memory for the sweep"
        )


def check_no_seed_search(overrides: list[str]) -> None:
    """An Optuna search samples every swept key as a hyper-parameter: a swept seed (`seed`,
    `dataset.split_seed`, ...) would give each trial one seed, and the search would choose
    partly by the luckiest seed (or validation split) what it reports as the best settings."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.get_key_element().lstrip("+~")
        name = key.rsplit(".", 1)[-1]
        if o.is_hydra_override() or not o.is_sweep_override():
            continue
        if name == "seed" or name.endswith("_seed"):
            raise UserError(
                f"{o.input_line}: an Optuna search samples each swept key as a hyper-parameter, "
                f"so every trial would train one of these seeds and the best trial would be "
                f"partly the luckiest seed; give one ({key}=0), then train the best_params of "
                f"<sweep dir>/optimization_results.yaml over seeds (-m {key}=0,1,2)"
            )


def check_job_folder(launcher: DictConfig, cfg: DictConfig) -> None:
    """lipt's SLURM launcher runs each job in its sweep folder (hydra.sweep.dir/subdir), which
    it sets as the job's paths.output_dir: another paths.output_dir would be ignored."""
    from omegaconf import OmegaConf

    paths = OmegaConf.to_container(cfg.paths) if "paths" in cfg else None  # as set: unresolved
    folder = paths.get("output_dir") if isinstance(paths, dict) else HYDRA_JOB_FOLDER
    spelled = re.sub(r"\s+", "", str(folder))
    if launcher.get("_target_") == LIPT_LAUNCHER and spelled not in LAUNCHER_JOB_FOLDERS:
        raise UserError(
            f"paths.output_dir={folder} is ignored: hydra/launcher=slurm runs each job in "
            "hydra.sweep.dir/hydra.sweep.subdir; drop paths.output_dir and choose the folder "
            "with hydra.sweep.dir=..."
        )


# The key a jigsaw learner multirun sweeps: each job trains those learners (pretrain.py -m).
LEARNERS_KEY = "pretrain.learners"


def other_swept_keys(overrides: list[str]) -> list[str] | None:
    """The keys a jigsaw learner sweep sweeps beside `pretrain.learners` (None: `overrides`
    give no `pretrain.learners`, so the multirun is no learner sweep)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    if not any(o.key_or_group == LEARNERS_KEY for o in parsed):
        return None
    return [
        o.key_or_group for o in parsed if o.is_sweep_override() and o.key_or_group != LEARNERS_KEY
    ]


def check_learner_sweep(overrides: list[str], pretrain: Mapping[str, Any], merges: bool) -> bool:
    """Whether a multirun's `overrides` make it a jigsaw learner sweep (`pretrain.learners`
    given): its jobs write their learners into one folder, <sweep dir>/learners unless
    `pretrain.learner_dir` says otherwise, which the soup callback (`merges`) merges.

    Raises:
        UserError: it also sweeps another key where learners of two settings would share a
            folder (the soup callback's one set, or the default one), or the pretrain strategy
            is not jigsaw.
    """
    others = other_swept_keys(overrides)
    if others is None:
        return False
    if others and merges:
        raise UserError(
            f"the soup callback merges one set of jigsaw learners, but this multirun also sweeps "
            f"{', '.join(others)}; sweep only {LEARNERS_KEY} (one multirun per setting)"
        )
    folder = pretrain.get("learner_dir")
    if others and (not folder or "${" not in str(folder)):  # the default, or one fixed folder
        raise UserError(
            f"the jobs of this multirun write their jigsaw learners to one folder "
            f"({folder or '<sweep dir>/learners'}), but it also sweeps {', '.join(others)}: one "
            f"setting's learners "
            f"would replace another's; sweep only {LEARNERS_KEY} (one multirun per setting), "
            f"or give each setting its own folder "
            f"('pretrain.learner_dir=<folder>_${{{others[0]}}}')"
        )
    if pretrain.get("name") != "jigsaw":
        raise UserError(f"{LEARNERS_KEY} needs pretrain=jigsaw (got {pretrain.get('name')})")
    return True


def check_sweep_subdir(sweep: DictConfig, jobs: int) -> None:
    """`hydra.sweep.subdir` names each job's folder in the sweep folder: one without `${...}`
    is the same folder for every job, where each job would overwrite the one before (its
    summary.json and checkpoints) and the sweep's table would count one run."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(sweep, resolve=False)
    assert isinstance(raw, dict)
    subdir, folder = raw.get("subdir"), str(raw.get("dir"))
    # Hydra resolves the sweep folder for each job too: one of the job's keys (s${seed})
    # parts the jobs as a subdir would; ${now:...} is the same for all
    per_job = "${" in str(subdir) or re.search(r"\$\{(?!now:)", folder) is not None
    if jobs > 1 and subdir is not None and not per_job:
        raise UserError(
            f"hydra.sweep.subdir={subdir} is one folder for all {jobs} jobs of the sweep, each "
            "overwriting the one before; give each job its own, e.g. "
            "'hydra.sweep.subdir=${hydra.job.num}' (the default) or "
            "'hydra.sweep.subdir=${hydra.job.override_dirname}'"
        )
