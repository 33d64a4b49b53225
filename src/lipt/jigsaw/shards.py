"""Disjoint data shards for the jigsaw learners.

LiPT (Ro et al., ICML 2023, https://proceedings.mlr.press/v202/ro23a.html, section 3.2) gives
each of the n jigsaw learners its own M minibatches, drawn at random *without replacement* from
the training pool, so that no two learners see the same sample and together they read only
n*M*B samples (2-25% of the data in the paper).

One random permutation of the pool is drawn from the caller's generator and cut into n
consecutive pieces of M*B positions. Learner i's shard is therefore a function of
(pool_size, n, M, B, generator state) alone, which lets a single job of a multirun compute only
its own shard (`shard_for_learner`) and still agree with the in-process path (`make_shards`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["make_shards", "shard_for_learner"]


def _check_sizes(
    pool_size: int, num_learners: int, batches_per_learner: int, batch_size: int
) -> None:
    """Raise ValueError, saying what to change, if the shards cannot be drawn."""
    for name, value in (
        ("pool_size", pool_size),
        ("num_learners", num_learners),
        ("batches_per_learner", batches_per_learner),
        ("batch_size", batch_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, got {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    needed = num_learners * batches_per_learner * batch_size
    if needed > pool_size:
        raise ValueError(
            f"the jigsaw shards need num_learners * batches_per_learner * batch_size = "
            f"{num_learners} * {batches_per_learner} * {batch_size} = {needed} distinct samples, "
            f"but the training pool has only {pool_size}: lower pretrain.num_learners, "
            f"pretrain.batches_per_learner or the batch size"
        )


def _permutation(pool_size: int, generator: torch.Generator) -> Tensor:
    """One permutation of the pool; both public functions draw exactly this."""
    perm = torch.randperm(pool_size, generator=generator, device=generator.device)
    return perm.to(device="cpu", dtype=torch.int64)


def make_shards(
    pool_size: int,
    num_learners: int,
    batches_per_learner: int,
    batch_size: int,
    *,
    generator: torch.Generator,
) -> list[Tensor]:
    """Disjoint random shards of the positions ``0..pool_size-1``, one per learner.

    Each shard is an int64 CPU tensor of exactly ``batches_per_learner * batch_size``
    positions, in the order they were drawn: its consecutive runs of ``batch_size`` are the
    learner's M minibatches. The shards are pairwise disjoint and their union has exactly
    ``num_learners * batches_per_learner * batch_size`` positions.

    The generator is advanced by one ``torch.randperm(pool_size)``; seed it the same way to get
    the same shards (and see `shard_for_learner`).

    Raises:
        ValueError: an argument is < 1, or the shards need more samples than the pool has.
    """
    _check_sizes(pool_size, num_learners, batches_per_learner, batch_size)
    shard_size = batches_per_learner * batch_size
    perm = _permutation(pool_size, generator)
    # The tail of the permutation (pool_size - n*M*B positions) is simply never read.
    return [perm[i * shard_size : (i + 1) * shard_size].clone() for i in range(num_learners)]


def shard_for_learner(
    pool_size: int,
    num_learners: int,
    batches_per_learner: int,
    batch_size: int,
    learner: int,
    *,
    generator: torch.Generator,
) -> Tensor:
    """Learner ``learner``'s shard alone, equal to ``make_shards(...)[learner]``.

    For a job of a multirun that trains one learner: given a generator seeded as the in-process
    path seeds it, it returns the same positions (and advances the generator the same way).

    Raises:
        ValueError: as `make_shards`, or ``learner`` is not in ``0..num_learners-1``.
    """
    _check_sizes(pool_size, num_learners, batches_per_learner, batch_size)
    if isinstance(learner, bool) or not isinstance(learner, int):
        raise ValueError(f"learner must be an int, got {learner!r}")
    if not 0 <= learner < num_learners:
        raise ValueError(f"learner must be in 0..{num_learners - 1}, got {learner}")
    shard_size = batches_per_learner * batch_size
    perm = _permutation(pool_size, generator)
    return perm[learner * shard_size : (learner + 1) * shard_size].clone()
