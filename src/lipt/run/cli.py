"""Entry points: `train.py`, `pretrain.py`, `select.py` and the `lipt-*` console scripts.

Mistakes a user can fix end with one line on stderr and exit code 2, never a traceback: the
overrides are composed and checked before Hydra starts the run (lipt.run.precheck: nothing is
written), and a `UserError` raised while running is reported the same way.
"""

from __future__ import annotations

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
from lipt.run.hydra_flags import (
    check_flags,
    is_checked_first,
    refuse_rerun,
    with_config_dir,
)
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
        if not shown:  # --cfg prints the config and writes nothing
            claim_given_folder(overrides, args.multirun)

    @hydra.main(config_path=str(config_dir()), config_name=config_name, version_base="1.3")
    def main(cfg: DictConfig) -> Any:
        # First, as when the stage was imported before Hydra started: Lightning sets up its own
        # loggers on import, before console.setup routes them.
        stage: Callable[[Run], Any] = importlib.import_module(stage_module).run
        from hydra.core.hydra_config import HydraConfig
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        from lipt.core import console
        from lipt.core.lock import RunDirLockedError, released_after
        from lipt.run.config import validate

        output_dir = Path(str(cfg.paths.output_dir))
        made_now = made_for_this_job(output_dir, started)
        keep_caches_in(output_dir)
        # under hydra.job.chdir=True the paths shown open from where the command was typed
        console.setup(multirun_job=is_multirun(), typed_in=Path(HydraConfig.get().runtime.cwd))
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


def claim_given_folder(overrides: list[str], multirun: bool) -> None:
    """Hold the run folder (a multirun: the sweep folder) named on the command line before
    Hydra writes .hydra/, multirun.yaml and the log into it (lipt.core.lock.claim_run_dir): two
    runs started together on one folder both pass precheck's probe of its lock."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lipt.core.job import is_ddp_child
    from lipt.core.lock import claim_run_dir

    if is_ddp_child():  # shares its rank 0's folder, which holds it
        return
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = {
        o.key_or_group: o.value()
        for o in OverridesParser.create().parse_overrides(overrides)  # as Hydra reads them
        if o.key_or_group in (key, "hydra.sweep.subdir")
    }
    folder = given.get(key)
    if not isinstance(folder, str) or "$" in folder:  # an interpolation: Hydra resolves it later
        return
    if multirun and not Path(str(given.get("hydra.sweep.subdir", "x"))).parts:
        return  # the jobs run in the sweep folder itself (subdir=.), each holding it
    try:
        claim_run_dir(Path(folder), key)
    except UserError as e:
        fail(one_line(e))


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
