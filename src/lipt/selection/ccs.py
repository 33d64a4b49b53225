"""Coverage-centric coreset selection (Zheng et al., "Coverage-centric Coreset Selection for
High Pruning Rates", ICLR 2023, https://openreview.net/forum?id=QwKvL6wC8Yi), Algorithm 1.

Drop the hardest `hard_prune` share of the pool (highest scores: likely mislabelled or
ambiguous), split the rest into `strata` equal-width score bins, and spread the budget over the
bins as evenly as possible, smallest bins first, sampling uniformly within a bin.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch

from lipt.core.bounds import BELOW_ONE, COUNT, Interval
from lipt.core.errors import UserError
from lipt.selection.common import bin_members, check_budget, finish, randperm
from lipt.selection.gradients import DEFAULT_CHUNK
from lipt.selection.scores import Score, mean_score
from lipt.selection.types import Selection, SelectionInputs


def select_ccs(
    inputs: SelectionInputs,
    budget: int,
    *,
    generator: torch.Generator,
    score: Score = "el2n",
    hard_prune: Annotated[float, BELOW_ONE] = 0.1,
    strata: Annotated[int, Interval(ge=1, le=10**6)] = 50,
    chunk_size: Annotated[int, COUNT] = DEFAULT_CHUNK,
) -> Selection:
    """CCS over `score` (any of `lipt.selection.scores.SCORES`, averaged over the repeats).

    The hardest floor(hard_prune * N) rows are dropped, but never so many that fewer than
    `budget` rows remain. Weights are 1.
    """
    budget = check_budget(inputs, budget)
    if not 0.0 <= hard_prune < 1.0:
        raise UserError(f"ccs hard_prune must be in [0, 1), got {hard_prune}")
    if strata < 1:
        raise UserError(f"ccs strata must be >= 1, got {strata}")
    n = len(inputs.pool)
    scores = mean_score(inputs, score, chunk_size=chunk_size)  # [N], higher = harder

    # Drop the hardest share: keep the n - n_drop lowest scores (ties: lower row kept).
    n_drop = min(math.floor(hard_prune * n), n - budget)
    kept = torch.sort(scores, stable=True).indices[: n - n_drop]  # [n_kept] pool rows
    kept_scores = scores[kept]

    # Equal-width bins over the kept score range; bin ids in [0, strata).
    low, high = kept_scores.min(), kept_scores.max()
    width = (high - low) / strata
    if width > 0:
        bins = ((kept_scores - low) / width).floor().long().clamp(0, strata - 1)
    else:
        bins = torch.zeros_like(kept)
    members = sorted(bin_members(bins, kept), key=len)  # smallest bins first

    # Budget per bin: min(size, floor(remaining / bins left)); the remainder flows to the
    # larger bins, so the total is exactly `budget` (the kept rows number at least `budget`).
    chosen = []
    remaining = budget
    for left, rows in zip(range(len(members), 0, -1), members, strict=True):
        take = min(len(rows), remaining // left)
        chosen.append(rows[randperm(len(rows), generator, rows.device)[:take]])
        remaining -= take
    assert remaining == 0, remaining
    return finish(torch.cat(chosen), None, budget)
