"""What a pre-training run leaves in its folder (pretrain.py, and the soup callback of a learner
multirun in the sweep folder): pretrain.ckpt, merge_report.json (jigsaw) and summary.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lipt.core.artifacts import save_checkpoint, write_json
from lipt.data import DataModule
from lipt.jigsaw.context import PretrainContext, Pretrained, pretrain_payload
from lipt.stages.run import Run
from lipt.stages.summary import summary_payload


def write_pretrain_outputs(
    run: Run, dm: DataModule, ctx: PretrainContext, result: Pretrained, out: Path
) -> dict[str, Any]:
    """Write pretrain.ckpt, merge_report.json (when the strategy reported) and summary.json to
    `out`; returns the summary."""
    save_checkpoint(
        out / "pretrain.ckpt", pretrain_payload(ctx, dm, result.model, result.learner_heads)
    )
    if result.report:
        write_json(out / "merge_report.json", result.report)
    summary = summary_payload(run, dm, None, None, {"pretrain": result.stats()})
    write_json(out / "summary.json", summary)
    return summary
