"""lipt's Hydra callbacks (configs/hydra): Hydra hands them the composed config, so they belong
to the entry layer, beside lipt.run.config.

- `SweepTable` (configs/hydra/default.yaml): at the end of a multirun, a short table of its runs
  on the terminal.
- `SoupCallback` (`hydra/callbacks=soup`) turns a multirun of jigsaw learner jobs into one soup:

      python pretrain.py -m pretrain=jigsaw 'pretrain.learners=range(10)' hydra/callbacks=soup \\
          [hydra/launcher=joblib | hydra/launcher=slurm ...]

  Each job (lipt.stages.jigsaw.run_learner_job) trains its learners on their own shards and
  writes learner_{i}.ckpt to <sweep dir>/learners (or pretrain.learner_dir). When the sweep
  ends, the callback merges them exactly as the in-process path does
  (lipt.stages.jigsaw.merge_learner_dir), leaving out missing or diverged learners with a
  warning, and writes pretrain.ckpt, merge_report.json and summary.json into the sweep dir.
  LiPT: https://proceedings.mlr.press/v202/ro23a.html, section 3.2.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict

from lipt.core import console
from lipt.core.console import shown
from lipt.core.errors import UserError, fail, one_line
from lipt.jigsaw.checkpoints import LEARNERS_DIR
from lipt.report.pictures import log_sweep_report
from lipt.report.render import MARKDOWN_COLUMNS
from lipt.report.sweep import aggregate, varying_keys
from lipt.report.sweep_runs import load_summaries
from lipt.run.cli import keep_caches_in
from lipt.run.config import run_of
from lipt.run.declared_sweep import declared_overrides
from lipt.run.slurm import is_slurm_launcher
from lipt.run.sweep_settings import LEARNERS_KEY, check_learner_sweep, other_swept_keys
from lipt.stages.jigsaw import merge_learner_dir

log = logging.getLogger(__name__)


class SweepTable(Callback):
    """At the end of a multirun: a short table of the sweep's summaries (lipt.report.sweep's
    grouping: one row per swept setting, mean over seeds) and where the sweep folder is: of
    this multirun's own runs, where its folder still holds an earlier multirun's (a resumed one,
    ckpt_path=last, keeps its finished jobs' summaries as they were, so it reads them all)."""

    def __init__(self) -> None:
        self.start: float | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.start = time.time()

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        console.jobs_ended()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if other_swept_keys(swept_overrides(config)) is not None:
            return  # jigsaw learner jobs: the soup callback, where there is one, merges them
        sweep = Path(str(config.hydra.sweep.dir))
        since = None if config.get("ckpt_path") == "last" else self.start
        runs, warnings = load_summaries(sweep, since) if sweep.is_dir() else ([], [])
        if not runs:
            return
        for warning in warnings:
            if warning.startswith("left out"):  # a failed job's line: its own log said why
                log.warning(warning)
        keys = varying_keys([run.config for run in runs])
        columns = [c for c in MARKDOWN_COLUMNS if c[0] in SWEEP_COLUMNS]
        header = [*keys, *(name for name, _ in columns)]
        rows = [
            [str(row[key]) for key in keys] + [show(row) for _, show in columns]
            for row in aggregate(runs, keys)
        ]
        widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
        lines = [f"sweep of {len(runs)} runs: {shown(sweep)}"]
        for cells in [header, *rows]:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)))
        keep_caches_in(sweep)  # the report's wandb run keeps its caches in the sweep's folder
        report = log_sweep_report(config, sweep, since)  # with logger=wandb: also there
        made = f"in {shown(report)}" if report else f"with {report_command(sweep)}"
        lines.append(f"  (tables and plots {made})")
        print("\n".join(lines), flush=True)


SWEEP_COLUMNS = ("runs", "test acc. (%)", "subset", "total (s)")


def report_command(sweep: Path) -> str:
    """The command that reports `sweep`, as it can be pasted: `make report SWEEP=...`, or
    where make would split or expand the folder's name (a space, a $, a quote), the report's
    own module with the folder quoted for the shell."""
    import shlex

    folder = shown(sweep)
    if shlex.quote(folder) == folder:
        return f"make report SWEEP={folder}"
    return f"python -m lipt.report.sweep {shlex.quote(folder)}"


# ---------------------------------------------------------------------- a learner multirun


class SoupCallback(Callback):
    """Merges the learner checkpoints of a `pretrain.learners` sweep in `on_multirun_end`."""

    def __init__(self) -> None:
        self.start: float | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.start = time.perf_counter()
        try:
            learner_sweep(config)  # refuse a sweep it cannot merge before any job runs
        except UserError as e:
            _fail(e)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            if not learner_sweep(config):
                log.info("soup callback: no %s in this multirun; nothing to merge", LEARNERS_KEY)
                return
            sweep_dir = Path(str(config.hydra.sweep.dir))
            cfg = task_config(config, sweep_dir)
            explicit = cfg.pretrain.get("learner_dir")
            folder = Path(str(explicit)).expanduser() if explicit else sweep_dir / LEARNERS_DIR
            seconds = 0.0 if self.start is None else time.perf_counter() - self.start
            launcher = config.hydra.get("launcher")
            if is_slurm_launcher(launcher):  # the sweep's host is a login node: merge in a job
                from lipt.run.slurm_launcher import run_as_job

                args = (run_of(cfg), folder, sweep_dir, seconds)
                summary = run_as_job(launcher, "lipt-soup", merge_learner_dir, *args)
            else:
                summary = merge_learner_dir(run_of(cfg), folder, sweep_dir, seconds)
        except UserError as e:
            _fail(e)
        stats = summary["stages"]["pretrain"]
        log.info("soup of %s written to %s (%s)", folder, sweep_dir / "pretrain.ckpt", stats)


def learner_sweep(config: DictConfig, merges: bool = True) -> bool:
    """True when this multirun trains jigsaw learners (lipt.run.sweep_settings.
    check_learner_sweep, on the multirun's own overrides; `merges`: the soup callback's)."""
    return check_learner_sweep(swept_overrides(config), config.pretrain, merges)


def swept_overrides(config: DictConfig) -> list[str]:
    """A multirun's overrides: the command line's, then the sweeper's declared params."""
    return [*config.hydra.overrides.task, *declared_overrides(config.hydra.sweeper)]


def task_config(config: DictConfig, sweep_dir: Path) -> DictConfig:
    """The multirun's config as a job sees it, minus `hydra`, writing into the sweep dir."""
    cfg = copy.deepcopy(config)
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.paths.output_dir = str(sweep_dir)
    return cfg


def _fail(error: UserError) -> NoReturn:
    fail(one_line(error))
