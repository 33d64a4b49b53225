"""The coverage selector (lipt.selection.coverage): ensemble difficulty from the learners' heads,
class budgets tilted to hard classes, the hardest tail cut, k-means coverage of each class.
Realistic shapes: D=128 ReLU features, 10 classes, budgets of 1,000 or more."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from lipt.run.config import run_of
from lipt.selection import (
    LearnerHeads,
    PoolOutputs,
    SelectionInputs,
    ensemble_difficulty,
    select_coverage,
    select_random,
)
from lipt.selection.coverage import class_budgets, member_probs
from tests.test_selection_selectors import _one_thread, gen  # noqa: F401 (autouse fixture)

N, C, D, L = 20_000, 10, 128, 10


def soup_and_heads(
    seed: int = 0, hard_class: int | None = None, push: float = 3.0
) -> SelectionInputs:
    """ReLU embeddings pushed along their class's weight row (a model better than chance), a
    soup head and L learner heads near it; `hard_class`'s rows get no push (the ensemble finds
    that class hard); a larger `push` makes a more confident model."""
    g = gen(seed)
    W = torch.randn(C, D, generator=g) / D**0.5
    b = torch.zeros(C)
    y = torch.randint(C, (N,), generator=g)
    shift = push * W[y].clamp_min(0)  # [N, D]
    if hard_class is not None:
        shift[y == hard_class] = 0.0
    h = torch.randn(N, D, generator=g).relu() + shift  # [N, D]
    heads = LearnerHeads(
        weight=W + 0.3 * torch.randn(L, C, D, generator=g) / D**0.5,  # [L, C, D]
        bias=0.1 * torch.randn(L, C, generator=g),  # [L, C]
    )
    pool = PoolOutputs(h @ W.T + b, h, y, torch.arange(N))
    return SelectionInputs(pool, classifier_weight=W, classifier_bias=b, learner_heads=heads)


def test_ensemble_difficulty_is_the_members_mean_error() -> None:
    inputs = soup_and_heads()
    pool, heads = inputs.pool, inputs.learner_heads
    assert heads is not None
    # Reference: each learner head as an nn.Linear on the soup's embeddings, plus the soup.
    probs = [torch.softmax(pool.logits, 1)]
    for w, b in zip(heads.weight, heads.bias, strict=True):
        layer = nn.Linear(D, C)
        layer.weight.data, layer.bias.data = w, b
        probs.append(torch.softmax(layer(pool.embeddings).detach(), 1))
    p_true = torch.stack([p[torch.arange(N), pool.targets] for p in probs])  # [L+1, N]
    expected = 1.0 - p_true.mean(0)
    got = ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, heads)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # Without heads it is the soup's own error; the learners change it.
    alone = ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, None)
    torch.testing.assert_close(alone, 1.0 - p_true[0])
    assert not torch.allclose(alone, got)


def test_disagreement_adds_only_where_members_vote_differently() -> None:
    inputs = soup_and_heads()
    pool, heads = inputs.pool, inputs.learner_heads
    assert heads is not None
    base = ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, heads)
    extra = ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, heads, 1.0) - base
    same = LearnerHeads(inputs.classifier_weight.expand(L, C, D), torch.zeros(L, C))  # type: ignore[union-attr]
    agree = ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, same, 1.0)
    torch.testing.assert_close(
        agree, ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, same)
    )
    assert bool((extra >= -1e-6).all()) and bool((extra <= 1.0).all())
    assert float((extra > 1e-6).float().mean()) > 0.01  # the perturbed heads do disagree


def test_class_budgets_sum_cap_and_tilt() -> None:
    counts = [2000] * 9 + [300]
    difficulty = [0.1] * 8 + [0.4, 0.4]
    flat = class_budgets(counts, difficulty, 2000, 0.0)
    assert sum(flat) == 2000 and max(flat) - min(flat[:9]) <= 1  # proportional to counts
    tilted = class_budgets(counts, difficulty, 2000, 1.0)
    assert sum(tilted) == 2000
    assert tilted[8] > 3 * tilted[0]  # 4x the difficulty: ~4x the share
    # A large budget: the hard classes' shares would exceed their counts; they are capped and
    # the overflow goes to the others, evenly.
    capped = class_budgets(counts, difficulty, 8000, 1.0)
    assert capped[8:] == [2000, 300] and sum(capped) == 8000
    assert max(capped[:8]) - min(capped[:8]) <= 1
    with pytest.raises(ValueError, match="exceeds"):
        class_budgets([10, 10], [0.5, 0.5], 21, 1.0)


def test_hard_classes_get_more_of_the_budget() -> None:
    inputs = soup_and_heads(hard_class=3)
    budget = 2000
    y = inputs.pool.targets
    flat = select_coverage(inputs, budget, generator=gen(), class_tilt=0.0, within="random")
    tilted = select_coverage(inputs, budget, generator=gen(), class_tilt=1.0, within="random")
    share = (y == 3).float().mean() * budget
    assert abs(int((y[flat.rows] == 3).sum()) - share) <= 2
    # The pushed classes are not easy either (errors ~0.6 against ~0.8): a share ~1/5 larger.
    assert int((y[tilted.rows] == 3).sum()) > 1.15 * share


def mislabelled(inputs: SelectionInputs, share: float) -> tuple[SelectionInputs, Tensor]:
    """Relabel a `share` of rows to the next class: every member confidently disagrees."""
    pool = inputs.pool
    flip = torch.randperm(N, generator=gen(7))[: int(share * N)]
    targets = pool.targets.clone()
    targets[flip] = (targets[flip] + 1) % C
    noisy = PoolOutputs(pool.logits, pool.embeddings, targets, pool.indices)
    return SelectionInputs(noisy, learner_heads=inputs.learner_heads), flip


def test_the_hardest_tail_is_cut() -> None:
    inputs, flipped = mislabelled(soup_and_heads(push=10.0), 0.03)
    kept = select_coverage(inputs, 4000, generator=gen(), hard_cut=0.05, within="random")
    assert not bool(torch.isin(kept.rows, flipped).any())
    uncut = select_coverage(inputs, 4000, generator=gen(), hard_cut=0.0, within="random")
    assert int(torch.isin(uncut.rows, flipped).sum()) > 50  # ~3% of 4000 without the cut


def blobs(seed: int = 0) -> tuple[SelectionInputs, Tensor]:
    """Per class one dense blob holding 80% of its rows and 400 small blobs sharing the rest:
    a random subset spends most of its budget on the dense blob."""
    g = gen(seed)
    y = torch.arange(N) % C
    blob = torch.zeros(N, dtype=torch.int64)
    for c in range(C):
        rows = torch.nonzero(y == c).flatten()
        rest = rows[int(0.8 * len(rows)) :]
        blob[rest] = 1 + torch.randint(400, (len(rest),), generator=g)
    centres = 4.0 * torch.randn(C, 401, D, generator=g).relu()  # [C, blobs, D]
    h = (centres[y, blob] + 0.3 * torch.randn(N, D, generator=g)).relu()  # [N, D]
    W = torch.randn(C, D, generator=g) / D**0.5
    pool = PoolOutputs(h @ W.T, h, y, torch.arange(N))
    ids = y * 401 + blob  # a global blob id per row
    return SelectionInputs(pool), ids


@pytest.mark.parametrize("pick", ["nearest", "random"])
def test_kmeans_covers_more_of_the_embedding_space_than_random(pick: str) -> None:
    inputs, ids = blobs()
    budget = 2000
    cover = select_coverage(
        inputs, budget, generator=gen(), class_tilt=0.0, hard_cut=0.0, pick=pick
    )
    rand = select_random(inputs, budget, generator=gen())
    covered, random_covered = len(ids[cover.rows].unique()), len(ids[rand.rows].unique())
    # Random: ~80% of picks land in the 10 dense blobs; k-means (seeded uniform init, so its
    # centroids start mostly in the dense blob too) moves some of them out to small blobs.
    assert covered > 1.3 * random_covered, (covered, random_covered)
    dense, random_dense = (int((ids[s.rows] % 401 == 0).sum()) for s in (cover, rand))
    assert dense < random_dense - 0.04 * budget, (dense, random_dense)


def test_strata_spreads_over_difficulty() -> None:
    inputs = soup_and_heads()
    pool = inputs.pool
    diff = ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, inputs.learner_heads)
    sel = select_coverage(inputs, 2000, generator=gen(), hard_cut=0.0, within="strata")
    rand = select_random(inputs, 2000, generator=gen())
    # Even strata over difficulty over-sample the sparse ends of its range: the easiest and
    # hardest 2% hold 4% of the pool (and of a random subset) but a larger share of the strata.
    tails = (diff < diff.quantile(0.02)) | (diff > diff.quantile(0.98))
    assert float(tails[sel.rows].float().mean()) > 2 * float(tails[rand.rows].float().mean())


def test_exact_budget_seeded_and_bad_settings() -> None:
    inputs = soup_and_heads()
    a = select_coverage(inputs, 1000, generator=gen(3))
    b = select_coverage(inputs, 1000, generator=gen(3))
    assert torch.equal(a.rows, b.rows) and len(a.rows.unique()) == 1000
    assert not torch.equal(a.rows, select_coverage(inputs, 1000, generator=gen(4)).rows)
    with pytest.raises(ValueError, match="hard_cut"):
        select_coverage(inputs, 1000, generator=gen(), hard_cut=1.0)
    with pytest.raises(ValueError, match="within"):
        select_coverage(inputs, 1000, generator=gen(), within="medoids")
    narrow = LearnerHeads(torch.zeros(L, C, D // 2), torch.zeros(L, C))
    with pytest.raises(ValueError, match="do not fit"):
        select_coverage(SelectionInputs(inputs.pool, learner_heads=narrow), 1000, generator=gen())


def test_the_coverage_pipeline_selects_and_hands_the_selector_the_heads(make_cfg) -> None:
    from lipt.stages.build import build_datamodule, build_model, build_parts
    from lipt.stages.select import choose_subset
    from tests.helpers import FAST

    cfg = make_cfg([*FAST, "selector=coverage", "budget=subset", "fraction=0.3"])
    dm = build_datamodule(run_of(cfg))
    model = build_model(run_of(cfg), 0)
    indices, weights = choose_subset(run_of(cfg), build_parts(run_of(cfg), dm), [model], 0)
    assert len(indices) == round(0.3 * len(dm.pool_indices)) == len(indices.unique())
    assert bool((weights == 1).all())
    # The learner heads reach the selector: heads of the wrong width are refused there.
    width = model.classifier.in_features
    wrong = LearnerHeads(torch.zeros(3, dm.num_classes, width + 1), torch.zeros(3, dm.num_classes))
    with pytest.raises(ValueError, match="do not fit"):
        choose_subset(run_of(cfg), build_parts(run_of(cfg), dm), [model], 0, learner_heads=wrong)
    right = LearnerHeads(torch.zeros(3, dm.num_classes, width), torch.zeros(3, dm.num_classes))
    choose_subset(run_of(cfg), build_parts(run_of(cfg), dm), [model], 0, learner_heads=right)


def test_cluster_weights_stand_for_their_clusters() -> None:
    inputs, ids = blobs()
    y = inputs.pool.targets
    budget = 2000
    plain = select_coverage(inputs, budget, generator=gen(), class_tilt=0.0)
    weighted = select_coverage(inputs, budget, generator=gen(), class_tilt=0.0, weighting="cluster")
    assert torch.equal(plain.rows, weighted.rows)  # the weights change, not the picks
    assert bool((plain.weights == 1).all())
    # Each class's weights sum to its pool count, so the weighted subset has the pool's mass.
    for c in range(C):
        in_c = y[weighted.rows] == c
        torch.testing.assert_close(
            weighted.weights[in_c].sum(), (y == c).sum().float(), rtol=1e-5, atol=1e-3
        )
    # K-means spends fewer picks on each class's dense blob (80% of its rows) than its share;
    # with the clusters' sizes as weights, those picks carry the blob's real share again.
    dense = ids[weighted.rows] % 401 == 0
    picked_share = float(dense.float().mean())
    mass_share = float(weighted.weights[dense].sum() / weighted.weights.sum())
    assert picked_share < 0.77 and abs(mass_share - 0.8) < 0.02, (picked_share, mass_share)
    with pytest.raises(ValueError, match="weighting"):
        select_coverage(inputs, budget, generator=gen(), weighting="cluster", within="random")


def test_kmeans_plus_plus_covers_more_than_uniform_init() -> None:
    inputs, ids = blobs()
    budget = 2000
    cover = {
        init: select_coverage(inputs, budget, generator=gen(), class_tilt=0.0, init=init)
        for init in ("random", "kmeans++")
    }
    covered = {init: len(ids[s.rows].unique()) for init, s in cover.items()}
    # Seeding by squared distance starts centroids in the small blobs the uniform draw misses.
    assert covered["kmeans++"] > 1.1 * covered["random"], covered


def test_quantile_pick_takes_that_quantile_of_each_cluster() -> None:
    inputs = soup_and_heads()
    pool = inputs.pool
    diff = ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, inputs.learner_heads)
    mean = {}
    for q in (0.0, 0.5, 1.0):
        sel = select_coverage(inputs, 2000, generator=gen(), pick="quantile", pick_quantile=q)
        mean[q] = float(diff[sel.rows].mean())
    nearest = select_coverage(inputs, 2000, generator=gen())
    # Clusters of ~10 rows: their easiest, median and hardest member are well apart.
    assert mean[0.0] + 0.02 < mean[0.5] < mean[1.0] - 0.02, mean
    assert mean[0.0] < float(diff[nearest.rows].mean()) < mean[1.0]
    with pytest.raises(ValueError, match="pick_quantile"):
        select_coverage(inputs, 2000, generator=gen(), pick="quantile", pick_quantile=1.5)


def test_spread_disagreement_is_the_std_of_p_y() -> None:
    inputs = soup_and_heads()
    pool, heads = inputs.pool, inputs.learner_heads
    assert heads is not None
    probs = torch.stack(list(member_probs(pool.logits, pool.embeddings, heads, slice(None))))
    p_true = probs[:, torch.arange(N), pool.targets]  # [L+1, N]
    base = ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, heads)
    got = ensemble_difficulty(pool.logits, pool.embeddings, pool.targets, heads, 2.0, "spread")
    torch.testing.assert_close(got - base, 2.0 * p_true.std(0, correction=0))
    assert float((got - base).mean()) > 0.01  # the perturbed heads do spread


def test_a_class_larger_than_a_partition_is_covered_part_by_part(monkeypatch) -> None:
    """K-means costs rows x clusters per step, quadratic in a class's size; a class over
    `partition_size` rows is split at random into parts of at most that many rows, each covered
    with its proportional share, so the work per part stays bounded."""
    from lipt.selection import coverage

    inputs, ids = blobs()  # 2,000 rows a class
    y = inputs.pool.targets
    budget = 2000  # class_tilt=0: 200 picks a class
    calls: list[tuple[int, int]] = []
    real = coverage.kmeans_pick

    def watched(points: Tensor, k: int, **kwargs) -> tuple[Tensor, Tensor]:
        calls.append((points.shape[0], k))
        return real(points, k, **kwargs)

    monkeypatch.setattr(coverage, "kmeans_pick", watched)
    parted = select_coverage(
        inputs, budget, generator=gen(), class_tilt=0.0, partition_size=512, weighting="cluster"
    )
    assert calls == [(500, 50)] * (4 * C)  # 4 parts of 500 rows a class, 50 picks each
    assert len(parted.rows.unique()) == budget
    for c in range(C):  # the parts' cluster sizes still sum to the class's pool count
        in_c = y[parted.rows] == c
        torch.testing.assert_close(parted.weights[in_c].sum(), torch.tensor(2000.0))
    # Each part is covered: still far more of the small blobs than a random subset reaches.
    rand = select_random(inputs, budget, generator=gen())
    covered, random_covered = len(ids[parted.rows].unique()), len(ids[rand.rows].unique())
    assert covered > 1.3 * random_covered, (covered, random_covered)

    calls.clear()  # a class that fits in one part: one k-means over all its rows, as before
    whole = select_coverage(inputs, budget, generator=gen(), class_tilt=0.0, partition_size=2000)
    assert calls == [(2000, 200)] * C
    calls.clear()
    again = select_coverage(inputs, budget, generator=gen(), class_tilt=0.0, partition_size=10**9)
    assert torch.equal(whole.rows, again.rows)
    with pytest.raises(ValueError, match="partition_size"):
        select_coverage(inputs, budget, generator=gen(), partition_size=0)
