"""Entry points: `train.py`, `pretrain.py`, `select.py` and the `lipt-*` console scripts.

Mistakes a user can fix end with one line on stderr and exit code 2, never a traceback: the
overrides are composed and checked before Hydra starts the run (lipt.run.precheck: nothing is
written), and a `UserError` raised while running is reported the same way.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig

from lipt.core.errors import UserError, fail, one_line
from lipt.run.composition import config_dir
from lipt.run.precheck import override_hint, precheck
from lipt.stages.run import Run


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
    args = check_flags(sys.argv[1:])
    if args.experimental_rerun is not None:
        refuse_rerun(args.experimental_rerun, config_name)
    if is_checked_first(args):
        shown = args.cfg is not None
        try:
            with sigterm_stops_the_run():
                overrides = with_config_dir(args.overrides, args.config_dir)
                jobs = precheck(config_name, overrides, args.multirun, shown, args.run)
        except (KeyboardInterrupt, RunStopped) as e:  # while checking (a dry run reads the data)
            signum = e.signum if isinstance(e, RunStopped) else signal.SIGINT
            print(
                f"stopped by {signum.name} before the run started; nothing was written",
                file=sys.stderr,
            )
            sys.exit(128 + signum)
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
            with sigterm_stops_the_run(), released_after(output_dir):
                summary = stage(validate(cfg))
            if is_multirun():  # the next job's wandb runs from its own folder
                end_wandb_service()
            console.report_result(summary, output_dir)
            return task_result(cfg, summary)
        except UserError as e:
            # a locked folder is another run's, and one that was there before is the user's or
            # an earlier attempt's: kept
            if made_now and not isinstance(e, RunDirLockedError):
                remove_if_only_bookkeeping(output_dir)
            fail(one_line(e))
        except SIGTERMException:  # Lightning's handler ends the fit with SystemExit(None): 0
            stopped_by_signal(signal.SIGTERM, str(cfg.get("stage")), output_dir)
        except RunStopped as e:  # SIGTERM outside a fit
            stopped_by_signal(e.signum, str(cfg.get("stage")), output_dir)
        except KeyboardInterrupt:  # Ctrl-C outside a fit
            stopped_by_signal(signal.SIGINT, str(cfg.get("stage")), output_dir)
        except SystemExit as e:
            # Lightning answers Ctrl-C in a fit with sys.exit(1), its note in the log only
            if isinstance(e.__context__, KeyboardInterrupt):
                stopped_by_signal(signal.SIGINT, str(cfg.get("stage")), output_dir)
            raise

    started = time.time()  # after precheck's probes: a run folder Hydra makes is changed later
    sweep = args.multirun and is_checked_first(args)
    try:
        with sigterm_stops_the_run(sweep_sigterm if sweep else stage_sigterm):
            main()
    except HydraException as e:  # `--help` composes the overrides outside Hydra's error report
        fail(one_line(e) + override_hint(e))
    except (KeyboardInterrupt, RunStopped) as e:  # outside a job: Hydra's start, a sweep's wait
        signum = e.signum if isinstance(e, RunStopped) else signal.SIGINT
        print(f"stopped by {signum.name}; {how_to_resume(e, args.multirun)}", file=sys.stderr)
        sys.exit(128 + signum)


class RunStopped(BaseException):
    """SIGTERM reached a run outside Lightning's fits (loading data, between the jigsaw
    learners, merging, scoring, selecting, writing files; Hydra's start): raised where the
    run was, so that it ends as a stop in a fit does, with one line on how to resume
    (stopped_by_signal). A BaseException: no `except Exception` of the stage takes it for a
    failure of its own."""

    def __init__(self, signum: signal.Signals) -> None:
        super().__init__(f"stopped by {signum.name}")
        self.signum = signum


def stage_sigterm(signum: int, frame: Any) -> None:
    """The SIGTERM handler of a run (sigterm_stops_the_run). Inside a fit Lightning's handler
    takes its place and calls it after its own: there Lightning ends the fit at its next step
    (SIGTERMException), and this one leaves it to do so."""
    if signal.getsignal(signal.SIGTERM) is stage_sigterm:
        raise RunStopped(signal.Signals(signum))


@contextmanager
def sigterm_stops_the_run(handler: Callable[[int, Any], None] = stage_sigterm) -> Iterator[None]:
    """SIGTERM answered by `handler` while the block runs, in place of the default (the process
    killed without a word) and of the sweep's own handler while a job runs in the sweep's process
    (the basic launcher's jobs meet SIGTERM as a single run does). A handler another library set
    (submitit's in a cluster job) is kept, and so is any handler outside the main thread, which
    cannot set one. The handler that was there is put back after."""
    previous = signal.getsignal(signal.SIGTERM)
    ours = threading.current_thread() is threading.main_thread() and previous in (
        signal.SIG_DFL,
        sweep_sigterm,
        stage_sigterm,
    )
    if ours:
        signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        # unless another took its place meanwhile (lipt.core.requeue's, when SLURM's time-limit
        # signal is SIGTERM, holds to the end of the process)
        if ours and signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, previous)


class SweepStopped(RunStopped):
    """SIGTERM reached a sweep's own process while its launcher waits on jobs run elsewhere
    (joblib's workers): raised there, so that the launcher ends its workers (joblib aborts on
    any exception), which otherwise went on training every job of a sweep that had ended."""


def sweep_sigterm(signum: int, frame: Any) -> None:
    """The SIGTERM handler of a sweep's own process (launch): see SweepStopped."""
    raise SweepStopped(signal.Signals(signum))


def how_to_resume(e: BaseException, multirun: bool) -> str:
    """What to run after a stop outside a job: a sweep resumes in its folder; a run stopped
    while Hydra started it had not begun its work."""
    if not multirun:
        return "the run had not started; run it again"
    folder = sweep_dir_of(e)
    return f"resume with the same command and ckpt_path=last hydra.sweep.dir={folder or '<sweep>'}"


def sweep_dir_of(e: BaseException) -> str | None:
    """The sweep folder, read where the sweep was stopped: Hydra's sweepers (the basic one,
    which every launcher runs under by default) hold it as `sweep_dir` while their jobs run;
    the sweep's process has no HydraConfig of its own to read it from."""
    import traceback

    for frame, _ in traceback.walk_tb(e.__traceback__):
        found = frame.f_locals.get("sweep_dir")
        if isinstance(found, str | Path):
            return str(found)
    return None


def check_flags(args: list[str]) -> argparse.Namespace:
    """The command line as Hydra's own parser reads it. What Hydra refuses, in one line:
    overrides it would not read (those after a flag that follows an override), --resolve without
    --cfg or --help, and two of its commands at once (-m with --cfg: a traceback there)."""
    from hydra._internal.utils import get_args_parser

    known, unread = get_args_parser().parse_known_args(args)
    if unread:
        flags = " ".join(a for a in args if a.startswith("-"))
        fail(f"{' '.join(unread)} would not be read: give Hydra's flags ({flags}) first")
    if known.resolve and not (known.cfg or known.help):
        fail("--resolve only goes with --cfg job|hydra|all (or --help)")
    if known.shell_completion and not (known.help or known.hydra_help):
        check_shell_completion(known.overrides)
    commands = [
        flag
        for flag, given in (
            ("--run", known.run),
            ("--multirun", known.multirun),
            ("--cfg", known.cfg is not None),
            ("--info", known.info is not None),
            ("--shell-completion", known.shell_completion),
        )
        if given
    ]
    if len(commands) > 1 and not (known.help or known.hydra_help):  # help is answered first
        fix = (
            "--cfg prints one job's config; check a sweep's jobs with -m ... dry_run=true"
            if {"--multirun", "--cfg"} <= set(commands)
            else "Hydra takes one of them"
        )
        fail(f"{' and '.join(commands)} do not go together: {fix}")
    return known


def refuse_rerun(path: str, config_name: str) -> NoReturn:
    """Hydra's --experimental-rerun calls the task with the pickled config alone, without the
    job's Hydra node that every run reads (`${hydra:runtime.output_dir}`: a traceback), or
    raises on a file it lacks: the command that runs the job again, in one line, instead."""
    import pickle
    import shlex

    try:
        with open(path, "rb") as f:
            overrides = list(pickle.load(f).hydra.overrides.task)
    except (OSError, pickle.UnpicklingError, AttributeError, EOFError, ImportError) as e:
        # lipt's runs write no config.pickle (Hydra's PickleJobInfoCallback is not set)
        fail(
            f"--experimental-rerun {path} cannot be read ({type(e).__name__}); run the job "
            f"again with the overrides in its <run>/.hydra/overrides.yaml: python "
            f"{config_name}.py <overrides>"
        )
    again = " ".join(shlex.quote(o) for o in overrides)
    fail(
        f"--experimental-rerun runs a job without its Hydra run folder, which lipt's runs "
        f"need; run it again with its overrides: python {config_name}.py {again}"
    )


# What Hydra's --shell-completion takes: one command, for one of the shells it has a plugin for.
COMPLETION_COMMANDS = ("install", "uninstall", "query")
COMPLETION_SHELLS = ("bash", "zsh", "fish")


def check_shell_completion(overrides: list[str]) -> None:
    """--shell-completion takes one of install=, uninstall= or query= a shell: Hydra answers
    anything else (none given, a shell it has no plugin for) with a traceback."""
    given = [o for o in overrides if o.partition("=")[0] in COMPLETION_COMMANDS]
    if len(given) == 1 and given[0].partition("=")[2] in COMPLETION_SHELLS:
        return
    shells = ", ".join(COMPLETION_SHELLS)
    what = " ".join(given) or "no command"
    fail(
        f"--shell-completion takes one of install=, uninstall= or query= one shell ({shells}), "
        f"not {what}: --shell-completion install=bash"
    )


def is_checked_first(args: argparse.Namespace) -> bool:
    """Whether precheck reads the command line before Hydra: for a run, a multirun and --cfg,
    which prints the config a run would get (a mistake is answered as the run would answer it).
    Hydra's help and --info go straight through, and so does a command line that picks another
    primary config (--config-name, --config-path) or reruns a job. --config-dir only adds a
    folder to the search path (with_config_dir)."""
    return not (
        args.help
        or args.hydra_help
        or args.info is not None
        or args.shell_completion
        or args.config_path
        or args.config_name
        or args.experimental_rerun
    )


def with_config_dir(overrides: list[str], config_dir: str | None) -> list[str]:
    """`overrides` with --config-dir's folder as the first entry of hydra.searchpath: where
    Hydra puts it too (after lipt's configs, ahead of the search path's other entries), so
    precheck composes what the run will."""
    if config_dir is None:
        return overrides
    folder = Path(config_dir).expanduser().resolve()
    if not folder.is_dir():
        fail(f"--config-dir {config_dir}: no such folder; give a folder of config groups")
    quote = '"' if "'" in str(folder) else "'"  # Hydra's grammar reads spaces and commas quoted
    entry = f"{quote}file://{folder}{quote}"
    out, added = [], False
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+") == "hydra.searchpath" and value.startswith("["):
            rest = value[1:].strip()
            o, added = f"{key}=[{entry}{'' if rest == ']' else ','}{rest}", True
        out.append(o)
    return out if added else [*out, f"hydra.searchpath=[{entry}]"]


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


# The variables keep_caches_in set, with the value it gave each: a multirun's jobs run in one
# process, and each job moves what lipt chose (not what the user did) into its own folder.
CACHES_SET: dict[str, str] = {}


def keep_caches_in(run_dir: Path) -> None:
    """Libraries lipt uses keep caches and debug logs under $HOME (wandb, XDG users); a run
    writes only to its own folder, so point them there unless the user chose a place
    (matplotlib's: private_matplotlib_dir). Each job of a multirun gets its own: a value lipt
    set for an earlier job is replaced, one the user set is kept."""
    cache = run_dir / ".cache"
    for name, sub in (
        ("WANDB_CACHE_DIR", "wandb"),
        ("WANDB_CONFIG_DIR", "wandb-config"),
        ("WANDB_DATA_DIR", "wandb-data"),
        ("XDG_CACHE_HOME", "xdg"),
        ("XDG_CONFIG_HOME", "xdg-config"),
    ):
        current = os.environ.get(name)
        if current is None or current == CACHES_SET.get(name):
            os.environ[name] = CACHES_SET[name] = str(cache / sub)


def end_wandb_service() -> None:
    """wandb reads its folders once per process, when its first run starts its service (which
    writes its debug logs under WANDB_CACHE_DIR): a multirun job that used wandb ends it, so
    that the next job's starts anew in that job's folder (keep_caches_in)."""
    import logging

    wandb = sys.modules.get("wandb")
    teardown = getattr(wandb, "teardown", None)
    if not callable(teardown):
        return
    try:
        teardown()
    except (Exception, SystemExit) as e:  # wandb exits when its service did: the sweep goes on
        logging.getLogger(__name__).warning("wandb's service ended with %r", e)


def made_for_this_job(run_dir: Path, since: float) -> bool:
    """Whether Hydra made `run_dir` for this job (at its start): changed since `since` (a folder
    that was there keeps its time while Hydra rewrites .hydra/ and appends to the log) and
    holding only .hydra/ and the job's log."""
    from hydra.core.hydra_config import HydraConfig

    if not run_dir.is_dir():  # paths.output_dir set elsewhere: the stage makes it
        return True
    ours = {".hydra", f"{HydraConfig.get().job.name}.log"}
    return run_dir.stat().st_mtime >= since and {p.name for p in run_dir.iterdir()} <= ours


def stopped_by_signal(signum: signal.Signals, stage: str, run_dir: Path) -> NoReturn:
    """One line on how to resume, and the exit code a shell reports for the signal: 143 for
    SIGTERM, 130 for SIGINT (Ctrl-C)."""
    from hydra.core.hydra_config import HydraConfig

    folder = f"hydra.sweep.dir={HydraConfig.get().sweep.dir}" if is_multirun() else None
    again = "ckpt_path=last " if stage == "train" else ""  # learners are reused by any stage
    print(
        f"stopped by {signum.name}; resume with {again}{folder or f'hydra.run.dir={run_dir}'}",
        file=sys.stderr,
    )
    sys.exit(128 + signum)


def remove_if_only_bookkeeping(run_dir: Path) -> None:
    """A run refused for bad input leaves nothing behind: drop the folder Hydra made for it
    (made_for_this_job) when it holds only what Hydra wrote at start (.hydra/, the log)."""
    import logging
    import shutil

    from hydra.core.hydra_config import HydraConfig

    if not run_dir.is_dir():
        return
    if all(p.name in (".hydra", ".cache") or p.suffix == ".log" for p in run_dir.iterdir()):
        logging.shutdown()  # close the log file before removing it
        # the folder the run was started from: with hydra.job.chdir=True the job's working dir
        # is run_dir itself, gone after the removal
        cwd = Path(HydraConfig.get().runtime.cwd).resolve()
        shutil.rmtree(run_dir, ignore_errors=True)
        # outputs/<stage>/<date> made for this run alone go with it (below the working dir only)
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
