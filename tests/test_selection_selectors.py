"""Selectors: the contract every selector keeps (size, uniqueness, weights, determinism, class
balance) and, per selector, a test that fails if its maths were wrong."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from lipt.core.errors import UserError
from lipt.core.seeding import torch_threads
from lipt.selection import (
    PoolOutputs,
    Selection,
    SelectionInputs,
    ccs,
    common,
    coverage,
    glister_pick_order,
    last_layer_gradients,
    mean_score,
    select_balanced,
    select_ccs,
    select_craig,
    select_el2n,
    select_glister,
    select_gradmatch,
    select_grand,
    select_random,
    select_uncertainty,
    split_budget,
)
from tests.helpers import SELECTORS


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """The selectors' greedy loops are many tiny ops; on a busy 2-core box intra-op threads
    only add synchronisation stalls, so run these tests single-threaded."""
    with torch_threads(1):
        yield


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_pool(
    targets: Tensor, weight: Tensor, b: Tensor, seed: int, scale: float = 1.0
) -> PoolOutputs:
    """Embeddings [N, D] with logits = h W^T + b (as the model protocol guarantees)."""
    W = weight
    n, d = len(targets), W.shape[1]
    h = torch.randn(n, d, generator=gen(seed)).relu() * scale
    # make the model better than chance: push embeddings along their class's weight row
    h = h + 0.5 * W[targets].clamp_min(0)
    return PoolOutputs(h @ W.T + b, h, targets, torch.arange(n))


def make_inputs(
    n: int = 120,
    c: int = 4,
    d: int = 6,
    seed: int = 0,
    n_val: int = 40,
    counts: list[int] | None = None,
) -> SelectionInputs:
    g = gen(seed)
    W = torch.randn(c, d, generator=g)
    b = 0.1 * torch.randn(c, generator=g)
    if counts is None:
        targets = torch.randint(c, (n,), generator=g)
    else:
        targets = torch.cat([torch.full((k,), i) for i, k in enumerate(counts)])
        targets = targets[torch.randperm(len(targets), generator=g)]
    val_targets = torch.randint(c, (n_val,), generator=g)
    val = make_pool(val_targets, W, b, seed + 1) if n_val else None
    return SelectionInputs(
        pool=make_pool(targets, W, b, seed + 2),
        val=val,
        extra_pools=(make_pool(targets, W * 1.3, b, seed + 3),),
        classifier_weight=W,
        classifier_bias=b,
    )


def check_selection(sel: Selection, budget: int, n: int) -> None:
    # Size, uniqueness and positive weights are finish()'s own asserts; what finish() cannot
    # know is the pool, so check the rows lie in it.
    assert sel.rows.shape == (budget,)
    assert int(sel.rows.min()) >= 0 and int(sel.rows.max()) < n


# Small partitions so GradMatch and CRAIG also run their partitioned path.
ALL = {
    **SELECTORS,
    "gradmatch_val": partial(select_gradmatch, target="val", partition_size=50),
    "gradmatch_bias": partial(select_gradmatch, bias_only=True),
    "gradmatch_batch": partial(select_gradmatch, granularity="batch", batch_size=8),
    "craig_parts": partial(select_craig, partition_size=50, greedy="stochastic"),
    "glister_naive": partial(select_glister, greedy="naive", batch=3),
    "uncertainty_margin": partial(select_uncertainty, score="margin"),
    "ccs_grand": partial(select_ccs, score="grand", strata=5),
}
WEIGHTED = (
    "gradmatch",
    "gradmatch_val",
    "gradmatch_bias",
    "gradmatch_batch",
    "craig",
    "craig_parts",
)


# ---------------------------------------------------------------- the contract, every selector


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("budget", [1, 17, 120])
def test_size_unique_positive_weights(name: str, budget: int) -> None:
    inputs = make_inputs()
    sel = ALL[name](inputs, budget, generator=gen())
    check_selection(sel, budget, 120)
    if name.startswith("craig"):  # cluster sizes: each pool row is assigned to one medoid
        torch.testing.assert_close(sel.weights.sum(), torch.tensor(120.0))
    elif name not in WEIGHTED:  # (GradMatch rescales its weights to sum to N: not a property)
        assert bool((sel.weights == 1).all())


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("budget", [0, -3, 121])
def test_bad_budget_raises(name: str, budget: int) -> None:
    with pytest.raises(ValueError, match="budget"):
        ALL[name](make_inputs(), budget, generator=gen())


@pytest.mark.parametrize("name", sorted(ALL))
def test_same_seed_same_subset(name: str) -> None:
    inputs = make_inputs()
    a = ALL[name](inputs, 20, generator=gen(5))
    b = ALL[name](inputs, 20, generator=gen(5))
    assert torch.equal(a.rows, b.rows) and torch.equal(a.weights, b.weights)


def test_random_depends_on_seed_and_is_uniform() -> None:
    inputs = make_inputs()
    a = select_random(inputs, 20, generator=gen(1)).rows
    b = select_random(inputs, 20, generator=gen(2)).rows
    assert not torch.equal(a, b)
    counts = torch.zeros(120)
    for seed in range(300):
        counts[select_random(inputs, 30, generator=gen(seed)).rows] += 1
    assert counts.min() > 40 and counts.max() < 115  # expected 75 each, binomial sd ~7.5


def test_split_budget_largest_remainder() -> None:
    assert split_budget([60, 30, 10], 20) == [12, 6, 2]
    assert split_budget([5, 3, 2], 5) == [3, 1, 1]  # remainders .5 .5 0: tie to the larger class
    assert split_budget([1, 1, 1], 2) == [1, 1, 0]
    assert split_budget([1, 99], 100) == [1, 99]
    assert split_budget([0, 7], 3) == [0, 3]
    for counts, budget in [([3, 50, 7, 1], 13), ([10, 10, 10], 29), ([2, 2], 1)]:
        shares = split_budget(counts, budget)
        assert sum(shares) == budget
        assert all(0 <= s <= c for s, c in zip(shares, counts, strict=True))
        assert all(
            abs(s - budget * c / sum(counts)) < 1 for s, c in zip(shares, counts, strict=True)
        )


@pytest.mark.parametrize("name", sorted(ALL))
def test_balanced_class_budgets(name: str) -> None:
    inputs = make_inputs(n=100, counts=[50, 30, 15, 5])
    sel = select_balanced(ALL[name], inputs, 20, generator=gen())
    check_selection(sel, 20, 100)
    per_class = torch.bincount(inputs.pool.targets[sel.rows], minlength=4).tolist()
    assert per_class == [10, 6, 3, 1]
    if name.startswith("craig"):  # each class's medoids stand for that class's rows
        for c, size in enumerate([50, 30, 15, 5]):
            in_c = inputs.pool.targets[sel.rows] == c
            torch.testing.assert_close(sel.weights[in_c].sum(), torch.tensor(float(size)))
    elif name in WEIGHTED:  # GradMatch: OMP's weights across classes, one factor to the pool
        torch.testing.assert_close(sel.weights.sum(), torch.tensor(100.0))


def test_balanced_restricts_what_the_selector_sees() -> None:
    inputs = make_inputs(n=100, counts=[50, 30, 15, 5])
    seen: list[tuple[int, set[int], set[int] | None, int]] = []

    def spy(sub: SelectionInputs, budget: int, *, generator: torch.Generator) -> Selection:
        val = None if sub.val is None else set(sub.val.targets.tolist())
        seen.append((budget, set(sub.pool.targets.tolist()), val, len(sub.extra_pools[0])))
        return select_random(sub, budget, generator=generator)

    select_balanced(spy, inputs, 20, generator=gen())
    assert [s[0] for s in seen] == [10, 6, 3, 1]
    assert [s[1] for s in seen] == [{0}, {1}, {2}, {3}]
    assert all(s[2] is None or s[2] == s[1] for s in seen)
    assert [s[3] for s in seen] == [50, 30, 15, 5]


@pytest.mark.parametrize("name", sorted(WEIGHTED))
def test_balanced_weights_leave_out_the_classes_given_no_budget(name: str) -> None:
    # 10 of 202 rows: the 2-row class's share rounds to 0, so it is skipped and its rows are
    # not stood for: the weights sum to the pool size less that class
    inputs = make_inputs(n=202, counts=[100, 100, 2])
    sel = select_balanced(ALL[name], inputs, 10, generator=gen())
    assert torch.bincount(inputs.pool.targets[sel.rows], minlength=3).tolist() == [5, 5, 0]
    torch.testing.assert_close(sel.weights.sum(), torch.tensor(200.0))


# ---------------------------------------------------------------- score-based selectors


def _hand_pool(logits: list[list[float]], targets: list[int]) -> SelectionInputs:
    z = torch.tensor(logits)
    n = len(targets)
    return SelectionInputs(
        PoolOutputs(z, torch.zeros(n, 2), torch.tensor(targets), torch.arange(n))
    )


def test_uncertainty_picks_the_expected_extremes() -> None:
    inputs = _hand_pool(
        [
            [9.0, 0.0, 0.0],  # 0: confident
            [5.0, 5.0, -20.0],  # 1: two-way tie: smallest margin, not the highest entropy
            [0.3, 0.0, 0.0],  # 2: near uniform: highest entropy, lowest max-probability
            [2.0, 1.0, 0.0],  # 3: in between
        ],
        [0, 0, 0, 0],
    )
    one = partial(select_uncertainty, inputs, 1, generator=gen())
    assert one(score="entropy").rows.tolist() == [2]
    assert one(score="least_confidence").rows.tolist() == [2]
    assert one(score="margin").rows.tolist() == [1]
    assert select_uncertainty(inputs, 3, generator=gen(), score="entropy").rows.tolist() == [
        1,
        2,
        3,
    ]
    with pytest.raises(ValueError, match="score"):
        one(score="variance")


def test_el2n_picks_the_largest_errors() -> None:
    inputs = _hand_pool(
        [[10.0, 0.0], [0.0, 0.0], [10.0, 0.0], [0.0, 3.0]],
        [1, 0, 0, 1],  # 0: confidently wrong, 1: unsure, 2: confidently right, 3: fairly right
    )
    assert select_el2n(inputs, 1, generator=gen()).rows.tolist() == [0]
    assert select_el2n(inputs, 2, generator=gen()).rows.tolist() == [0, 1]
    assert select_el2n(inputs, 3, generator=gen()).rows.tolist() == [0, 1, 3]


def _explicit_norms(pool: PoolOutputs) -> Tensor:
    return last_layer_gradients(pool.logits, pool.targets, pool.embeddings).norm(dim=1)


def test_grand_averages_the_gradient_norm_over_repeats() -> None:
    inputs = make_inputs(n=60, seed=3)
    single = SelectionInputs(inputs.pool)
    k = 15
    norms = [_explicit_norms(p) for p in (inputs.pool, *inputs.extra_pools)]
    expect_single = set(torch.topk(norms[0], k).indices.tolist())
    expect_mean = set(torch.topk((norms[0] + norms[1]) / 2, k).indices.tolist())
    assert expect_single != expect_mean  # the repeat changes the ranking here
    assert set(select_grand(single, k, generator=gen()).rows.tolist()) == expect_single
    assert set(select_grand(inputs, k, generator=gen()).rows.tolist()) == expect_mean
    bias_norms = last_layer_gradients(inputs.pool.logits, inputs.pool.targets).norm(dim=1)
    assert set(select_grand(single, k, generator=gen(), bias_only=True).rows.tolist()) == set(
        torch.topk(bias_norms, k).indices.tolist()
    )


def _uniform_el2n_pool(scores: Tensor) -> SelectionInputs:
    """Two classes, all targets 0, with EL2N = ||p - onehot(0)|| = sqrt(2) (1 - p0) = scores."""
    p0 = 1.0 - scores.double() / math.sqrt(2)
    logits = torch.stack([p0.log(), (1 - p0).log()], dim=1).float()
    n = len(scores)
    return SelectionInputs(
        PoolOutputs(logits, torch.zeros(n, 1), torch.zeros(n, dtype=torch.long), torch.arange(n))
    )


def test_ccs_drops_the_hardest_and_covers_every_stratum() -> None:
    n = 1000
    scores = torch.linspace(0.01, 1.0, n)[torch.randperm(n, generator=gen(1))]
    inputs = _uniform_el2n_pool(scores)
    torch.testing.assert_close(mean_score(inputs, "el2n"), scores, rtol=1e-4, atol=1e-5)
    sel = select_ccs(inputs, 100, generator=gen(), hard_prune=0.1, strata=10)
    check_selection(sel, 100, n)
    hardest = set(torch.topk(scores, 100).indices.tolist())
    assert not hardest & set(sel.rows.tolist())
    # 900 kept rows, equal-width strata of 90 rows each: 10 picks per stratum
    kept = scores[scores < scores.sort().values[900]]
    low, width = kept.min(), (kept.max() - kept.min()) / 10
    strata = ((scores[sel.rows] - low) / width).floor().clamp(0, 9).long()
    assert torch.bincount(strata, minlength=10).tolist() == [10] * 10
    # a score-ranked selector would have taken only the hardest kept rows
    assert set(select_el2n(inputs, 100, generator=gen()).rows.tolist()) == hardest


def test_ccs_fills_small_strata_then_spreads_the_rest_evenly() -> None:
    # stratum 0 holds 2 rows, stratum 1 holds 5, strata 2..4 hold 100 each (scores in [0, 1])
    parts = [
        torch.full((2,), 0.05),
        torch.full((5,), 0.25),
        torch.linspace(0.41, 0.59, 100),
        torch.linspace(0.61, 0.79, 100),
        torch.linspace(0.81, 1.0, 100),
        torch.tensor([0.0]),
    ]
    scores = torch.cat(parts)
    inputs = _uniform_el2n_pool(scores.clamp_min(1e-3))
    sel = select_ccs(inputs, 40, generator=gen(), hard_prune=0.0, strata=5)
    picked = scores[sel.rows]
    counts = [
        int(((picked >= lo) & (picked < hi)).sum())
        for lo, hi in [(0.04, 0.06), (0.24, 0.26), (0.4, 0.6), (0.6, 0.8), (0.8, 1.1)]
    ]
    # smallest strata first: 0 -> min(1, 40 // 5)=1 (incl. the 0.0 row), 1 -> 2 ... spread
    assert sum(counts) + int((picked < 0.01).sum()) == 40
    assert counts[1] == 5  # the 5-row stratum is taken whole
    assert max(counts[2:]) - min(counts[2:]) <= 1  # the rest spread evenly


def members_bin_by_bin(bins: Tensor, rows: Tensor) -> list[Tensor]:
    """The grouping CCS and coverage's strata did before common.bin_members: a pass over the
    rows per bin, the empty bins left out."""
    groups = (rows[bins == s] for s in range(int(bins.max()) + 1))
    return [m for m in groups if len(m) > 0]


def test_bin_members_groups_as_a_pass_per_bin_did() -> None:
    g = gen(7)
    # (2000, 10**4): most strata empty, as with CCS's million; the reference's pass per bin
    # makes 10**6 cost seconds without showing more
    for n, strata in [(1, 1), (60, 3), (500, 50), (300, 1000), (2000, 10**4)]:
        bins = torch.randint(strata, (n,), generator=g)
        rows = torch.randperm(n, generator=g) + 5  # not in bin order, not 0..n-1
        got, want = common.bin_members(bins, rows), members_bin_by_bin(bins, rows)
        assert len(got) == len(want)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("strata", [50, 7, 5000])  # 50: the default
def test_strata_picks_are_those_of_the_grouping_bin_by_bin(monkeypatch, strata: int) -> None:
    inputs = make_inputs(n=1000, seed=3)
    scores = torch.rand(1000, generator=gen(4)) ** 3  # uneven bins, some empty
    picks = [
        select_ccs(inputs, 150, generator=gen(), strata=strata).rows,
        coverage.strata_pick(scores, 150, generator=gen(), strata=strata),
    ]
    monkeypatch.setattr(ccs, "bin_members", members_bin_by_bin)
    monkeypatch.setattr(coverage, "bin_members", members_bin_by_bin)
    before = [
        select_ccs(inputs, 150, generator=gen(), strata=strata).rows,
        coverage.strata_pick(scores, 150, generator=gen(), strata=strata),
    ]
    assert all(torch.equal(a, b) for a, b in zip(picks, before, strict=True))


class OpBudget(TorchDispatchMode):
    """Fails at the first torch op past `limit`: counts work, not seconds (a timed test is as
    noisy as the machine)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.ops = limit, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        if self.ops > self.limit:
            raise AssertionError(f"over {self.limit} torch ops")
        return func(*args, **(kwargs or {}))


def test_a_million_strata_take_no_pass_per_stratum(monkeypatch) -> None:
    """2,000 rows in 10**6 strata: a few ops per occupied stratum (about 6,000 in all); a pass
    over the rows per stratum, as the grouping once was, is two ops for each of 10**6."""
    inputs = make_inputs(n=2000, seed=3)
    scores = torch.rand(2000, generator=gen(4))
    with OpBudget(30_000):
        check_selection(select_ccs(inputs, 200, generator=gen(), strata=10**6), 200, 2000)
    with OpBudget(30_000):
        assert len(coverage.strata_pick(scores, 200, generator=gen(), strata=10**6)) == 200
    monkeypatch.setattr(coverage, "bin_members", members_bin_by_bin)
    with pytest.raises(AssertionError, match="over 30000 torch ops"), OpBudget(30_000):
        coverage.strata_pick(scores, 200, generator=gen(), strata=10**6)


def test_ccs_never_prunes_below_the_budget() -> None:
    inputs = make_inputs()
    sel = select_ccs(inputs, 115, generator=gen(), hard_prune=0.5)
    check_selection(sel, 115, 120)


# ---------------------------------------------------------------- GLISTER


def _val_log_likelihood(val: PoolOutputs, weight: Tensor, b: Tensor) -> float:
    logits = val.embeddings.double() @ weight.T.double() + b.double()
    return -float(F.cross_entropy(logits, val.targets, reduction="sum"))


def _val_gradient(inputs: SelectionInputs, weight: Tensor, b: Tensor) -> Tensor:
    """G_val = d(sum_val CE)/d(W, b) at (W, b) by autograd, [C*D + C]."""
    assert inputs.val is not None
    Wp, bp = weight.clone().requires_grad_(), b.clone().requires_grad_()
    h_v = inputs.val.embeddings
    loss = F.cross_entropy(h_v @ Wp.T + bp, inputs.val.targets, reduction="sum")
    gw, gb = torch.autograd.grad(loss, [Wp, bp])
    return torch.cat([gw.flatten(), gb])


def _explicit_gains(inputs: SelectionInputs, weight: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """(gains g_i . G_val [N], per-sample gradients [N, C*D+C]), both at (W, b): autograd for
    G_val, materialised per-sample gradients."""
    h = inputs.pool.embeddings
    grads = last_layer_gradients(h @ weight.T + b, inputs.pool.targets, h)
    return grads @ _val_gradient(inputs, weight, b), grads


@pytest.mark.parametrize("step", ["mean", "sgd"])
def test_glister_naive_is_exact_greedy_at_the_virtual_model(step: str) -> None:
    """Each pick maximises g_i(theta_0) . G_val(theta), all computed explicitly here, where theta
    is theta_0 - eta * the mean of the picks' gradients at theta_0 ("mean", DeepCore's), or
    moves after every pick by one SGD step of eta along its gradient at theta_0 ("sgd")."""
    inputs = make_inputs(n=80, seed=4)
    eta = 0.5
    order = glister_pick_order(
        inputs, 25, generator=gen(), eta=eta, greedy="naive", batch=1, step=step
    )
    assert len(set(order.tolist())) == 25
    assert inputs.classifier_weight is not None and inputs.classifier_bias is not None
    assert inputs.val is not None
    W0, b0 = inputs.classifier_weight.clone(), inputs.classifier_bias.clone()
    C, D = W0.shape
    _, grads = _explicit_gains(inputs, W0, b0)  # [N, C*D+C] at theta_0
    W, b = W0, b0
    taken: list[int] = []
    for row in order.tolist():
        gains = grads @ _val_gradient(inputs, W, b)
        gains[taken] = -math.inf
        assert row == int(torch.argmax(gains)), "not the greedy choice at the virtual model"
        taken.append(row)
        if step == "sgd":
            W, b = W - eta * grads[row, : C * D].view(C, D), b - eta * grads[row, C * D :]
        else:
            mean = grads[taken].mean(0)
            W, b = W0 - eta * mean[: C * D].view(C, D), b0 - eta * mean[C * D :]
    if step == "mean":  # (25 SGD steps of 0.5 overshoot: the reason "sgd" is not the default)
        # the virtual model of the picks fits the held-out split better than theta_0
        assert _val_log_likelihood(inputs.val, W, b) > _val_log_likelihood(inputs.val, W0, b0)


def _duplicates_case() -> SelectionInputs:
    """Val: 10 rows of class 0 at a = e1 and 10 of class 1 at e2 (zero model: p = 0.5).
    Pool: 10 near-copies of (a, class 0) with gain ~5 each and 10 rows (0.9 e2, class 1) with
    gain 4.5. Once one copy moves the model, the copies' gains collapse."""
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    val_h = torch.cat([a.expand(10, 2), b.expand(10, 2)])
    val_y = torch.cat([torch.zeros(10), torch.ones(10)]).long()
    pool_h = torch.cat([a * (1 + 0.001 * torch.arange(10.0))[:, None], 0.9 * b.expand(10, 2)])
    pool_y = val_y.clone()
    W, bias = torch.zeros(2, 2), torch.zeros(2)
    return SelectionInputs(
        pool=PoolOutputs(pool_h @ W.T + bias, pool_h, pool_y, torch.arange(20)),
        val=PoolOutputs(val_h @ W.T + bias, val_h, val_y, torch.arange(20)),
        classifier_weight=W,
        classifier_bias=bias,
    )


def test_glister_taylor_update_changes_the_choice() -> None:
    inputs = _duplicates_case()
    gains, _ = _explicit_gains(inputs, torch.zeros(2, 2), torch.zeros(2))
    top5 = set(torch.topk(gains, 5).indices.tolist())
    assert top5 <= set(range(10))  # the copies lead the initial gains
    for greedy in ("naive", "stochastic"):
        fn = partial(select_glister, inputs, 5, generator=gen(), eta=1.0, greedy=greedy, batch=1)
        chosen = set(fn().rows.tolist())
        assert chosen & set(range(10, 20)), "after a copy is taken the other class must win"
        assert chosen & set(range(10))
    # with a vanishing step the Taylor update does not matter: greedy = top-k of initial gains
    tiny = select_glister(inputs, 5, generator=gen(), eta=1e-7, greedy="naive", batch=1)
    assert set(tiny.rows.tolist()) == top5


def test_glister_without_val_targets_the_pool_and_needs_the_layer() -> None:
    inputs = make_inputs(n=60)
    no_val = SelectionInputs(
        inputs.pool,
        classifier_weight=inputs.classifier_weight,
        classifier_bias=inputs.classifier_bias,
    )
    as_val = SelectionInputs(
        inputs.pool,
        val=inputs.pool,
        classifier_weight=inputs.classifier_weight,
        classifier_bias=inputs.classifier_bias,
    )
    a = select_glister(no_val, 10, generator=gen(), greedy="naive")
    b = select_glister(as_val, 10, generator=gen(), greedy="naive")
    assert torch.equal(a.rows, b.rows)
    with pytest.raises(ValueError, match="classifier_weight"):
        select_glister(SelectionInputs(inputs.pool), 10, generator=gen())


# ---------------------------------------------------------------- GradMatch


def _nnls(atoms: Tensor, t: Tensor, lam: float = 0.0, iters: int = 3000) -> Tensor:
    """min_{w >= 0} ||A^T w - t||^2 + lam ||w||^2 by projected gradient (A = atoms: [k, P])."""
    A, t = atoms.double(), t.double()
    Q = A @ A.T + lam * torch.eye(A.shape[0], dtype=torch.float64)
    c = A @ t
    step = 1.0 / float(torch.linalg.eigvalsh(Q).max())
    w = torch.zeros(A.shape[0], dtype=torch.float64)
    for _ in range(iters):
        w = (w - step * (Q @ w - c)).clamp_min(0)
    return w


def _residual(grads: Tensor, rows: Tensor, w: Tensor, target: Tensor) -> float:
    return float((grads[rows].double().T @ w.double() - target.double()).norm())


def _residual_best_scale(grads: Tensor, rows: Tensor, w: Tensor, target: Tensor) -> float:
    """Residual of the weighted sum at its best overall scale: the loss normalises weights, so
    only their relative sizes matter."""
    match = grads[rows].double().T @ w.double()
    scale = (match @ target.double()) / (match @ match)
    return _residual(grads, rows, w * scale, target)


def test_gradmatch_matches_the_target_better_than_random() -> None:
    inputs = make_inputs(n=200, c=5, d=8, seed=7)
    pool = inputs.pool
    grads = last_layer_gradients(pool.logits, pool.targets, pool.embeddings)  # [N, 45]
    target = grads.sum(0)
    k = 12
    sel = select_gradmatch(inputs, k, generator=gen(), lam=0.01)
    check_selection(sel, k, 200)
    # the returned weights (rescaled to sum N) and the best weights on the chosen rows
    ours = _residual_best_scale(grads, sel.rows, sel.weights, target)
    ours_best = _residual(grads, sel.rows, _nnls(grads[sel.rows], target), target)
    randoms = []
    for seed in range(10):
        rows = torch.randperm(200, generator=gen(100 + seed))[:k]
        randoms.append(_residual(grads, rows, _nnls(grads[rows], target), target))
    assert ours_best < 0.7 * min(randoms), (ours_best, randoms)
    assert ours < min(randoms), (ours, randoms)


def test_gradmatch_val_target_matches_the_val_gradient() -> None:
    inputs = make_inputs(n=200, c=5, d=8, seed=8, n_val=80)
    assert inputs.val is not None
    grads = last_layer_gradients(inputs.pool.logits, inputs.pool.targets, inputs.pool.embeddings)
    val_grads = last_layer_gradients(inputs.val.logits, inputs.val.targets, inputs.val.embeddings)
    target = val_grads.mean(0) * 200
    k = 12
    sel_val = select_gradmatch(inputs, k, generator=gen(), target="val", lam=0.01)
    sel_train = select_gradmatch(inputs, k, generator=gen(), target="train", lam=0.01)
    fit = [
        _residual(grads, s.rows, _nnls(grads[s.rows], target), target) for s in (sel_val, sel_train)
    ]
    assert fit[0] < fit[1]


def _three_prototypes(copies: int = 20) -> SelectionInputs:
    """60 rows: 3 distinct gradients, each repeated `copies` times (orthogonal embeddings)."""
    h = torch.eye(3).repeat_interleave(copies, dim=0)  # [60, 3]
    y = torch.tensor([0, 1, 2]).repeat_interleave(copies)
    logits = torch.zeros(3 * copies, 3)
    return SelectionInputs(PoolOutputs(logits, h, y, torch.arange(3 * copies)))


def test_gradmatch_fills_the_budget_when_omp_converges_early() -> None:
    inputs = _three_prototypes()
    sel = select_gradmatch(inputs, 10, generator=gen(), lam=1e-8, eps=1e-4)
    check_selection(sel, 10, 60)
    groups = set((sel.rows // 20).tolist())
    assert groups == {0, 1, 2}
    # three OMP atoms (weight ~20 each) and seven back-filled rows at the mean OMP weight:
    # everything on one scale, summing to the pool size
    torch.testing.assert_close(sel.weights, torch.full((10,), 6.0), rtol=1e-3, atol=1e-3)
    assert sel.diagnostics == {"backfill_rows": 7, "pool_as_target": 0}


@pytest.mark.parametrize(
    "fn", [select_glister, partial(select_gradmatch, target="val")], ids=["glister", "gradmatch"]
)
def test_classes_missing_from_val_are_counted(fn: Callable) -> None:
    inputs = make_inputs(n=200, c=4, n_val=40)
    assert inputs.val is not None
    assert set(inputs.val.targets.tolist()) == {0, 1, 2, 3}
    full = select_balanced(fn, inputs, 40, generator=gen())
    assert full.diagnostics["pool_as_target"] == 0
    keep = torch.nonzero(inputs.val.targets >= 2).flatten()  # classes 0 and 1 lose their val rows
    partial_val = SelectionInputs(
        inputs.pool,
        val=inputs.val.take(keep),
        classifier_weight=inputs.classifier_weight,
        classifier_bias=inputs.classifier_bias,
    )
    sel = select_balanced(fn, partial_val, 40, generator=gen())
    assert sel.diagnostics["pool_as_target"] == 2


def test_gradmatch_nnls_drops_atoms_without_repeating_them() -> None:
    # many correlated gradients: NNLS sets some weights to zero; no row may come back twice
    inputs = make_inputs(n=300, c=3, d=4, seed=11)
    sel = select_gradmatch(inputs, 60, generator=gen(), lam=0.0)
    check_selection(sel, 60, 300)


# ---------------------------------------------------------------- CRAIG


def _clusters(sizes: list[int], seed: int = 0) -> SelectionInputs:
    """Bias gradients in len(sizes) tight, well separated clusters (all targets 0)."""
    g = gen(seed)
    c = len(sizes)
    centers = 6.0 * torch.eye(c)
    logits = torch.cat(
        [centers[i] + 0.1 * torch.randn(s, c, generator=g) for i, s in enumerate(sizes)]
    )
    perm = torch.randperm(len(logits), generator=g)
    n = len(logits)
    return SelectionInputs(
        PoolOutputs(
            logits[perm],
            torch.randn(n, 3, generator=g),
            torch.zeros(n, dtype=torch.long),
            torch.arange(n),
        )
    ), perm  # type: ignore[return-value]


@pytest.mark.parametrize("greedy", ["lazy", "stochastic"])
def test_craig_one_medoid_per_cluster_weighted_by_size(greedy: str) -> None:
    sizes = [10, 20, 30, 40]
    inputs, perm = _clusters(sizes)  # type: ignore[misc]
    cluster_of = torch.repeat_interleave(torch.arange(4), torch.tensor(sizes))[perm]
    sel = select_craig(inputs, 4, generator=gen(), greedy=greedy)
    check_selection(sel, 4, 100)
    picked = cluster_of[sel.rows]
    assert sorted(picked.tolist()) == [0, 1, 2, 3]
    assert sel.weights[torch.argsort(picked)].tolist() == [10.0, 20.0, 30.0, 40.0]


def test_craig_lazy_equals_plain_greedy() -> None:
    inputs = make_inputs(n=80, seed=5)
    e = last_layer_gradients(inputs.pool.logits, inputs.pool.targets).double()
    d = torch.cdist(e, e)
    sim = d.max() - d
    cur = torch.zeros(80, dtype=torch.float64)
    chosen: list[int] = []
    for _ in range(8):
        gains = (sim - cur[:, None]).clamp_min(0).sum(0)
        gains[chosen] = -1
        j = int(torch.argmax(gains))
        chosen.append(j)
        cur = torch.maximum(cur, sim[:, j])
    sel = select_craig(inputs, 8, generator=gen())
    assert set(sel.rows.tolist()) == set(chosen)
    nearest = torch.tensor(chosen)[torch.argmax(sim[:, chosen], dim=1)]
    sizes = torch.bincount(nearest, minlength=80)[sel.rows].float()
    torch.testing.assert_close(sel.weights, sizes)


def test_craig_partitions_keep_weights_summing_to_the_pool() -> None:
    inputs = make_inputs(n=301, seed=6)
    for bias_only in (True, False):
        sel = select_craig(inputs, 31, generator=gen(), partition_size=64, bias_only=bias_only)
        check_selection(sel, 31, 301)
        assert float(sel.weights.sum()) == 301.0
        assert bool((sel.weights == sel.weights.round()).all())


def test_selectors_accept_hydra_style_partials() -> None:
    fn: Callable[..., Selection] = partial(select_glister, eta=0.1)
    check_selection(fn(make_inputs(), 10, generator=gen()), 10, 120)


def test_glister_rejects_a_layer_of_the_wrong_shape() -> None:
    inputs = make_inputs()
    assert inputs.classifier_weight is not None
    wrong = SelectionInputs(
        inputs.pool,
        classifier_weight=inputs.classifier_weight[:, :-1],
        classifier_bias=inputs.classifier_bias,
    )
    with pytest.raises(ValueError, match="classifier_weight"):
        select_glister(wrong, 10, generator=gen())


@pytest.mark.parametrize("eta", [0.0, -0.1])
def test_glister_rejects_a_step_size_that_is_not_positive(eta: float) -> None:
    # eta < 0 would step the virtual model uphill and pick for the opposite of the target
    with pytest.raises(UserError, match="eta must be > 0"):
        select_glister(make_inputs(), 10, generator=gen(), eta=eta)


def test_greedy_loops_restore_the_thread_count() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for fn in (select_gradmatch, select_craig, select_glister):
            fn(make_inputs(), 10, generator=gen())
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)  # the tests after this one keep the suite's count
