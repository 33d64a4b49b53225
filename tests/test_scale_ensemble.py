"""The jigsaw ensemble (the soup and its learners' heads) over a pool of many classes: difficulty
(coverage, lipt's dynamic pruning) and cleaning's probabilities are the members' [M, N, C]
formulas bit for bit, computed without ever holding [M, N, C] (56 GB for 11 members over
ImageNet's 1.28M rows and 1,000 classes)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import lipt.selection.coverage as coverage
from lipt.cleaning.issues import jigsaw_probs
from lipt.selection import LearnerHeads, PoolOutputs, SelectionInputs, select_coverage
from lipt.selection.coverage import ensemble_difficulty
from tests.helpers import LargestTensor

N, C, D, L = 3000, 100, 32, 10  # 100 classes (CIFAR-100), 10 learners: M = 11 members


def make_pool() -> tuple[PoolOutputs, LearnerHeads, Tensor]:
    g = torch.Generator().manual_seed(0)
    W = torch.randn(C, D, generator=g) / D**0.5
    y = torch.randint(C, (N,), generator=g)
    h = torch.randn(N, D, generator=g).relu() + 2 * W[y].clamp_min(0)
    heads = LearnerHeads(W + 0.3 * torch.randn(L, C, D, generator=g), torch.zeros(L, C))
    owner = torch.randint(-1, L, (N,), generator=g)
    return PoolOutputs(h @ W.T, h, y, torch.arange(N)), heads, owner


def stacked_probs(pool: PoolOutputs, heads: LearnerHeads) -> Tensor:
    """The members' softmax as one [M, N, C] tensor: the formula the ensemble is defined by."""
    probs = [torch.softmax(pool.logits, dim=1)]
    probs += [
        torch.softmax(pool.embeddings @ w.T + b, dim=1)
        for w, b in zip(heads.weight, heads.bias, strict=True)
    ]
    return torch.stack(probs)


@pytest.mark.parametrize("weight,kind", [(0.0, "votes"), (0.5, "votes"), (0.5, "spread")])
def test_difficulty_is_the_stacked_formula_bit_for_bit(weight: float, kind: str) -> None:
    pool, heads, _ = make_pool()
    probs = stacked_probs(pool, heads)  # [M, N, C]
    p_true = probs[:, torch.arange(N), pool.targets]  # [M, N]
    expected = 1.0 - p_true.mean(0)
    if kind == "spread":
        expected = expected + weight * p_true.std(0, correction=0)
    elif weight > 0:
        votes = torch.zeros(N, C).scatter_add_(1, probs.argmax(2).T, torch.ones(N, L + 1))
        expected = expected + weight * (1.0 - votes.max(1).values / (L + 1))
    got = ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, heads, weight, kind)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("members", ["ensemble", "heads"])
def test_cleaning_probs_are_the_stacked_formula_bit_for_bit(members: str) -> None:
    pool, heads, owner = make_pool()
    probs = stacked_probs(pool, heads)
    use = torch.ones(L + 1, N, dtype=torch.bool)
    use[0] = members == "ensemble"
    rows = torch.nonzero(owner >= 0).squeeze(1)
    use[owner[rows] + 1, rows] = False
    weights = use.float().unsqueeze(2)
    expected = (probs * weights).sum(0) / weights.sum(0).clamp_min(1.0)
    assert torch.equal(jigsaw_probs(pool.logits, pool.embeddings, heads, owner, members), expected)


def test_the_ensemble_never_holds_every_members_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blocks of 500 rows stand for the 65,536 of a pool of millions: nothing the size of the
    members' [M, N, C] probabilities, nor of one member's [N, C] beyond cleaning's result."""
    monkeypatch.setattr(coverage, "MEMBER_ROWS", 500)
    monkeypatch.setattr("lipt.cleaning.issues.MEMBER_ROWS", 500)
    monkeypatch.setattr("lipt.core.finite.CHUNK_ROWS", 500)  # the NaN check (rank_pool, selectors)
    pool, heads, owner = make_pool()
    with LargestTensor() as watch:
        ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, heads, 0.5, "votes")
        select_coverage(
            SelectionInputs(pool, learner_heads=heads), 300, generator=torch.Generator()
        )
    assert watch.largest < N * C // 2, watch.largest
    with LargestTensor() as watch:
        jigsaw_probs(pool.logits, pool.embeddings, heads, owner, "ensemble")
    assert watch.largest <= N * C, watch.largest
