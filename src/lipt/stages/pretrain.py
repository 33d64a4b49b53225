"""Stage 1: pre-train a model whose gradients rank the data (`pretrain` config group).

Each option of the group names its strategy with `_target_`: `none` keeps the common initial
model and `full` is the classic warm-up over the whole pool, the tax lipt cuts (lipt.warmup);
`jigsaw` is the paper's method (lipt.jigsaw.strategy.JigsawPretraining). A strategy is called as
`strategy(ctx, dm, model, seed) -> Pretrained` (lipt.jigsaw.context.Strategy). `run` is
`pretrain.py`'s body.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from lipt.core.job import run_dir
from lipt.jigsaw.context import Pretrained
from lipt.stages.build import Parts, build_parts
from lipt.stages.jigsaw import run_learner_job
from lipt.stages.pretrain_outputs import write_pretrain_outputs
from lipt.stages.run import Run

log = logging.getLogger(__name__)


def pretrain_model(run: Run, parts: Parts, seed: int) -> Pretrained:
    """Run the configured strategy from the common initial model of `seed`."""
    start = time.perf_counter()
    dm = parts.dm
    log.info(describe_pretrain(run, len(dm.pool_indices)))
    result = parts.pretrain(parts.context, dm, parts.initial_model(seed), seed)
    result.seconds = time.perf_counter() - start
    if result.report:
        log.info(soup_line(result.report))
    return result


def describe_pretrain(run: Run, pool_size: int) -> str:
    """The line that opens pre-training: the strategy and its parts."""
    p, merge = run.node("pretrain"), run.node("merge").get("name")
    if p["name"] == "none":
        return "pre-training: none (selection ranks with the untrained initial model)"
    if p["name"] == "full":
        return f"pre-training: full, {p['epochs']} epochs on the whole pool of {pool_size:,}"
    if p.get("merge_from"):
        return f"pre-training: merging the jigsaw learners saved in {p['merge_from']} ({merge})"
    batches = int(p["batches_per_learner"])
    parts = [
        f"{p['num_learners']} learners x {batches} batch{'es' if batches > 1 else ''} x "
        f"{p['local_epochs']} passes"
    ]
    augment, prune = run.node("augment"), run.node("prune")
    if augment and augment["name"] != "none":
        parts.append({"randaugment": "RandAugment"}.get(augment["name"], augment["name"]))
    if prune and prune["name"] != "none":
        parts.append(f"{prune['name'].upper()} {prune['density_low']}-{prune['density_high']}")
    parts.append(f"soup {merge}")
    return "pre-training: jigsaw, " + ", ".join(parts)


def soup_line(report: Mapping[str, Any]) -> str:
    """The soup's held-out accuracy beside the best learner's, under the pre-training line."""
    kept, n = len(report.get("kept", [])), report.get("num_learners", 0)
    return (
        f"  soup: held-out {report['soup_accuracy']:.3f} (best learner "
        f"{report['best_learner_accuracy']:.3f}, kept {kept} of {n})"
    )


def pretrain_stats(results: list[Pretrained]) -> dict[str, Any] | None:
    """summary.json's stages.pretrain, summed over the models (None: nothing was trained)."""
    totals: dict[str, Any] = {"seconds": 0.0, "samples": 0, "unique_samples": 0}
    for result in results:
        for key, value in result.stats().items():
            totals[key] = totals.get(key, 0) + value
    rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in totals.items()}
    return rounded if results[0].trained else None


def run(run: Run) -> dict[str, Any]:
    """`pretrain.py`, on the run's typed settings (lipt.run.config.validate builds them):
    pretrain.ckpt, merge_report.json (jigsaw) and summary.json."""
    if run.node("pretrain").get("learners") is not None:
        # One job of a learner multirun (pretrain=jigsaw's key): no soup here (the soup
        # callback merges at the end).
        return run_learner_job(run)
    out = run_dir(run.folder)
    parts = build_parts(run)
    result = pretrain_model(run, parts, run.settings.seed)
    return write_pretrain_outputs(run, parts.dm, parts.context, result, out)
