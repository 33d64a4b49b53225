"""Disjoint jigsaw shards (lipt.jigsaw.shards)."""

from __future__ import annotations

import pytest
import torch

from lipt.jigsaw.shards import make_shards, shard_for_learner


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    ("pool", "n", "m", "b"),
    [(1000, 10, 1, 64), (1000, 4, 5, 50), (60, 3, 4, 5), (7, 7, 1, 1), (1, 1, 1, 1)],
)
def test_shards_disjoint_exact_sizes(pool: int, n: int, m: int, b: int) -> None:
    shards = make_shards(pool, n, m, b, generator=_gen(0))
    assert len(shards) == n
    for shard in shards:
        assert shard.dtype == torch.int64
        assert shard.shape == (m * b,)
        assert int(shard.min()) >= 0 and int(shard.max()) < pool
    union = torch.cat(shards)
    # Disjoint across learners and without repeats within one: the union has no duplicates.
    assert union.unique().numel() == union.numel() == n * m * b


def test_shards_deterministic_for_a_seed_and_random_across_seeds() -> None:
    a = make_shards(5000, 5, 2, 32, generator=_gen(7))
    b = make_shards(5000, 5, 2, 32, generator=_gen(7))
    c = make_shards(5000, 5, 2, 32, generator=_gen(8))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))
    # Not simply the first positions of the pool.
    assert not torch.equal(torch.cat(a).sort().values, torch.arange(5 * 2 * 32))


def test_shard_for_learner_matches_make_shards() -> None:
    shards = make_shards(3000, 6, 3, 16, generator=_gen(123))
    for i in range(6):
        alone = shard_for_learner(3000, 6, 3, 16, i, generator=_gen(123))
        assert torch.equal(alone, shards[i])
    # Both advance the generator the same way, so later draws agree too.
    g1, g2 = _gen(5), _gen(5)
    make_shards(100, 2, 1, 10, generator=g1)
    shard_for_learner(100, 2, 1, 10, 1, generator=g2)
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))


def test_shards_cover_whole_pool_when_exact() -> None:
    shards = make_shards(120, 4, 3, 10, generator=_gen(1))
    assert torch.equal(torch.cat(shards).sort().values, torch.arange(120))


def test_too_large_request_says_what_to_change() -> None:
    with pytest.raises(ValueError, match=r"10 \* 2 \* 64 = 1280.*only 1000.*num_learners"):
        make_shards(1000, 10, 2, 64, generator=_gen(0))
    with pytest.raises(ValueError, match="only 1000"):
        shard_for_learner(1000, 10, 2, 64, 0, generator=_gen(0))
    # The boundary: exactly n*M*B samples is fine, one fewer is not.
    make_shards(120, 4, 3, 10, generator=_gen(0))
    with pytest.raises(ValueError, match="only 119"):
        make_shards(119, 4, 3, 10, generator=_gen(0))


@pytest.mark.parametrize(
    "args",
    [(0, 1, 1, 1), (10, 0, 1, 1), (10, 1, 0, 1), (10, 1, 1, 0), (10, -1, 1, 1), (10, 1.5, 1, 1)],
)
def test_bad_sizes_raise(args: tuple) -> None:
    with pytest.raises(ValueError):
        make_shards(*args, generator=_gen(0))


@pytest.mark.parametrize("learner", [-1, 3, 10])
def test_bad_learner_index_raises(learner: int) -> None:
    with pytest.raises(ValueError, match="learner"):
        shard_for_learner(100, 3, 1, 10, learner, generator=_gen(0))
