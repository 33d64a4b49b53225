"""At the end of a multirun, a short table of its runs on the terminal (configs/hydra/default.yaml
names this callback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from lipt.jigsaw.soup_callback import learner_sweep
from lipt.report.pictures import log_sweep_report
from lipt.report.render import MARKDOWN_COLUMNS
from lipt.report.sweep import aggregate, load_summaries, varying_keys
from lipt.run import console
from lipt.run.console import shown


class SweepTable(Callback):
    """At the end of a multirun: a short table of the sweep's summaries (lipt.report.sweep's
    grouping: one row per swept setting, mean over seeds) and where the sweep folder is."""

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        console.jobs_ended()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if learner_sweep(config):  # jigsaw learner jobs: the soup callback reports the merge
            return
        sweep = Path(str(config.hydra.sweep.dir))
        runs, _ = load_summaries(sweep) if sweep.is_dir() else ([], [])
        if not runs:
            return
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
        report = log_sweep_report(config, sweep)  # with logger=wandb: also into wandb
        made = f"in {shown(report)}" if report else f"with make report SWEEP={shown(sweep)}"
        lines.append(f"  (tables and plots {made})")
        print("\n".join(lines), flush=True)


SWEEP_COLUMNS = ("runs", "test acc. (%)", "subset", "total (s)")
