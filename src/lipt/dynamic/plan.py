"""Dynamic data pruning, pure: which samples of the pool an epoch trains on, and their loss
weights, from each sample's score (its loss the last time it was trained on). No Lightning, no
Hydra; `lipt.dynamic.callback` feeds the scores and hands each plan to the data module.

Two methods, each a frozen dataclass that the `budget` config group's pruning options build
(lipt.budget):

- `InfoBatch` (Qin et al., ICLR 2024, https://arxiv.org/abs/2303.04947): of the samples scored
  below the mean, drop a random share `ratio` and weight the kept ones 1 / (1 - ratio); the rest
  train with weight 1. Epochs e >= floor(delta * E) ("annealing") train on everything with
  weight 1. `ratio` applies to the below-mean samples only: 0.5 removes some 20-35% of an epoch.
  With `start="ensemble"` (budget=infobatch_soup), epoch 0 is scored by the jigsaw ensemble,
  as lipt's is, so it prunes from the first epoch.
- `LiptBudget` (lipt's): a budget b of the full-data cost. Epoch 0's scores come from the jigsaw
  ensemble (`ensemble_losses`); every pruned epoch keeps each sample with a probability
  proportional to its score (capped at 1, floored at `floor` x the epoch's kept share), weight
  1 / probability, so the expected number kept per epoch is fixed by the budget and the
  weighted loss sum is unbiased.

Both weight so that, in expectation over the draw, sum(weight x loss) over the kept samples is
the full pool's loss sum: `lipt.models.classifier.Classifier` then averages over the batch size
(`loss_norm="batch"`), as InfoBatch does, so an epoch's update matches a full epoch's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

import torch
from torch import Tensor

from lipt.core.bounds import BELOW_ONE, SHARE
from lipt.core.settings import Checked
from lipt.selection.coverage import ensemble_difficulty
from lipt.selection.types import LearnerHeads

# InfoBatch's published code starts every score at 3.0: all equal, so epoch 0 prunes nothing.
INFOBATCH_INITIAL_SCORE = 3.0
# Below this, a float product delta * E is taken as the whole number it stands for
# (0.57 * 100 = 56.99999999999999 is 57 epochs).
EPOCH_TOLERANCE = 1e-9


@dataclass(frozen=True)
class EpochPlan:
    """One epoch's training set: `rows` [K] int64, ascending positions into the scores (the
    pool's rows), and their float32 loss `weights` [K]. `annealing`: a full-data epoch."""

    rows: Tensor
    weights: Tensor
    annealing: bool = False

    def __post_init__(self) -> None:
        assert self.rows.dtype == torch.int64 and self.weights.dtype == torch.float32
        assert self.rows.shape == self.weights.shape, (self.rows.shape, self.weights.shape)

    def pruned_share(self, pool_size: int) -> float:
        return 1.0 - len(self.rows) / pool_size


def full_plan(n: int) -> EpochPlan:
    return EpochPlan(torch.arange(n), torch.ones(n), annealing=True)


def pruned_epochs(num_epochs: int, delta: float) -> int:
    """How many epochs prune: those with e < floor(delta * E), as InfoBatch's published sampler
    counts them; the rest anneal on full data whether delta * E is whole or not."""
    if num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1, got {num_epochs}")
    if not 0.0 < delta <= 1.0:
        raise ValueError(f"delta must be in (0, 1], got {delta}")
    return min(num_epochs, math.floor(delta * num_epochs + EPOCH_TOLERANCE))


def infobatch_plan(
    scores: Tensor,
    epoch: int,
    num_epochs: int,
    ratio: float,
    delta: float,
    generator: torch.Generator,
) -> EpochPlan:
    """InfoBatch's epoch: of the rows scored below the mean, floor((1 - ratio) x count) chosen
    uniformly are kept with weight 1 / (1 - ratio); rows at or above the mean are kept with
    weight 1; annealing epochs keep everything with weight 1. `scores` [N]."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"ratio must be in [0, 1), got {ratio}")
    n = scores.shape[0]
    if epoch >= pruned_epochs(num_epochs, delta):
        return full_plan(n)
    if bool(scores.max() == scores.min()):  # all equal (epoch 0): none is below the mean
        return EpochPlan(torch.arange(n), torch.ones(n))
    values = scores.double()
    below = values < values.mean()  # [N] bool
    low = torch.nonzero(below).flatten()  # [L]
    keep_share = 1.0 - ratio
    chosen = low[torch.randperm(len(low), generator=generator)[: int(keep_share * len(low))]]
    kept = ~below
    kept[chosen] = True
    weights = torch.ones(n)
    weights[chosen] = 1.0 / keep_share
    rows = torch.nonzero(kept).flatten()  # ascending
    return EpochPlan(rows, weights[rows])


def budget_schedule(num_epochs: int, budget: float, delta: float) -> tuple[int, float]:
    """(pruned epochs P, expected kept share q of each) so that P x q + (E - P) = budget x E.

    The annealing epochs (E - floor(delta x E) of them, on full data) are paid from the budget
    first. A budget too small to pay for them and still keep at least half its share in the
    pruned epochs (q >= budget / 2, i.e. annealing epochs a <= budget x E / (2 - budget)) gets
    fewer annealing epochs, none at the extreme: then every epoch keeps q = budget."""
    if not 0.0 < budget <= 1.0:
        raise ValueError(f"budget must be in (0, 1], got {budget}")
    wanted = num_epochs - pruned_epochs(num_epochs, delta)
    affordable = math.floor(budget * num_epochs / (2.0 - budget) + EPOCH_TOLERANCE)
    annealing = min(wanted, affordable)
    pruning = num_epochs - annealing
    if pruning == 0:  # budget 1, or delta x E < 1 with a budget that pays for it all
        return 0, 1.0
    share = (budget * num_epochs - annealing) / pruning
    assert budget / 2 - EPOCH_TOLERANCE <= share <= 1.0 + EPOCH_TOLERANCE, share
    return pruning, min(share, 1.0)


def keep_probabilities(scores: Tensor, expected: float, floor: float) -> Tensor:
    """Keep probabilities p [N] in [floor, 1], proportional to the score in between, summing to
    `expected` (0 < expected <= N): p = clamp(c x score, floor, 1) with c found by bisection.
    Proportional to the loss is the Horvitz-Thompson sampling that minimises the variance of
    the weighted loss sum; the floor bounds every weight by 1 / floor. A floor too high for
    `expected` gives every row expected / N."""
    n = scores.shape[0]
    if not 0.0 < expected <= n:
        raise ValueError(f"expected kept count must be in (0, {n}], got {expected}")
    if floor * n >= expected or expected == n:
        return torch.full((n,), expected / n, dtype=torch.float64)
    values = scores.double().clamp_min(1e-12)  # [N]; a zero loss still gets the floor
    low, high = 0.0, 1.0 / float(values.min())  # sum(p) at high is N >= expected
    for _ in range(200):
        c = (low + high) / 2
        if float((c * values).clamp(floor, 1.0).sum()) < expected:
            low = c
        else:
            high = c
        if high - low <= 1e-12 * high:
            break
    return (high * values).clamp(floor, 1.0)  # [N], sums to `expected` (within 1e-12)


def budget_plan(
    scores: Tensor,
    epoch: int,
    num_epochs: int,
    budget: float,
    delta: float,
    floor: float,
    generator: torch.Generator,
) -> EpochPlan:
    """lipt's epoch: each row kept independently with probability p (`keep_probabilities`,
    expected count q x N from `budget_schedule`), weight 1 / p; annealing epochs keep all."""
    if not 0.0 < floor <= 1.0:
        raise ValueError(f"floor must be in (0, 1], got {floor}")
    n = scores.shape[0]
    pruning, share = budget_schedule(num_epochs, budget, delta)
    if epoch >= pruning:
        return full_plan(n)
    if share >= 1.0:
        return EpochPlan(torch.arange(n), torch.ones(n))
    p = keep_probabilities(scores, share * n, floor * share)  # [N] float64
    kept = torch.rand(n, generator=generator, dtype=torch.float64) < p  # [N] bool
    if not bool(kept.any()):
        # An epoch without a row would end the whole fit (Lightning stops at an epoch without
        # batches), its later and annealing epochs never trained: a budget of a few rows an
        # epoch keeps one, drawn by its keep probability, weight 1 / p as any kept row's.
        kept[torch.multinomial(p, 1, generator=generator)] = True
    rows = torch.nonzero(kept).flatten()
    return EpochPlan(rows, (1.0 / p[rows]).float())


def ensemble_losses(
    logits: Tensor, embeddings: Tensor, targets: Tensor, heads: LearnerHeads | None
) -> Tensor:
    """Each row's cross-entropy under the jigsaw ensemble's mean prediction, [N]: -log of
    1 - `ensemble_difficulty` (the coverage selector's mean expected error of the soup and the
    learners' heads), so epoch 0's scores are on the scale of the training losses that replace
    them. `logits` [N, C] and `embeddings` [N, D] are the soup's on the un-augmented pool."""
    difficulty = ensemble_difficulty(logits, embeddings, targets, heads)  # [N], 1 - mean p_y
    return -torch.log((1.0 - difficulty).clamp_min(1e-6)).float()


# A draw this many standard deviations below its expected count is taken as not happening (a
# chance of about 3 in 100,000 an epoch): a Poisson-binomial count's variance is at most its mean.
DRAW_DEVIATIONS = 4.0


def infobatch_fewest_rows(n: int, ratio: float) -> int:
    """The fewest of `n` rows an InfoBatch epoch keeps, surely: every row at or above the mean
    (one at least) and (1 - ratio) of the others, at most n - 1 of which are below it."""
    return 1 + int((1.0 - ratio) * (n - 1))


def budget_fewest_rows(n: int, num_epochs: int, budget: float, delta: float) -> int:
    """The fewest of `n` rows an epoch of lipt's budget keeps, but for a draw DRAW_DEVIATIONS
    standard deviations below its expected count q x n (`budget_schedule`), one at least
    (`budget_plan`); all of them where no epoch prunes (q = 1: a budget of 1)."""
    _, share = budget_schedule(num_epochs, budget, delta)
    if share >= 1.0:  # budget_plan keeps every row, no draw
        return n
    expected = share * n
    return min(n, max(1, math.floor(expected - DRAW_DEVIATIONS * math.sqrt(expected))))


@dataclass(frozen=True)
class InfoBatch(Checked):
    """InfoBatch as published (budget=infobatch, lipt.budget.InfoBatchEpochs): its cost follows
    the losses (prune `ratio` of the below-mean rows), it has no budget to meet."""

    # The budget group's option name, by keyword only: InfoBatch(0.3) is a ratio.
    name: str = field(default="infobatch", kw_only=True)
    ratio: Annotated[float, BELOW_ONE] = 0.5
    delta: Annotated[float, SHARE] = 0.875
    # equal: every score starts at 3.0 (published), so epoch 0 keeps all; ensemble: epoch 0 is
    # scored by the jigsaw ensemble (`ensemble_losses`, budget=infobatch_soup) and prunes too
    start: Literal["equal", "ensemble"] = "equal"

    PREFIX: ClassVar[str] = "budget"

    @property
    def needs_ensemble(self) -> bool:
        return self.start == "ensemble"

    def initial_scores(self, n: int) -> Tensor:
        return torch.full((n,), INFOBATCH_INITIAL_SCORE)

    def plan(
        self, scores: Tensor, epoch: int, num_epochs: int, generator: torch.Generator
    ) -> EpochPlan:
        return infobatch_plan(scores, epoch, num_epochs, self.ratio, self.delta, generator)

    def settings(self) -> dict[str, float]:
        return {"ratio": self.ratio, "delta": self.delta}

    def fewest_rows(self, n: int, num_epochs: int) -> int:
        """The fewest of `n` rows an epoch of a `num_epochs` run keeps: all of them where no
        epoch prunes (epoch 0's equal scores keep every row, the annealing epochs too)."""
        first_pruned = 1 if self.start == "equal" else 0
        if pruned_epochs(num_epochs, self.delta) <= first_pruned:
            return n
        return infobatch_fewest_rows(n, self.ratio)


@dataclass(frozen=True)
class LiptBudget(Checked):
    """lipt's (budget=lipt, lipt.budget.LiptDynamic): a `budget` share of the full-data cost,
    epoch 0 scored by the jigsaw
    ensemble (`ensemble_losses`), keep probability proportional to the score (`budget_plan`)."""

    name: str = field(default="lipt", kw_only=True)  # by keyword only: LiptBudget(0.3) a budget
    budget: Annotated[float, SHARE] = 0.5
    delta: Annotated[float, SHARE] = 0.875
    floor: Annotated[float, SHARE] = 0.25

    PREFIX: ClassVar[str] = "budget"

    needs_ensemble = True

    def initial_scores(self, n: int) -> Tensor:
        # A stand-in until the ensemble's (or a checkpoint's) scores arrive: equal, prunes evenly.
        return torch.ones(n)

    def plan(
        self, scores: Tensor, epoch: int, num_epochs: int, generator: torch.Generator
    ) -> EpochPlan:
        return budget_plan(
            scores, epoch, num_epochs, self.budget, self.delta, self.floor, generator
        )

    def settings(self) -> dict[str, float]:
        return {"budget": self.budget, "delta": self.delta, "floor": self.floor}

    def fewest_rows(self, n: int, num_epochs: int) -> int:
        return budget_fewest_rows(n, num_epochs, self.budget, self.delta)


PruningMethod = InfoBatch | LiptBudget
