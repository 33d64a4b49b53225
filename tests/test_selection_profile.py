"""`subset_profile` at realistic shapes (128-dim ReLU embeddings, 20,000 rows, 10 classes, a
2,000-row subset): a random subset reads as random, and each failure mode it exists to show
(the hardest tail, the largest embeddings, a clump) reads as that, far from random."""

from __future__ import annotations

import pytest
import torch

from lipt.selection import PoolOutputs, subset_profile
from lipt.selection.common import within_group_percentiles

N, D, C, K = 20_000, 128, 10, 2_000


@pytest.fixture(scope="module")
def pool() -> PoolOutputs:
    g = torch.Generator().manual_seed(0)
    targets = torch.arange(N) % C
    # each class a mixture of 20 modes, as a trained network's embeddings cluster within a class
    modes = torch.randint(20, (N,), generator=g)
    centres, offsets = torch.randn(C, D, generator=g), torch.randn(C, 20, D, generator=g)
    noise = 0.3 * torch.randn(N, D, generator=g)
    h = torch.relu(centres[targets] + offsets[targets, modes] + noise)  # [N, D] ReLU
    logits = h @ torch.randn(D, C, generator=g) / D**0.5  # [N, C], a weak model's
    return PoolOutputs(logits=logits, embeddings=h, targets=targets, indices=torch.arange(N))


def per_class_top(values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The K / C rows of largest `values` in each class."""
    rows = [
        members[torch.argsort(values[members], descending=True)[: K // C]]
        for members in (torch.nonzero(targets == c).flatten() for c in range(C))
    ]
    return torch.cat(rows)


def test_a_random_subset_profiles_as_random(pool: PoolOutputs) -> None:
    rows = torch.randperm(N, generator=torch.Generator().manual_seed(1))[:K]
    profile = subset_profile(pool, rows, torch.Generator().manual_seed(2))
    assert abs(profile["difficulty_percentile"] - 0.5) < 0.03
    assert abs(profile["norm_percentile"] - 0.5) < 0.03
    assert 0.9 < profile["coverage_ratio"] < 1.1


def test_the_largest_embeddings_show_in_the_norm_percentile(pool: PoolOutputs) -> None:
    rows = per_class_top(pool.embeddings.norm(dim=1), pool.targets)
    profile = subset_profile(pool, rows, torch.Generator().manual_seed(0))
    assert profile["norm_percentile"] > 0.9


def test_the_hardest_tail_shows_in_the_difficulty_percentile(pool: PoolOutputs) -> None:
    p_y = torch.softmax(pool.logits, 1)[torch.arange(N), pool.targets]
    profile = subset_profile(pool, per_class_top(1 - p_y, pool.targets), torch.Generator())
    assert profile["difficulty_percentile"] > 0.9


def test_a_clumped_subset_covers_less_than_random(pool: PoolOutputs) -> None:
    # each class's picks are the K / C rows nearest one of its rows: a clump
    unit = torch.nn.functional.normalize(pool.embeddings, dim=1)
    rows = []
    for c in range(C):
        members = torch.nonzero(pool.targets == c).flatten()
        near = torch.argsort(unit[members] @ unit[members[0]], descending=True)[: K // C]
        rows.append(members[near])
    profile = subset_profile(pool, torch.cat(rows), torch.Generator().manual_seed(0))
    assert profile["coverage_ratio"] > 1.5
    assert profile["random_coverage_distance"] < profile["coverage_distance"]


def test_percentiles_are_within_each_class() -> None:
    values = torch.tensor([5.0, 1.0, 3.0, 100.0, 200.0, 300.0])
    targets = torch.tensor([0, 0, 0, 1, 1, 1])
    assert within_group_percentiles(values, targets).tolist() == [1.0, 0.0, 0.5, 0.0, 0.5, 1.0]


def test_bad_input_is_a_value_error(pool: PoolOutputs) -> None:
    with pytest.raises(ValueError, match="distinct"):
        subset_profile(pool, torch.tensor([1, 1]), torch.Generator())
    no_embeddings = PoolOutputs(
        logits=pool.logits, embeddings=torch.zeros(N, 0), targets=pool.targets,
        indices=pool.indices,
    )  # fmt: skip
    with pytest.raises(ValueError, match="embeddings"):
        subset_profile(no_embeddings, torch.arange(10), torch.Generator())
