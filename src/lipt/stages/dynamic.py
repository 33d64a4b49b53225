"""Dynamic pruning in train.py: the method of the `budget` option (budget=infobatch or lipt),
epoch 0's scores (lipt's: the jigsaw ensemble on the pool, pre-trained here) and the callback
that prunes."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from lipt.core import console
from lipt.core.artifacts import write_json
from lipt.core.job import is_ddp_child
from lipt.dynamic.callback import DynamicPruning, ensemble_scores
from lipt.dynamic.plan import PruningMethod
from lipt.jigsaw.context import Pretrained
from lipt.stages.build import Parts
from lipt.stages.pretrain import Ranking, ranking_models
from lipt.stages.resume import Resume
from lipt.stages.run import Run
from lipt.stages.select import STAGES_FILE

log = logging.getLogger(__name__)


@dataclass
class DynamicSetup:
    """The callback, and what this run made before training for it: the pre-trained soup
    (init_from=pretrained may start from it), stages.pretrain and stages.score (the pool's pass
    through the soup). None where nothing was made here (infobatch, a resumed run, a DDP
    rank other than 0)."""

    callback: DynamicPruning
    pretrained: Pretrained | None = None
    pretrain_stats: dict[str, Any] | None = None
    score_stats: dict[str, Any] | None = None


def score_with_ensemble(
    run: Run, parts: Parts, made: Pretrained | None = None
) -> tuple[Tensor, Ranking, dict[str, Any]]:
    """Pre-train (the `pretrain` group, jigsaw by default) and score the pool with the soup and
    the learners' heads: each sample's ensemble cross-entropy [N] in pool order, the ranking
    (soup, heads, pre-training's cost) and stages.score (the pool's pass through the soup).
    `made`: the soup, pre-trained in this run already (by label cleaning)."""
    dm = parts.dm
    ranking = ranking_models(run, parts, made)
    scorers = (
        "the soup scores"
        if ranking.heads is None
        else f"the soup and {len(ranking.heads)} heads score"
    )
    log.info(
        f"selection: {scorers} the pool of {len(dm.pool_indices):,}; each pruned epoch "
        "keeps a sample with a probability that follows its score"
    )
    start = time.perf_counter()
    soup = ranking.models[0]
    with console.progress("dynamic: pool scored by the ensemble", len(dm.pool_indices)) as step:
        batches = console.counted(dm.pool_dataloader(), step)
        scores = ensemble_scores(soup, dm, ranking.heads, batches=batches)
    score_stats = {"seconds": round(time.perf_counter() - start, 3), "samples": len(scores)}
    return scores, ranking, score_stats


def dynamic_pruning(
    run: Run, parts: Parts, out: Path, resume: Resume, made: Pretrained | None = None
) -> DynamicSetup:
    """The budget's pruning method and its callback (where Run.prunes). lipt's scores
    epoch 0 with the ensemble, pre-trained here unless the run resumes (the checkpoint carries
    the scores) or this is an extra DDP rank (rank 0 broadcasts its scores when the fit
    starts)."""
    method: PruningMethod = run.budget.pruning(run.settings.fraction)
    audit = out if run.settings.record_seen else None
    scores, ranking, score_stats = None, Ranking([]), None
    if method.needs_ensemble and resume.checkpoint is None and not is_ddp_child():
        scores, ranking, score_stats = score_with_ensemble(run, parts, made)
        # stages.json, as a selecting run writes it: a resumed run reports these stages' costs.
        # An earlier attempt's stays: it scored before main training saved an epoch, and
        # re-merging its saved learners now is not what these stages cost.
        stages = {"score": score_stats}
        if ranking.pretrain_stats is not None:
            stages = {"pretrain": ranking.pretrain_stats, **stages}
        if resume.stages is None:
            write_json(out / STAGES_FILE, stages)
        if ranking.pretrained is not None and ranking.pretrained.report:  # a soup made here
            write_json(out / "merge_report.json", ranking.pretrained.report)
    callback = DynamicPruning(method, parts.dm, run.settings.seed, scores, audit_dir=audit)
    return DynamicSetup(callback, ranking.pretrained, ranking.pretrain_stats, score_stats)


def describe(method: PruningMethod) -> str:
    knobs = ", ".join(f"{k} {v:g}" for k, v in method.settings().items())
    return f"dynamic pruning: {method.name} ({knobs})"
