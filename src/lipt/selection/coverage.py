"""Ensemble-difficulty, class-budgeted, embedding-coverage selection (lipt's default selector).

At small budgets, score-only selection loses to random; what beats it is coverage (Sorscher et
al., "Beyond neural scaling laws", NeurIPS 2022, https://arxiv.org/abs/2206.14486: keep easy,
prototypical examples when data is scarce; Zheng et al., "Coverage-centric Coreset Selection",
ICLR 2023, https://openreview.net/forum?id=QwKvL6wC8Yi: cut the hardest tail, then cover the
rest). This selector combines, per class:

1. a difficulty score per sample: the expected error 1 - p_y averaged over an ensemble, namely
   the model that produced `pool.logits` (the jigsaw soup) and the jigsaw learners' heads
   (`SelectionInputs.learner_heads`) applied to the same embeddings, plus `disagreement_weight`
   times the members' disagreement (1 - the share of members voting for the majority class);
2. a per-class budget proportional to the class size times its mean difficulty to the power
   `class_tilt` (0: proportional, as a random subset is on average): confusable classes get
   more of the budget, classes the ensemble already separates get less;
3. a cut of the hardest `hard_cut` share of each class (likely mislabelled or ambiguous);
4. coverage of the class's embedding space: `kmeans` clusters the class's kept, L2-normalised
   embeddings into as many clusters as the class's budget and keeps one sample per cluster
   (the one nearest the centroid with `pick="nearest"`, a uniform one with `pick="random"`,
   the one at quantile `pick_quantile` of the cluster's difficulty with `pick="quantile"`:
   0.5 = its median, a "moderate" sample as in Xia et al., ICLR 2023); `init` seeds k-means
   with uniform rows or with k-means++; with `weighting="cluster"` each pick stands for its
   cluster: its loss weight is the cluster's size, scaled so a class's weights sum to its pool
   count (as GradMatch and CRAIG weight theirs); `strata` spreads the budget evenly over
   `strata` difficulty bins (CCS, Algorithm 1); `random` samples the kept rows uniformly.

The learners were trained on disjoint shards for a few steps each, so their heads cost nothing
to get; applying them to the soup's embeddings costs one [N, D] x [D, C] product per learner,
no extra forward pass over the pool.

K-means over a class of n rows with k = fraction x n clusters costs n x k x D per Lloyd step:
quadratic in the pool. A class larger than `partition_size` rows is therefore split at random
into parts of at most `partition_size` rows, each covered with its proportional share of the
class's budget (as CRAIG partitions its facility location), so the cost grows linearly:
k x partition_size x D per step. Classes of Fashion-MNIST and CIFAR (5,000 to 6,000 rows) fit
in one part, where nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Annotated, Literal, get_args

import torch
from torch import Tensor

from lipt.core.bounds import BELOW_ONE, COUNT, NON_NEGATIVE, UNIT, Interval
from lipt.core.errors import UserError
from lipt.selection.common import (
    bin_members,
    check_budget,
    check_choice,
    finish,
    randperm,
    within_group_percentiles,
)
from lipt.selection.types import LearnerHeads, Selection, SelectionInputs

Within = Literal["kmeans", "strata", "random"]
Pick = Literal["nearest", "random", "quantile"]
Init = Literal["random", "kmeans++"]
Weighting = Literal["none", "cluster"]
Disagreement = Literal["votes", "spread"]
WITHIN, PICKS, INITS = get_args(Within), get_args(Pick), get_args(Init)
WEIGHTINGS, DISAGREEMENTS = get_args(Weighting), get_args(Disagreement)
MEMBER_ROWS = 65536  # pool rows per [chunk, C] softmax of the ensemble (a whole CIFAR pool)
ROW_CHUNK = 8192  # rows per chunk of the [chunk, k] distance matrix (8192 x 4096 fp32: 128 MiB)


def member_probs(
    logits: Tensor, embeddings: Tensor, heads: LearnerHeads | None, rows: slice
) -> Iterator[Tensor]:
    """Each member's softmax on the pool rows `rows`, [n, C] in turn: the model's logits', then
    each learner head's on the same embeddings."""
    yield torch.softmax(logits[rows].float(), dim=1)  # [n, C]
    if heads is not None:
        h = embeddings[rows].float()  # [n, D]
        for w, b in zip(heads.weight, heads.bias, strict=True):  # [C, D], [C]
            yield torch.softmax(h @ w.float().T + b.float(), dim=1)  # [n, C]


def ensemble_votes(
    logits: Tensor, embeddings: Tensor, targets: Tensor, heads: LearnerHeads | None
) -> tuple[Tensor, Tensor]:
    """Each member's probability of the given class and its predicted class, [M, N] float32
    and [M, N] int64, computed MEMBER_ROWS rows at a time: an ensemble of 11 members over
    ImageNet's 1.28M rows and 1,000 classes would hold 56 GB as [M, N, C], these 0.2 GB."""
    n = len(targets)
    p_true, votes = [], []
    for start in range(0, n, MEMBER_ROWS):
        rows = slice(start, start + MEMBER_ROWS)
        y = targets[rows, None]  # [n, 1]
        chunk = [
            (p.gather(1, y)[:, 0], p.argmax(1))
            for p in member_probs(logits, embeddings, heads, rows)
        ]
        p_true.append(torch.stack([p for p, _ in chunk]))  # [M, n]
        votes.append(torch.stack([v for _, v in chunk]))  # [M, n]
    return torch.cat(p_true, 1), torch.cat(votes, 1)


def ensemble_difficulty(
    logits: Tensor,
    embeddings: Tensor,
    targets: Tensor,
    heads: LearnerHeads | None,
    disagreement_weight: float = 0.0,
    disagreement: str = "votes",
) -> Tensor:
    """Per-row difficulty, [N], higher = harder: the members' mean expected error 1 - p_y plus
    `disagreement_weight` x the members' disagreement: `votes`, 1 - share of members voting for
    the most voted class; `spread`, the standard deviation of p_y over the members."""
    p_true, predicted = ensemble_votes(logits, embeddings, targets, heads)  # [M, N] each
    m = p_true.shape[0]
    error = 1.0 - p_true.mean(0)  # [N], in [0, 1]
    if disagreement_weight == 0.0 or m == 1:
        return error
    if disagreement == "spread":
        return error + disagreement_weight * p_true.std(0, correction=0)
    # The most voted class's votes: for each member, how many members voted as it did.
    agree = torch.stack([(predicted == vote).sum(0) for vote in predicted])  # [M, N]
    split_vote = 1.0 - agree.max(0).values.float() / m  # [N], 0 when all members agree
    return error + disagreement_weight * split_vote


def class_budgets(
    counts: list[int], difficulty: list[float], budget: int, tilt: float
) -> list[int]:
    """Split `budget` over classes in proportion to count_c * difficulty_c ** tilt, never more
    than a class's count (the overflow goes to the others), largest remainder; sums to budget."""
    if sum(counts) < budget:
        raise ValueError(f"budget {budget} exceeds the {sum(counts)} rows available")
    pairs = zip(counts, difficulty, strict=True)
    want = [n * max(d, 1e-6) ** tilt if n > 0 else 0.0 for n, d in pairs]
    shares = [0] * len(counts)
    open_ = [i for i, n in enumerate(counts) if n > 0]
    left = budget
    while left > 0:
        total = sum(want[i] for i in open_)
        exact = {i: left * want[i] / total for i in open_}
        full = [i for i in open_ if shares[i] + exact[i] >= counts[i]]
        if full:  # cap the classes that would overflow, then re-split what is left
            for i in full:
                left -= counts[i] - shares[i]
                shares[i] = counts[i]
            open_ = [i for i in open_ if i not in full]
            continue
        floors = {i: math.floor(exact[i]) for i in open_}
        order = sorted(open_, key=lambda i: (-(exact[i] - floors[i]), i))
        extra = left - sum(floors.values())
        for rank, i in enumerate(order):
            shares[i] += floors[i] + (1 if rank < extra else 0)
        left = 0
    assert sum(shares) == budget and all(s <= n for s, n in zip(shares, counts, strict=True))
    return shares


def kmeans_pick(
    points: Tensor,
    k: int,
    *,
    generator: torch.Generator,
    iters: int,
    pick: str,
    init: str = "random",
    scores: Tensor | None = None,
    quantile: float = 0.5,
) -> tuple[Tensor, Tensor]:
    """k rows of `points` [n, D], one per cluster of a k-means (Lloyd, `iters` steps, seeded
    `init`: uniform rows or k-means++), and the size of each pick's cluster. Within a cluster
    `pick` keeps the row nearest the centroid, a uniform one, or (`quantile`) the one at that
    quantile of `scores` [n]. Empty clusters are topped up with uniform unpicked rows (size 1).
    Returns positions in [0, n) [k] and cluster sizes [k] (they sum to n when none is empty)."""
    n = points.shape[0]
    assert 0 < k <= n and iters >= 0, (k, n, iters)
    if init == "kmeans++":
        centroids = kmeans_plus_plus(points, k, generator)
    else:
        centroids = points[randperm(n, generator)[:k]].clone()  # [k, D]
    assign, dist = nearest_centroid(points, centroids)
    for _ in range(iters):
        sums = torch.zeros_like(centroids).index_add_(0, assign, points)  # [k, D]
        sizes = torch.bincount(assign, minlength=k).unsqueeze(1)  # [k, 1]
        centroids = torch.where(sizes > 0, sums / sizes.clamp_min(1), centroids)
        assign, dist = nearest_centroid(points, centroids)
    sizes = torch.bincount(assign, minlength=k)  # [k]
    if pick == "quantile":
        assert scores is not None and scores.shape == (n,), "pick=quantile needs scores [n]"
        # The row whose rank within its cluster is nearest `quantile` (0 = easiest, 0.5 =
        # median, 1 = hardest) has key 0.
        key = (within_group_percentiles(scores, assign) - quantile).abs()
    elif pick == "nearest":
        key = dist
    else:
        key = torch.rand(n, generator=generator)
    # One row per non-empty cluster: the smallest key.
    by_key = torch.argsort(key, stable=True)
    grouped = by_key[torch.argsort(assign[by_key], stable=True)]  # by cluster, then key
    cluster = assign[grouped]
    starts = torch.ones(n, dtype=torch.bool)
    starts[1:] = cluster[1:] != cluster[:-1]
    chosen = grouped[starts]
    weight = sizes[assign[chosen]].float()
    if len(chosen) < k:  # empty clusters: fill with uniform rows not yet chosen
        free = torch.ones(n, dtype=torch.bool)
        free[chosen] = False
        pool = torch.nonzero(free).flatten()
        fill = pool[randperm(len(pool), generator)[: k - len(chosen)]]
        chosen = torch.cat([chosen, fill])
        weight = torch.cat([weight, torch.ones(len(fill))])
    return chosen, weight


def random_parts(
    n: int, k: int, partition_size: int, generator: torch.Generator
) -> list[tuple[Tensor, int]]:
    """Positions [0, n) as one part when n <= `partition_size`, else split at random into
    parts of at most `partition_size`, each with its share of k in proportion to its rows
    (largest remainder); parts with no share are left out. Shares sum to k."""
    if n <= partition_size:
        return [(torch.arange(n), k)]
    parts = randperm(n, generator).tensor_split(math.ceil(n / partition_size))
    shares = class_budgets([len(p) for p in parts], [1.0] * len(parts), k, tilt=0.0)
    return [(part, share) for part, share in zip(parts, shares, strict=True) if share > 0]


def kmeans_plus_plus(points: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """k initial centroids [k, D] by k-means++ seeding (Arthur and Vassilvitskii, SODA 2007,
    https://dl.acm.org/doi/10.5555/1283383.1283494): each next one drawn with probability
    proportional to the squared distance to the nearest one so far, so sparse regions get
    centroids too. k steps of O(n D)."""
    n = points.shape[0]
    first = int(torch.randint(n, (1,), generator=generator))
    index = [first]
    nearest = (points - points[first]).pow(2).sum(1)  # [n]
    for _ in range(1, k):
        total = float(nearest.sum())
        if total <= 0:  # every row sits on a centroid: take any unpicked row
            free = torch.ones(n, dtype=torch.bool)
            free[torch.tensor(index)] = False
            nxt = int(torch.nonzero(free).flatten()[0])
        else:
            nxt = int(torch.multinomial(nearest / total, 1, generator=generator))
        index.append(nxt)
        nearest = torch.minimum(nearest, (points - points[nxt]).pow(2).sum(1))
    return points[torch.tensor(index)].clone()  # [k, D]


def nearest_centroid(points: Tensor, centroids: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's nearest centroid and the distance to it, [n] int64 and [n] float32, computed
    in row chunks so the [n, k] distance matrix is never whole."""
    n = points.shape[0]
    assign = torch.empty(n, dtype=torch.int64)
    dist = torch.empty(n)
    for start in range(0, n, ROW_CHUNK):
        block = torch.cdist(points[start : start + ROW_CHUNK], centroids)  # [chunk, k]
        dist[start : start + ROW_CHUNK], assign[start : start + ROW_CHUNK] = block.min(1)
    return assign, dist


def strata_pick(scores: Tensor, k: int, *, generator: torch.Generator, strata: int) -> Tensor:
    """k positions spread evenly over `strata` equal-width bins of `scores` (CCS, Algorithm 1:
    smallest bins first, the remainder flowing to larger ones), uniform within a bin."""
    low, high = scores.min(), scores.max()
    width = (high - low) / strata
    if width > 0:
        bins = ((scores - low) / width).floor().long().clamp(0, strata - 1)
    else:
        bins = torch.zeros(len(scores), dtype=torch.int64)
    members = sorted(bin_members(bins, torch.arange(len(bins), device=bins.device)), key=len)
    chosen, remaining = [], k
    for left, rows in zip(range(len(members), 0, -1), members, strict=True):
        take = min(len(rows), remaining // left)
        chosen.append(rows[randperm(len(rows), generator)[:take]])
        remaining -= take
    assert remaining == 0, remaining
    return torch.cat(chosen)


def select_coverage(
    inputs: SelectionInputs,
    budget: int,
    *,
    generator: torch.Generator,
    class_tilt: Annotated[
        float, Interval(ge=0, le=20)
    ] = 0.5,  # an exponent: past 20, budgets underflow
    hard_cut: Annotated[float, BELOW_ONE] = 0.0,
    disagreement_weight: Annotated[float, NON_NEGATIVE] = 0.0,
    within: Within = "kmeans",
    pick: Pick = "nearest",
    kmeans_iters: Annotated[int, Interval(ge=1, le=10**4)] = 10,
    strata: Annotated[int, Interval(ge=1, le=10**6)] = 50,
    init: Init = "random",
    pick_quantile: Annotated[float, UNIT] = 0.5,
    weighting: Weighting = "none",
    disagreement: Disagreement = "votes",
    partition_size: Annotated[int, COUNT] = 8192,
) -> Selection:
    """Class budgets tilted to hard classes, the hardest tail cut, the rest covered (see the
    module docstring). Uses `inputs.pool` (logits, embeddings, targets) and, when present,
    `inputs.learner_heads`. Weights are 1 unless `weighting="cluster"`."""
    budget = check_budget(inputs, budget)
    check_choice("coverage within", within, WITHIN)
    check_choice("coverage pick", pick, PICKS)
    check_choice("coverage init", init, INITS)
    check_choice("coverage weighting", weighting, WEIGHTINGS)
    check_choice("coverage disagreement", disagreement, DISAGREEMENTS)
    if weighting == "cluster" and within != "kmeans":
        raise UserError(f"coverage weighting=cluster needs within=kmeans, got within={within}")
    if not 0.0 <= pick_quantile <= 1.0:
        raise UserError(f"coverage pick_quantile must be in [0, 1], got {pick_quantile}")
    if not 0.0 <= hard_cut < 1.0:
        raise UserError(f"coverage hard_cut must be in [0, 1), got {hard_cut}")
    if class_tilt < 0 or disagreement_weight < 0 or strata < 1 or kmeans_iters < 1:
        raise UserError(
            "coverage needs class_tilt >= 0, disagreement_weight >= 0, strata >= 1 and "
            f"kmeans_iters >= 1; got {class_tilt}, {disagreement_weight}, {strata}, {kmeans_iters}"
        )
    if partition_size < 1:
        raise UserError(
            f"coverage partition_size must be >= 1 (rows per k-means part), got {partition_size}"
        )
    pool = inputs.pool
    heads = inputs.learner_heads
    if heads is not None and heads.weight.shape[1:] != (pool.num_classes, pool.embeddings.shape[1]):
        raise ValueError(
            f"learner heads {tuple(heads.weight.shape)} do not fit the pool's "
            f"{pool.num_classes} classes x {pool.embeddings.shape[1]} features"
        )
    difficulty = ensemble_difficulty(
        pool.logits, pool.embeddings, pool.targets, heads, disagreement_weight, disagreement
    )  # [N]
    classes = torch.unique(pool.targets).tolist()
    members = [torch.nonzero(pool.targets == c).flatten() for c in classes]  # pool rows

    # Cut each class's hardest share, but keep at least what a proportional budget needs.
    kept = []
    for rows in members:
        order = rows[torch.sort(difficulty[rows], stable=True).indices]  # easiest first
        floor_keep = math.ceil(budget * len(rows) / len(pool))
        kept.append(order[: max(len(rows) - math.floor(hard_cut * len(rows)), floor_keep)])
    class_difficulty = [float(difficulty[rows].mean()) for rows in members]
    shares = class_budgets([len(k) for k in kept], class_difficulty, budget, class_tilt)

    chosen, weights = [], []
    embeddings = torch.nn.functional.normalize(pool.embeddings.float(), dim=1)  # [N, D]
    for rows, class_rows, share in zip(kept, members, shares, strict=True):
        if share == 0:
            continue
        weight = torch.ones(share)
        if within == "kmeans":
            picks, part_sizes = [], []
            for part, part_share in random_parts(len(rows), share, partition_size, generator):
                local, size = kmeans_pick(
                    embeddings[rows[part]],
                    part_share,
                    generator=generator,
                    iters=kmeans_iters,
                    pick=pick,
                    init=init,
                    scores=difficulty[rows[part]],
                    quantile=pick_quantile,
                )
                picks.append(part[local])  # positions in the class's kept rows
                part_sizes.append(size)
            local, sizes = torch.cat(picks), torch.cat(part_sizes)
            if weighting == "cluster":  # a class's weights sum to its pool count
                weight = sizes * (len(class_rows) / float(sizes.sum()))
        elif within == "strata":
            local = strata_pick(difficulty[rows], share, generator=generator, strata=strata)
        else:
            local = randperm(len(rows), generator)[:share]
        chosen.append(rows[local])
        weights.append(weight)
    return finish(torch.cat(chosen), torch.cat(weights), budget)
