"""A sweep's launcher and sweeper settings that would make it run other than it reads, each
refused in one line before any job: DDP that relaunches the command line inside a local
multirun, an Optuna search that would crash, tune a seed or pick the worst trial, a SLURM job
folder the launcher would ignore, a jigsaw learner sweep whose settings would share one folder.
lipt.run.declared_sweep calls them on the jobs it reads from the command line; the learner
sweep's check runs again in lipt.run.hydra_callbacks, on the multirun's own overrides."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

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


def check_sweep_subdir(sweep: DictConfig, jobs: Sequence[Sequence[str]]) -> None:
    """`hydra.sweep.subdir` names each job's folder in the sweep folder: one without `${...}`
    is the same folder for every job, where each job would overwrite the one before (its
    summary.json and checkpoints) and the sweep's table would count one run. So is one whose
    keys (s${seed}) are the same in jobs that differ in another (fraction=0.1,0.2).

    `jobs`: each job's overrides (key=value)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(sweep, resolve=False)
    assert isinstance(raw, dict)
    subdir, folder = raw.get("subdir"), str(raw.get("dir"))
    count = len(jobs)
    # Hydra resolves the sweep folder for each job too: one of the job's keys (s${seed})
    # parts the jobs as a subdir would; ${now:...} is the same for all
    per_job = "${" in str(subdir) or re.search(r"\$\{(?!now:)", folder) is not None
    if count > 1 and subdir is not None and not per_job:
        raise UserError(
            f"hydra.sweep.subdir={subdir} is one folder for all {count} jobs of the sweep, each "
            "overwriting the one before; give each job its own, e.g. "
            "'hydra.sweep.subdir=${hydra.job.num}' (the default) or "
            "'hydra.sweep.subdir=${hydra.job.override_dirname}'"
        )
    if subdir is None:
        return
    shared = keys_one_folder_ignores(sweep, f"{folder}/{subdir}", jobs)
    if shared:
        raise UserError(
            f"hydra.sweep.subdir={subdir} (in hydra.sweep.dir={folder}) is one folder for jobs "
            f"that differ only in {', '.join(shared)}, each overwriting the one before; name "
            f"{'it' if len(shared) == 1 else 'them'} in it too, or use the default "
            "'hydra.sweep.subdir=${hydra.job.num}'"
        )


# What names each job's folder apart whatever its keys (hydra.job.override_dirname: every
# override but its exclude_keys, handled below).
JOB_UNIQUE = ("job.num", "job.id")
REFERENCE = re.compile(r"\$\{([^${}]+)\}")  # the innermost ${...}


def keys_one_folder_ignores(
    sweep: DictConfig, path: str, jobs: Sequence[Sequence[str]]
) -> list[str]:
    """The keys two jobs differ in whose folder `path` (sweep.dir/sweep.subdir, unresolved)
    is nonetheless the same, sorted; [] where every job has its own folder or where it cannot
    be told from the overrides alone (a key of the folder set by an interpolation or a config
    group's option: an `approach` may set the `seed` the folder names)."""
    from omegaconf import OmegaConf

    root = cast(DictConfig, sweep._get_root())  # the composed config: as the jobs start
    named: set[str] = set()
    every_but: set[str] | None = None  # hydra.job.override_dirname: all keys but these
    for ref in REFERENCE.findall(path):
        ref = ref.strip()
        hydra_key = ref.removeprefix("hydra:").removeprefix("hydra.")
        if hydra_key in JOB_UNIQUE:
            return []
        if hydra_key == "job.override_dirname":
            excluded = OmegaConf.select(root, "hydra.job.config.override_dirname.exclude_keys")
            every_but = {str(k) for k in excluded or ()}
        elif hydra_key.startswith("runtime.choices."):
            named.add(hydra_key.removeprefix("runtime.choices."))
        elif ref.startswith(("now:", "hydra:", "hydra.")):
            continue  # the same for every job of the sweep
        elif ":" in ref or derived(root, ref):
            return []  # another resolver, or an interpolation: its value is not in the overrides
        else:
            named.add(ref)
    groups = set(OmegaConf.select(root, "hydra.runtime.choices") or {}) | config_groups(jobs)

    def may_set(group: str) -> bool:
        """Whether a group's option may set a key of the folder: one of _global_ package (no
        node of its own: approach) may set any; one with its node (selector) that node and,
        through its defaults list, another group's, but no top-level value (seed)."""
        if not isinstance(root.get(group), DictConfig):
            return True
        return any("." in key for key in named) or every_but is not None

    def in_folder(key: str) -> bool:
        if every_but is not None and key not in every_but:
            return True
        return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in named)

    seen: dict[tuple[tuple[str, str], ...], set[tuple[str, str]]] = {}
    for job in jobs:
        pairs = {(k.lstrip("+~"), v) for k, _, v in (o.partition("=") for o in job)}
        folder = tuple(sorted(p for p in pairs if in_folder(p[0])))
        other = seen.setdefault(folder, pairs)
        differ = sorted({k for k, _ in other ^ pairs})
        if differ and not any(may_set(k) for k in differ if k in groups):
            return differ
    return []


def config_groups(jobs: Sequence[Sequence[str]]) -> set[str]:
    """The keys of the jobs' overrides that may choose a config group's option beyond those
    the composed config chose (hydra.runtime.choices): one added (+approach=...), a group's
    path (hydra/launcher) or package (group@pkg). A top-level value added so (+tag=a) is
    taken for one too: a folder is refused only where the overrides tell."""
    lines = {o.partition("=")[0] for job in jobs for o in job}
    return {
        line.lstrip("+~")
        for line in lines
        if "/" in line or "@" in line or (line.startswith("+") and "." not in line)
    }


def derived(root: DictConfig, key: str) -> bool:
    """Whether `key`'s value in the composed config is an interpolation (${...}) of others."""
    from omegaconf import OmegaConf

    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(root, parent) if parent else root
    return isinstance(node, DictConfig) and leaf in node and OmegaConf.is_interpolation(node, leaf)
