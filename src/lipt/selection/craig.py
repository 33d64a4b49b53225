"""CRAIG (Mirzasoleiman et al., "Coresets for Data-efficient Training of Machine Learning
Models", ICML 2020, https://arxiv.org/abs/1906.01827).

Facility location on last-layer gradient distances: pick medoids S maximising

    F(S) = sum_i max_{j in S} sim(i, j),   sim(i, j) = d_max - ||g_i - g_j||

greedily, and weight each medoid by the size of its cluster (the rows whose nearest medoid it
is), so the weighted medoids stand for the pool. Distances come from inner products
(||g_i - g_j||^2 = K_ii + K_jj - 2 K_ij, see `lipt.selection.gradients`), on random partitions
of at most `partition_size` rows (budget spread proportionally) so memory stays at
partition_size^2 floats, never N x N. For a final layer without a bias
(`SelectionInputs.head_has_bias` False) the full gradient is the weight's alone.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
from torch import Tensor

from lipt.core.bounds import COUNT, OPEN_UNIT
from lipt.core.errors import UserError
from lipt.selection.common import (
    check_budget,
    check_choice,
    finish,
    random_partitions,
    serial_loop,
    split_budget,
)
from lipt.selection.gradients import errors_of, gradient_gram
from lipt.selection.types import Selection, SelectionInputs


def gradient_similarity(errors: Tensor, embeddings: Tensor | None, *, bias: bool = True) -> Tensor:
    """sim = d_max - d with d_ij = ||g_i - g_j||, [P, P], built in one buffer from inner
    products: d_ij^2 = |g_i|^2 + |g_j|^2 - 2 g_i . g_j (g_i the weight's gradient alone with
    `bias=False` and embeddings: a layer without a bias)."""
    if embeddings is None:
        sq = (errors**2).sum(1)  # [P] |e_i|^2
        d = torch.addmm(sq[None, :], errors, errors.T, alpha=-2.0)  # [P, P] |e_j|^2 - 2 e_i.e_j
    else:
        d = gradient_gram(errors, errors, embeddings, embeddings, bias=bias)  # [P, P] g_i . g_j
        sq = d.diagonal().clone()  # [P] |g_i|^2
        d.mul_(-2.0).add_(sq[None, :])
    d.add_(sq[:, None]).clamp_min_(0.0).sqrt_()  # [P, P] distances
    d.fill_diagonal_(0.0)
    return torch.sub(d.max(), d, out=d)  # sim = d_max - d >= 0, in the same buffer


def facility_location(
    sim: Tensor,
    k: int,
    *,
    greedy: str,
    generator: torch.Generator,
    epsilon: float = 0.01,
    lazy_batch: int = 16,
) -> Tensor:
    """Greedy maximiser of F(S) = sum_i max_{j in S} sim[i, j] (sim symmetric, >= 0), [k] rows.

    "lazy": exact greedy with stale upper bounds (Minoux's lazy evaluation; the `lazy_batch`
    highest bounds are refreshed at a time, doubling while the best stays stale).
    "stochastic": each step evaluates ceil(P / k * ln(1 / epsilon)) rows drawn at random (with
    replacement) among the unpicked ones (Mirzasoleiman et al., AAAI 2015).
    """
    P = sim.shape[0]
    cur = sim.new_zeros(P)  # [P] max_{j in S} sim[i, j], 0 for the empty set
    picked = torch.zeros(P, dtype=torch.bool, device=sim.device)
    chosen: list[int] = []

    def gains(cand: Tensor) -> Tensor:  # F(S + j) - F(S) for each j in cand, [len(cand)]
        return (sim[cand] - cur[None, :]).clamp_min_(0.0).sum(1)  # sim symmetric: rows = cols

    if greedy == "lazy":
        bound = sim.sum(1)  # [P] gains w.r.t. the empty set: exact upper bounds from now on
        fresh = torch.ones(P, dtype=torch.bool, device=sim.device)  # exact for the first pick
        for step in range(k):
            if step > 0:
                fresh.zero_()
            refresh = lazy_batch
            while True:
                j = int(torch.argmax(bound))
                if fresh[j]:  # an up-to-date gain beats every (upper-bounded) stale one
                    break
                stale = bound.masked_fill(fresh | picked, -math.inf)
                cand = torch.topk(stale, min(refresh, P)).indices
                cand = cand[stale[cand] > -math.inf]
                bound[cand] = gains(cand)
                fresh[cand] = True
                refresh *= 2  # many stale bounds: refresh more at once (<= 2x naive greedy)
            chosen.append(j)
            picked[j] = True
            bound[j] = -math.inf
            cur = torch.maximum(cur, sim[j])
    else:
        sample_size = min(P, math.ceil(P / k * math.log(1.0 / epsilon)))
        for _ in range(k):
            remaining = torch.nonzero(~picked).flatten()
            draw = torch.randint(len(remaining), (sample_size,), generator=generator)
            cand = remaining[draw.to(sim.device)]
            j = int(cand[torch.argmax(gains(cand))])
            chosen.append(j)
            picked[j] = True
            cur = torch.maximum(cur, sim[j])
    return torch.tensor(chosen, dtype=torch.long, device=sim.device)


def select_craig(
    inputs: SelectionInputs,
    budget: int,
    *,
    generator: torch.Generator,
    bias_only: bool = True,
    greedy: Literal["lazy", "stochastic"] = "lazy",
    epsilon: Annotated[float, OPEN_UNIT] = 0.01,
    partition_size: Annotated[int, COUNT] = 4096,
) -> Selection:
    """CRAIG medoids of last-layer gradients (bias part only by default, as CRAIG does; the
    full weight+bias gradient with `bias_only=False`, the weight's alone for a layer without a
    bias), weighted by cluster size. The weights
    are integers >= 1 and sum to the pool size N. (When the budget is smaller than the number
    of partitions, some partitions get no medoid; the cluster sizes are then scaled by
    N / rows of the partitions that got one, so the weights still sum to N.)"""
    budget = check_budget(inputs, budget)
    check_choice("craig greedy", greedy, ("lazy", "stochastic"))
    if not 0.0 < epsilon < 1.0:
        raise UserError(f"craig epsilon must be in (0, 1), got {epsilon}")
    pool = inputs.pool
    device = pool.logits.device
    E_all = errors_of(pool)  # [N, C]

    parts = random_partitions(len(pool), partition_size, generator)
    shares = split_budget([len(p) for p in parts], budget)
    rows, weights = [], []
    for part, k in zip(parts, shares, strict=True):
        if k == 0:
            continue
        part = part.to(device)
        H = None if bias_only else pool.embeddings[part]  # [P, D]
        sim = gradient_similarity(E_all[part], H, bias=inputs.head_has_bias)  # [P, P]
        with serial_loop(sim.device):
            medoids = facility_location(sim, k, greedy=greedy, generator=generator, epsilon=epsilon)

        # Cluster sizes: each row goes to its most similar medoid; a medoid to itself.
        assign = torch.argmax(sim[medoids], dim=0)  # [P] in 0..k-1 (sim symmetric)
        assign[medoids] = torch.arange(k, device=device)
        sizes = torch.bincount(assign, minlength=k).float()  # [k], >= 1, sums to P
        rows.append(part[medoids])
        weights.append(sizes)
    covered = sum(len(p) for p, k in zip(parts, shares, strict=True) if k > 0)
    scale = len(pool) / covered  # 1 unless budget < number of partitions (see docstring)
    return finish(torch.cat(rows), torch.cat(weights) * scale, budget)
