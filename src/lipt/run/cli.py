"""Entry points: `train.py`, `pretrain.py`, `select.py` and the `lipt-*` console scripts.

Mistakes a user can fix end with one line on stderr and exit code 2, never a traceback: the
overrides are composed and checked before Hydra starts the run (so nothing is written), and a
`UserError` raised while running is reported the same way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig

from lipt.core.errors import UserError, fail, one_line
from lipt.run.frontier_sweep import check_frontier_settings, with_reference
from lipt.run.slurm import check_slurm_launcher, is_slurm_launcher
from lipt.stages.run import Run


def config_dir() -> Path:
    """configs/ of the repository (lipt is installed editable), or $LIPT_CONFIG_DIR."""
    env = os.environ.get("LIPT_CONFIG_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[3] / "configs"
    if not (path / "train.yaml").is_file():
        fail(f"no lipt configs at {path}; set LIPT_CONFIG_DIR to the repository's configs/")
    return path


def _candidate_overrides(args: list[str], declared: list[str]) -> list[list[str]]:
    """Override lists to compose: sweeps (`a=1,2`) are expanded value by value, so a bad choice
    anywhere in a multirun is caught before any job starts. `declared`: the config's own
    `hydra.sweeper.params` (an experiment's approaches, fractions and seeds). As in Hydra's
    BasicSweeper they come first, then `args`; a repeated key keeps its first place and takes
    its last value (so `+approach=...` precedes `+experiment=...`, as in the jobs)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    by_key: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides([*declared, *args]):
        key = o.get_key_element()
        if o.is_interval_sweep():  # an Optuna search's interval(a, b): both of its ends
            interval = o.value()
            by_key[key] = [f"{key}={interval.start}", f"{key}={interval.end}"]  # type: ignore[union-attr]
        elif o.is_sweep_override():
            by_key[key] = [f"{key}={value}" for value in o.sweep_string_iterator()]
        else:
            by_key[key] = [str(o.input_line)]
    by_key = {key: values for key, values in by_key.items() if values}
    firsts = {key: values[0] for key, values in by_key.items()}
    candidates = [list(firsts.values())]
    for key, values in by_key.items():
        candidates += [[*{**firsts, key: value}.values()] for value in values[1:]]
    return candidates


@dataclass(frozen=True)
class DeclaredSweep:
    """What the config's sweeper declares: `params` as overrides, and the frontier sweeper's
    reference job (`hydra/sweeper=frontier`; empty for Hydra's basic sweeper)."""

    params: list[str]
    reference: list[str]
    point_keys: list[str]
    # A run that is not a multirun: its config, composed once here (Hydra's node dropped).
    single: DictConfig | None = None

    def with_reference(self, jobs: list[list[str]]) -> list[list[str]]:
        """`jobs` and the reference jobs the frontier sweeper adds to them."""
        if not self.reference:
            return jobs
        return with_reference(jobs, self.reference, self.point_keys)


def _declared_sweep(config_name: str, args: list[str], multirun: bool) -> DeclaredSweep:
    """The config's `hydra.sweeper.params` as overrides, composed from the command line's
    single-valued overrides (`hydra.sweeper.params.*` ones included); empty when the config
    declares none or the run is not a multirun (`-m`, or `hydra.mode: MULTIRUN` in the config)."""
    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    parsed = OverridesParser.create().parse_overrides(args)
    fixed = [str(o.input_line) for o in parsed if not o.is_sweep_override()]
    cfg = compose(config_name, overrides=fixed, return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    check_frontier_settings(sweeper, cfg.hydra.get("callbacks"))
    launcher = cfg.hydra.get("launcher")
    if is_slurm_launcher(launcher):  # before anything is submitted
        check_slurm_launcher(launcher, multirun or cfg.hydra.mode == RunMode.MULTIRUN)
    if not multirun and cfg.hydra.mode != RunMode.MULTIRUN:
        if len(fixed) < len(args):
            return DeclaredSweep([], [], [])  # a sweep's values without -m: composed each
        with open_dict(cfg):
            del cfg["hydra"]  # what compose(..., return_hydra_config=False) drops
        return DeclaredSweep([], [], [], single=cfg)
    declared = sweeper.get("params")
    params = OmegaConf.to_container(declared) if declared else {}
    assert isinstance(params, dict)
    return DeclaredSweep(
        [f"{key!s}={value}" for key, value in params.items()],
        [str(o) for o in sweeper.get("reference") or []],
        [str(k) for k in sweeper.get("point_keys") or []],
    )


def compose_jobs(
    config_name: str,
    jobs: list[list[str]],
    composed: dict[tuple[str, ...], DictConfig] | None = None,
) -> Generator[DictConfig, None, None]:
    """Each job's config as `hydra.compose` makes it, without Hydra's node. Jobs that differ
    only in plain values, not in a config group's choice, share one composition: Hydra sets
    those values after composing the defaults, and so does this, with Hydra's own function
    (a sweep's seeds and fractions cost a copy, not a composition of ~30 files). `composed`:
    the compositions by their group choices, kept across calls (filled here)."""
    import copy

    from hydra import compose, initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    composed = {} if composed is None else composed
    parser = OverridesParser.create()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        loader = hydra.config_loader
        assert isinstance(loader, ConfigLoaderImpl)
        # Hydra's repository of config files depends on the job's hydra.searchpath alone: made
        # once (it reads the primary config: most of a job's cost in a sweep of values)
        repos: dict[tuple[str, ...], Any] = {}
        for job in jobs:
            # as Hydra's defaults list tells them apart (hydra._internal.defaults_list.Overrides)
            parsed = parser.parse_overrides(job)
            own = tuple(str(o.input_line) for o in parsed if o.is_hydra_override())
            if own not in repos:
                repos[own] = loader._parse_overrides_and_create_caching_repo(config_name, job)[1]
            repo = repos[own]
            is_value = [
                not o.is_hydra_override()
                and (isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group))
                for o in parsed
            ]
            groups = tuple(line for line, value in zip(job, is_value, strict=True) if not value)
            if groups not in composed:
                composed[groups] = compose(config_name, list(groups), return_hydra_config=False)
            cfg = copy.deepcopy(composed[groups])
            values = [o for o, value in zip(parsed, is_value, strict=True) if value]
            ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
            yield cfg


def precheck(config_name: str, args: list[str], multirun: bool = False) -> int | None:
    """Compose and validate the config from `args` as Hydra will; exit 2 on the first problem.
    A sweep's candidate jobs (each value once) get every check; every job (up to
    CHECKED_JOBS) gets those that build nothing, the rules across keys among them. With
    `dry_run=true`, also build what each run builds first; returns the number of jobs checked
    then (None without dry_run)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lipt.run.config import validate

    # Hydra's own settings are not the run's, but its search path finds a user's config files.
    overrides = [
        a
        for a in args
        if a.startswith("hydra.searchpath=") or not a.startswith(("hydra.", "hydra/"))
    ]
    # compose_jobs holds Hydra's context between its configs: closed here, not whenever a
    # traceback that refers to them is collected (which would clear Hydra under other code)
    generators: list[Generator[DictConfig, None, None]] = []
    # a sweep's candidate jobs are composed, then every job: each choice of groups once
    kept: dict[tuple[str, ...], DictConfig] = {}

    def opened(jobs: Generator[DictConfig, None, None]) -> Generator[DictConfig, None, None]:
        generators.append(jobs)
        return jobs

    try:
        from lipt.core.lock import check_unlocked  # before Hydra writes .hydra/ into it

        ddp_child = os.environ.get("LOCAL_RANK", "0") != "0"  # shares its rank 0's folder
        for arg in args:
            if arg.startswith("hydra.run.dir=") and not ddp_child:
                check_unlocked(Path(arg.split("=", 1)[1]))
            if arg.startswith(("hydra.run.dir=", "hydra.sweep.dir=")):
                check_writable(arg)
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            declared = _declared_sweep(config_name, args, multirun)
        jobs: list[list[str]] = []  # a single run's one job is its candidate
        if declared.single is not None:
            composed: Iterable[DictConfig] = [declared.single]
        else:
            candidates = _candidate_overrides(overrides, declared.params)
            composed = opened(compose_jobs(config_name, declared.with_reference(candidates), kept))
            jobs = declared.with_reference(_every_job(overrides, declared.params))
        configs = []
        for cfg in composed:
            cfg.paths.output_dir = "."  # ${hydra:...} is not resolvable outside a run
            validate(cfg, deep=False)
            configs.append(cfg)
        # then what builds the Trainer, selector, ... (imports torch)
        runs = [validate(cfg) for cfg in configs]
        for cfg in opened(compose_jobs(config_name, jobs, kept)):  # the rules across keys
            cfg.paths.output_dir = "."
            validate(cfg, build=False)
        if not any(run.settings.dry_run for run in runs):
            return None
        from lipt.run.preflight import build_everything

        loaded: dict[str, Any] = {}
        for run in runs:
            build_everything(run, loaded)
        return max(len(jobs), 1)
    except (HydraException, OmegaConfBaseException, UserError) as e:
        fail(one_line(e) + ("" if isinstance(e, UserError) else _hint(e)))
    finally:
        for generator in generators:  # left mid-way by a refusal: their Hydra context ends now
            generator.close()
        GlobalHydra.instance().clear()


# precheck composes every job of a sweep up to this many; past it, every value of each swept
# key. A job costs about 10 ms (each choice of groups is composed once, ~0.1 s): a tenth of
# Hydra's own composition of the job when it runs.
CHECKED_JOBS = 10_000


def _every_job(args: list[str], declared: list[str]) -> list[list[str]]:
    """Every combination of a sweep's values (as Hydra's BasicSweeper makes the jobs)."""
    import itertools

    candidates = _candidate_overrides(args, declared)
    by_key: dict[str, list[str]] = {}
    for candidate in candidates:
        for override in candidate:
            key = override.split("=", 1)[0]
            by_key.setdefault(key, [])
            if override not in by_key[key]:
                by_key[key].append(override)
    size = 1
    for values in by_key.values():
        size *= len(values)
    if size > CHECKED_JOBS:
        return candidates
    return [list(job) for job in itertools.product(*by_key.values())]


def check_writable(arg: str) -> None:
    """A run or sweep folder named on the command line can be made and written."""
    from lipt.run.preflight import unwritable

    key, _, value = arg.partition("=")
    problem = unwritable(Path(value))
    if problem is not None:
        raise UserError(f"{key}={value} cannot be written ({problem}); choose a writable folder")


def _hint(e: BaseException) -> str:
    text = str(e)
    if "Could not find" in text or "Could not override" in text or "Key '" in text:
        return " (see `--help` for the groups and options, `+key=value` adds a new key)"
    return ""


def launch(config_name: str, stage_module: str) -> None:
    """Check the overrides, then hand over to Hydra, whose task turns the composed config into
    the run's typed settings (lipt.run.config.validate) and calls the stage's `run` with them
    (`stage_module`: lipt.stages.train, lipt.stages.pretrain or lipt.stages.select). The stage,
    and with it Lightning, is imported only once the overrides pass: a mistake is answered in a
    second."""
    import importlib
    import time

    import hydra
    from hydra.errors import HydraException

    private_matplotlib_dir()  # before precheck's deep checks or the stage import Lightning
    args = sys.argv[1:]
    flags = [a for a in args if a.startswith("-")]
    overrides = [a for a in args if not a.startswith("-")]
    # Hydra's own flags (--help, --cfg, --info, ...) go straight through; -m still gets checked.
    if all(f in ("-m", "--multirun") for f in flags):
        jobs = precheck(config_name, overrides, multirun=bool(flags))
        if jobs is not None:  # dry_run=true
            print(
                f"dry run: {jobs} job{'s' if jobs != 1 else ''} composed, checked and built; "
                "nothing was trained or written"
            )
            return

    @hydra.main(config_path=str(config_dir()), config_name=config_name, version_base="1.3")
    def main(cfg: DictConfig) -> Any:
        # First, as when the stage was imported before Hydra started: Lightning sets up its own
        # loggers on import, before console.setup routes them.
        stage: Callable[[Run], Any] = importlib.import_module(stage_module).run
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        from lipt.core import console
        from lipt.core.lock import RunDirLockedError, released_after
        from lipt.run.config import validate

        output_dir = Path(str(cfg.paths.output_dir))
        made_now = made_for_this_job(output_dir, started)
        keep_caches_in(output_dir)
        console.setup(multirun_job=is_multirun())
        try:
            with released_after(output_dir):
                summary = stage(validate(cfg))
            console.report_result(summary, output_dir)
            return task_result(cfg, summary)
        except UserError as e:
            # a locked folder is another run's, and one that was there before is the user's or
            # an earlier attempt's: kept
            if made_now and not isinstance(e, RunDirLockedError):
                remove_if_only_bookkeeping(output_dir)
            fail(one_line(e))
        except SIGTERMException:  # Lightning's handler ends the fit with SystemExit(None): 0
            stopped_by_sigterm(str(cfg.get("stage")), output_dir)

    started = time.time()  # after precheck's probes: a run folder Hydra makes is changed later
    try:
        main()
    except HydraException as e:  # `--help` composes the overrides outside Hydra's error report
        fail(one_line(e) + _hint(e))


def is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def private_matplotlib_dir() -> None:
    """Lightning imports matplotlib, which fixes its config and font-cache folder once per
    process (under $HOME), and the stage (and precheck's deep checks) import Lightning before
    Hydra has made the run folder: give it a temporary folder, removed at exit, unless the user
    chose one."""
    import atexit
    import shutil
    import tempfile

    if "MPLCONFIGDIR" not in os.environ:
        path = tempfile.mkdtemp(prefix="lipt-matplotlib-")
        os.environ["MPLCONFIGDIR"] = path
        atexit.register(shutil.rmtree, path, ignore_errors=True)


def keep_caches_in(run_dir: Path) -> None:
    """Libraries lipt uses keep caches and debug logs under $HOME (wandb, XDG users); a run
    writes only to its own folder, so point them there unless the user chose a place
    (matplotlib's: private_matplotlib_dir)."""
    cache = run_dir / ".cache"
    for name, sub in (
        ("WANDB_CACHE_DIR", "wandb"),
        ("WANDB_CONFIG_DIR", "wandb-config"),
        ("WANDB_DATA_DIR", "wandb-data"),
        ("XDG_CACHE_HOME", "xdg"),
        ("XDG_CONFIG_HOME", "xdg-config"),
    ):
        os.environ.setdefault(name, str(cache / sub))


def made_for_this_job(run_dir: Path, since: float) -> bool:
    """Whether Hydra made `run_dir` for this job (at its start): changed since `since` (a folder
    that was there keeps its time while Hydra rewrites .hydra/ and appends to the log) and
    holding only .hydra/ and the job's log."""
    from hydra.core.hydra_config import HydraConfig

    if not run_dir.is_dir():  # paths.output_dir set elsewhere: the stage makes it
        return True
    ours = {".hydra", f"{HydraConfig.get().job.name}.log"}
    return run_dir.stat().st_mtime >= since and {p.name for p in run_dir.iterdir()} <= ours


def stopped_by_sigterm(stage: str, run_dir: Path) -> NoReturn:
    """One line on how to resume, and exit code 143 (128 + SIGTERM, as a shell reports it)."""
    import signal

    from hydra.core.hydra_config import HydraConfig

    folder = f"hydra.sweep.dir={HydraConfig.get().sweep.dir}" if is_multirun() else None
    again = "ckpt_path=last " if stage == "train" else ""  # learners are reused by any stage
    print(
        f"stopped by SIGTERM; resume with {again}{folder or f'hydra.run.dir={run_dir}'}",
        file=sys.stderr,
    )
    sys.exit(128 + signal.SIGTERM)


def remove_if_only_bookkeeping(run_dir: Path) -> None:
    """A run refused for bad input leaves nothing behind: drop the folder Hydra made for it
    (made_for_this_job) when it holds only what Hydra wrote at start (.hydra/, the log)."""
    import logging
    import shutil

    if not run_dir.is_dir():
        return
    if all(p.name in (".hydra", ".cache") or p.suffix == ".log" for p in run_dir.iterdir()):
        logging.shutdown()  # close the log file before removing it
        shutil.rmtree(run_dir, ignore_errors=True)
        # outputs/<stage>/<date> made for this run alone go with it (below the working dir only)
        cwd = Path.cwd().resolve()
        for parent in run_dir.resolve().parents:
            if cwd not in parent.parents:
                break
            try:
                parent.rmdir()  # only when empty
            except OSError:
                break


def train_main() -> None:
    """`python train.py` / `lipt-train`: the whole pipeline."""
    launch("train", "lipt.stages.train")


def pretrain_main() -> None:
    """`python pretrain.py` / `lipt-pretrain`: stage 1 alone."""
    launch("pretrain", "lipt.stages.pretrain")


def select_main() -> None:
    """`python select.py` / `lipt-select`: stage 2 alone."""
    launch("select", "lipt.stages.select")


def task_result(cfg: DictConfig, summary: dict[str, Any]) -> Any:
    """What the stage returns to Hydra: the summary, or, with `optimized_metric`, that number
    of it (a float, as the Optuna sweeper asks)."""
    metric = cfg.get("optimized_metric")
    if metric is None:
        return summary
    value = summary.get(str(metric))
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise UserError(f"optimized_metric={metric}: this run's summary.json has no number there")
    return float(value)
