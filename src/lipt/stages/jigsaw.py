"""The jigsaw pre-training's multirun halves, wired from a Run (`pretrain.py -m
pretrain=jigsaw pretrain.learners=...`): each job trains its learners (`run_learner_job`), and
`merge_learner_dir` (called by the soup callback, lipt.run.hydra_callbacks.SoupCallback, when the
sweep ends) merges their checkpoints into the soup that one in-process run makes. The method
itself, `pretrain=jigsaw`'s `_target_` and the work of both halves, is lipt.jigsaw.strategy.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lipt.core.artifacts import write_json
from lipt.core.job import run_dir
from lipt.jigsaw.learner import reused_seconds
from lipt.jigsaw.parts import JigsawSettings
from lipt.jigsaw.strategy import merge_saved, train_learner_group
from lipt.stages.build import Parts, build_parts
from lipt.stages.pretrain_outputs import write_pretrain_outputs
from lipt.stages.run import Run
from lipt.stages.summary import summary_payload


def run_learner_job(run: Run) -> dict[str, Any]:
    """`pretrain.py pretrain=jigsaw pretrain.learners=<ids>`: one job of a multirun. Trains only
    its learners, reading only their shards, and writes their checkpoints to the shared learner
    dir; the soup callback (lipt.run.hydra_callbacks) merges when the sweep ends. Writes the
    job's summary.json (its `seconds` count a reused learner's, as its `samples` do)."""
    start = time.perf_counter()
    out = run_dir(run.folder)
    parts = build_parts(run)
    settings = jigsaw_settings(parts)
    ids = settings.learner_ids()
    assert ids is not None
    dm, seed = parts.dm, run.settings.seed
    model = parts.initial_model(seed)
    learners, folder = train_learner_group(parts.context, settings, dm, model, seed, ids)
    # As pretrain.py counts them: learners an earlier attempt of the job saved count their seconds.
    stats = {
        "seconds": round(time.perf_counter() - start + reused_seconds(learners), 3),
        "samples": sum(le.samples for le in learners),
        "unique_samples": sum(len(le.shard) for le in learners),
        "learners": [le.summary() for le in learners],
        "learner_dir": str(folder),
    }
    summary = summary_payload(run, dm, None, None, {"pretrain": stats})
    write_json(out / "summary.json", summary)
    return summary


def merge_learner_dir(run: Run, folder: Path, out: Path, seconds: float = 0.0) -> dict[str, Any]:
    """Merge the learner checkpoints in `folder` (written by a multirun's jobs) into the soup
    and write pretrain.ckpt, merge_report.json and summary.json to `out`, as pretrain.py does.
    `seconds` is the wall time of the whole sweep so far (the soup callback's).

    Raises:
        UserError: a checkpoint of another recipe, or no usable learner.
    """
    start = time.perf_counter()
    parts = build_parts(run)
    ctx, dm, seed = parts.context, parts.dm, run.settings.seed
    model = parts.initial_model(seed)
    result = merge_saved(ctx, jigsaw_settings(parts), dm, model, seed, folder)
    result.seconds = seconds + time.perf_counter() - start
    return write_pretrain_outputs(run, dm, ctx, result, out)


def jigsaw_settings(parts: Parts) -> JigsawSettings:
    """pretrain=jigsaw's settings: its strategy is them (lipt.jigsaw.strategy)."""
    assert isinstance(parts.pretrain, JigsawSettings), "a learner job runs pretrain=jigsaw"
    return parts.pretrain
