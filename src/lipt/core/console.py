"""What a user sees on the terminal: one line per stage, progress bars, the closing block.

- Stage lines are logged by each stage's module logger (`lipt.stages.*`, so the run's log file
  keeps them too), printed as plain text by `TerminalHandler`; `TerminalFilter` keeps them to
  rank 0 and third-party notices and Python warnings off the terminal (they stay in
  `<run>/<stage>.log`, see configs/hydra/default.yaml).
- `progress` draws a rich bar on a terminal and does nothing when output is piped, in CI, in a
  Hydra multirun job or in an extra DDP rank; pure code (lipt.selection, lipt.jigsaw) never sees
  rich: callers hand it a plain callback or wrap its inputs (`counted`, `counting_selector`).
- `closing_block` (a single run) and `job_line` (a multirun job) print the result; `SweepTable`
  (lipt.run.hydra_callbacks) prints a short table when a sweep ends.

Nothing here draws random numbers: the same config and seed give the same subset and model
with or without a terminal.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from lipt.core.job import is_ddp_child

log = logging.getLogger("lipt")
# Per-item details (each learner, each candidate): the log file only, never the terminal.
detail = logging.getLogger("lipt.detail")


@contextlib.contextmanager
def loggers_at(level: int, *names: str) -> Iterator[None]:
    """Raise the named loggers to `level` for a while (e.g. Lightning's device banner, which
    every Trainer built would log again), then give them back their own levels."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    try:
        yield
    finally:
        for lg, before in zip(loggers, levels, strict=True):
            lg.setLevel(before)


Step = Callable[..., None]  # step(advance=1, **fields) after each item

# Set by `setup` at the start of a run: is this process drawing bars / talking per stage?
_state = {"bars": False, "multirun_job": False, "bars_paused": False, "extra_rank": False}
# Set by `setup`: the folder the command was typed in, which the paths shown are relative to;
# None: the working directory. Under hydra.job.chdir=True the job works in its run folder.
_typed_in: dict[str, Path | None] = {"folder": None}


# --------------------------------------------------------------------------- logging


class TerminalHandler(logging.StreamHandler):
    """A StreamHandler that writes to whatever `sys.stdout` is at the time of the record, so a
    line logged while a rich bar is live is printed above the bar instead of through it."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)

    def emit(self, record: logging.LogRecord) -> None:
        self.setStream(sys.stdout)
        super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        # The reader of stdout has gone (`python train.py | head`): the run goes on, and the
        # log file keeps the line; logging's report would be a traceback for every line after.
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            return
        super().handleError(record)


# The package's own folder (src/lipt/): a checkout named lipt/ holds the venv's libraries too.
PACKAGE_DIR = str(Path(__file__).resolve().parents[1]) + os.sep


class TerminalFilter(logging.Filter):
    """Which records reach the terminal: lipt's own lines (in a multirun job, only the job's
    result line; from an extra DDP rank, only its warnings), and warnings and errors of any
    logger except Python warnings from outside lipt (deprecations, data-loader hints).
    Everything else stays in the run's log file."""

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if name == "lipt.detail" or name.startswith("lipt.detail."):
            return False
        if name == "py.warnings":  # lipt's own, by the file that warned
            return PACKAGE_DIR in str(record.msg)
        if name == "lipt" or name.startswith("lipt."):
            if _state["extra_rank"] and record.levelno < logging.WARNING:
                return False  # an extra DDP rank's stage lines repeat rank 0's
            return not _state["multirun_job"] or getattr(record, "job_line", False)
        if name.startswith("hydra"):
            return record.levelno >= logging.INFO and "\t#" not in str(record.msg)
        return record.levelno >= logging.WARNING


def setup(multirun_job: bool, typed_in: Path | None = None) -> None:
    """Call once a stage's modules are imported: Lightning's own console handler goes (its lines
    reach the root handlers once, not twice), Python warnings go to logging (the log file), and
    bars are on only for an interactive terminal outside multirun jobs and extra DDP ranks.
    `typed_in`: the folder the command was typed in (Hydra's runtime.cwd), where the paths
    shown must open from, when it is not the working directory (hydra.job.chdir=True)."""
    _typed_in["folder"] = None if typed_in is None else Path(typed_in).resolve()
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
    logging.captureWarnings(True)
    os.environ.setdefault("WANDB_SILENT", "true")  # its banner says nothing about the run
    _state["multirun_job"] = multirun_job
    extra_rank = is_ddp_child()  # srun's other tasks too: one closing block, rank 0's
    _state["extra_rank"] = extra_rank
    _state["bars"] = sys.stdout.isatty() and not multirun_job and not extra_rank


def bars_enabled() -> bool:
    return bool(_state["bars"]) and not _state["bars_paused"]


@contextlib.contextmanager
def no_bars() -> Iterator[None]:
    """No lipt bar in the block (e.g. a re-selection while Lightning's own bar is live)."""
    before = _state["bars_paused"]
    _state["bars_paused"] = True
    try:
        yield
    finally:
        _state["bars_paused"] = before


# --------------------------------------------------------------------------- progress


@contextlib.contextmanager
def progress(description: str, total: int, info: str = "") -> Iterator[Step]:
    """A bar of `total` items: `step(advance=1, info="...")` after each. No-op off a terminal."""
    if not bars_enabled() or total <= 0:
        yield lambda advance=1, **fields: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns) as bar:
        task = bar.add_task(description, total=total, info=info)
        yield lambda advance=1, **fields: bar.update(task, advance=advance, **fields)


def counted(batches: Iterable[Any], step: Step) -> Iterator[Any]:
    """`batches` unchanged, advancing `step` by each batch's size (its second entry's length)."""
    for batch in batches:
        yield batch
        step(len(batch[1]))


def counting_selector(fn: Callable[..., Any], step: Step) -> Callable[..., Any]:
    """Selector `fn` that advances `step` by the rows it picked (per class under balance)."""

    @functools.wraps(fn)  # its name, for what a wrong output is refused with
    def picked(inputs: Any, budget: int, **kwargs: Any) -> Any:
        selection = fn(inputs, budget, **kwargs)
        step(budget)
        return selection

    return picked


def _count(n: int) -> str:
    return f"{n:,}"


def share_text(share: float, decimals: int = 1) -> str:
    """`share` as a percentage with `decimals` places, more where those would round a share
    above 0 to 0% or one below 1 to 100% (0.04% of the pool, not 0.0%)."""
    text = f"{share:.{decimals}%}"
    for places in range(decimals + 1, 5):
        zero, whole = f"{0:.{places - 1}%}", f"{1:.{places - 1}%}"
        if not (0 < share < 1 and text in (zero, whole)):
            break
        text = f"{share:.{places}%}"
    return text


def total_seconds(stages: Mapping[str, Any]) -> float:
    """End-to-end seconds: every stage's (pre-training, cleaning, selection, scoring, main
    training), as the frontier counts a run's cost (lipt.report.frontier_runs.costs)."""
    return sum(float(figures.get("seconds") or 0.0) for figures in stages.values())


# --------------------------------------------------------------------------- results


ARTIFACTS = (
    "summary.json",
    "subset.npz",
    "subset.png",
    "checkpoints/last.ckpt",
    "pretrain.ckpt",
    "merge_report.json",
    "label_issues.csv",  # label cleaning's list (the `clean` group), most likely wrong first
    "label_issues.png",
)


def _seconds(stages: Mapping[str, Any]) -> str:
    """Each stage's seconds and, after more than one, the run's end to end."""
    parts = [
        f"{name} {float(figures.get('seconds') or 0.0):.1f} s" for name, figures in stages.items()
    ]
    whole = f"; {total_seconds(stages):.1f} s in all" if len(parts) > 1 else ""
    return ", ".join(parts) + whole


def closing_block(summary: Mapping[str, Any], out: Path) -> str:
    """The result of a run: test accuracy, subset, seconds per stage, where the files are."""
    lines = ["", "done."]
    if summary.get("test_accuracy") is not None:
        lines.append(f"  {'test accuracy':<17} {summary['test_accuracy']:.4f}")
    size, pool = summary.get("subset_size"), summary.get("train_size")
    if size is not None and pool and size < pool:
        share = share_text(size / pool)
        lines.append(f"  {'subset':<17} {_count(size)} of {_count(pool)} ({share})")
    trained = _trained(summary)
    if trained:
        lines.append(f"  {'trained':<17} {trained}")
    if summary.get("stages"):
        lines.append(f"  {'seconds':<17} {_seconds(summary['stages'])}")
    files = [(Path(name).name, out / name) for name in ARTIFACTS if (out / name).is_file()]
    files += [("log", path) for path in sorted(out.glob("*.log"))[:1]]
    lines += [f"  {name:<17} {shown(path)}" for name, path in files]
    return "\n".join(lines)


def _trained(summary: Mapping[str, Any]) -> str | None:
    """What main training's budget bought: the samples it trained on, against the whole pool's
    run for as many epochs (a subset's, dynamic pruning's and InfoBatch's alike)."""
    share = _trained_share(summary)
    if share is None:
        return None
    samples, full, epochs = share
    return (
        f"{_count(samples)} samples, {share_text(samples / full)} of the whole pool's "
        f"{epochs} epoch{'s' * (epochs != 1)} ({_count(full)})"
    )


def _trained_share(summary: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(samples trained, samples of the whole pool's run, its epochs), if the summary says. The
    whole pool is the pool as read: label cleaning's drops shrink the pool trained on, not the
    reference run that a budget is a share of."""
    stages = summary.get("stages") or {}
    samples = (stages.get("train") or {}).get("samples")
    pool = (stages.get("clean") or {}).get("pool") or summary.get("train_size")
    epochs = ((summary.get("config") or {}).get("trainer") or {}).get("max_epochs")
    if samples is None or not pool or not epochs:
        return None
    return int(samples), int(pool) * int(epochs), int(epochs)


def shown(path: Path) -> str:
    """`path` relative to the folder the command was typed in (`setup`'s `typed_in`, else the
    working directory) when it is below it, as a user would type it; else absolute."""
    full = path.resolve()  # a relative `path` is the working directory's
    try:
        return str(full.relative_to(_typed_in["folder"] or Path.cwd()))
    except ValueError:
        return str(path if path.is_absolute() else full)


def job_line(summary: Mapping[str, Any], out: Path, label: str) -> str:
    """One line for a job of a multirun."""
    parts = [label]
    if summary.get("test_accuracy") is not None:
        parts.append(f"test {summary['test_accuracy']:.4f}")
    size, pool = summary.get("subset_size"), summary.get("train_size")
    if size is not None and not (pool and size >= pool):
        parts.append(f"subset {_count(size)}")
    share = _trained_share(summary)
    if share is not None:
        parts.append(f"trained {share_text(share[0] / share[1])}")
    total = total_seconds(summary.get("stages") or {})
    parts += [f"{total:.0f} s", shown(out)]
    return "  ".join(parts)


def report_result(summary: Any, out: Path) -> None:
    """After a stage's run: the closing block, or in a multirun job its one line."""
    if not isinstance(summary, Mapping) or _state["extra_rank"]:
        return
    from hydra.core.hydra_config import HydraConfig

    if _state["multirun_job"] and HydraConfig.initialized():
        hydra = HydraConfig.get()
        excluded = hydra.job.config.override_dirname.exclude_keys
        shown_overrides = job_overrides(hydra.overrides.task, excluded)
        label = f"#{hydra.job.num} {shown_overrides or '(defaults)'}:"
        log.info(job_line(summary, out, label), extra={"job_line": True})
    else:
        log.info(closing_block(summary, out))


def job_overrides(overrides: Iterable[str], excluded: Iterable[str] = ()) -> str:
    """A multirun job's overrides as typed, sorted as Hydra's override_dirname sorts them and
    without its excluded keys, one space between them (a value's own commas kept: [0,1])."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    skip = set(excluded)
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return " ".join(sorted(str(o.input_line) for o in parsed if o.key_or_group not in skip))


def jobs_ended() -> None:
    """The jobs of a multirun are over: lines after them (callbacks') reach the terminal."""
    _state["multirun_job"] = False
