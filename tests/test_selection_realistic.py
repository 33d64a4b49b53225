"""Selectors at the shapes they meet in use (thousands of pool rows, 10-100 classes,
128-512-dim embeddings from a ReLU network, last-layer gradients of C*(D+1) numbers), checked
against independent references computed here: explicit gradient matrices, autograd, the
validation log-likelihood by hand."""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
import torch
from torch import Tensor

from lipt.core.seeding import torch_threads
from lipt.selection import (
    PoolOutputs,
    SelectionInputs,
    mean_score,
    select_balanced,
    select_craig,
    select_gradmatch,
    select_grand,
)
from lipt.selection import craig as craig_module
from lipt.selection.common import random_partitions
from lipt.selection.gradients import LastLayerGradient
from lipt.selection.gradmatch import omp_nonneg


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


def relu_inputs(
    counts: list[int], val_counts: list[int], dim: int = 128, seed: int = 0, sharp: float = 0.7
) -> SelectionInputs:
    """Pool and validation rows of a ReLU network's penultimate layer: inputs drawn around a
    mean per class, one random ReLU layer, and a head along the class means (logits = h W^T + b,
    as a model gives them), about 99% accurate on the pool."""
    g = torch.Generator().manual_seed(seed)
    classes, x_dim = len(counts), 32
    means = 1.5 * torch.randn(classes, x_dim, generator=g)
    layer = torch.randn(x_dim, dim, generator=g) / math.sqrt(x_dim)

    def rows(per_class: list[int]) -> tuple[Tensor, Tensor]:
        y = torch.cat([torch.full((k,), c) for c, k in enumerate(per_class)])
        y = y[torch.randperm(len(y), generator=g)]
        x = means[y] + torch.randn(len(y), x_dim, generator=g)
        return (x @ layer).relu(), y

    h, y = rows(counts)
    centres = torch.stack([h[y == c].mean(0) for c in range(classes)])  # [C, D]
    W = sharp * (centres - centres.mean(0)) / centres.norm(dim=1).mean()
    b = 0.1 * torch.randn(classes, generator=g)
    hv, yv = rows(val_counts)
    return SelectionInputs(
        pool=PoolOutputs(h @ W.T + b, h, y, torch.arange(len(y))),
        val=PoolOutputs(hv @ W.T + b, hv, yv, torch.arange(len(yv))),
        classifier_weight=W,
        classifier_bias=b,
    )


def explicit_gradients(pool: PoolOutputs) -> Tensor:
    """Per-row gradients of the cross-entropy w.r.t. the last layer, by autograd on its own
    logits, flattened as [dW (row-major), db], [N, C*(D+1)] float64."""
    logits = pool.logits.double().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(logits, pool.targets, reduction="sum")
    (e,) = torch.autograd.grad(loss, logits)  # [N, C]: row i is dL_i/dz_i
    h = pool.embeddings.double()
    return torch.cat([(e[:, :, None] * h[:, None, :]).flatten(1), e], dim=1)


def direction_residual(matched: Tensor, target: Tensor) -> float:
    """||s * matched - target|| / ||target|| at the best scale s: how far the subset's weighted
    gradient points from the target (a loss normalised by the weights' sum trains along it,
    whatever its length)."""
    cos = float(matched @ target) / float(matched.norm() * target.norm())
    return math.sqrt(max(0.0, 1.0 - cos * cos))


# ---------------------------------------------------------------- GradMatch per class


@pytest.mark.parametrize(
    ("variant", "margin"),
    [({}, 0.35), ({"target": "val"}, 0.35), ({"granularity": "batch", "batch_size": 10}, 0.75)],
    ids=["class", "class-val", "batch"],
)
def test_balanced_gradmatch_matches_the_pool_gradient_better_than_random(
    variant: dict, margin: float
) -> None:
    # 5,000 rows of 10 classes, 128-dim ReLU embeddings (gradients of 1,290 numbers), 10%: run
    # per class as the config's balance: true runs it. Each class's OMP matches its class's
    # gradient; joined, the subset must match the whole target far better than a random
    # subset of the same size does (scaling each class's weights to its own size instead
    # undid the match: 0.5-1.5x random's residual; joined by one factor, 0.2x; mini-batch
    # atoms, 2 to 5 per class here, match less closely)
    counts = [500] * 10
    inputs = relu_inputs(counts, [50] * 10)
    assert inputs.val is not None
    grads = explicit_gradients(inputs.pool)  # [N, 1290]
    if variant.get("target") == "val":  # each class's mean held-out gradient x its pool count
        val_grads = explicit_gradients(inputs.val)
        yv = inputs.val.targets
        target = sum(val_grads[yv == c].mean(0) * counts[c] for c in range(10))
    else:
        target = grads.sum(0)
    budget = 500
    fn = partial(select_gradmatch, **variant)
    sel = select_balanced(fn, inputs, budget, generator=torch.Generator().manual_seed(0))
    assert sel.rows.shape == (budget,) and len(sel.rows.unique()) == budget
    assert torch.bincount(inputs.pool.targets[sel.rows]).tolist() == [50] * 10
    assert bool(torch.isfinite(sel.weights).all()) and bool((sel.weights > 0).all())
    torch.testing.assert_close(sel.weights.double().sum(), torch.tensor(5000.0).double())
    ours = direction_residual(sel.weights.double() @ grads[sel.rows], target)
    randoms = []
    for seed in range(5):
        rows = torch.randperm(5000, generator=torch.Generator().manual_seed(100 + seed))[:budget]
        randoms.append(direction_residual(grads[rows].sum(0), target))
    assert ours < margin * min(randoms), (ours, randoms)


def test_balanced_gradmatch_keeps_each_class_relative_weights_as_omp_set_them() -> None:
    # within a class the weights are OMP's up to one factor; across classes too: the weights of
    # the balanced run are those of each class run alone, each divided by its own weight_scale,
    # times one common factor
    inputs = relu_inputs([300, 200, 100], [30, 20, 10], dim=64, seed=3)
    sel = select_balanced(select_gradmatch, inputs, 60, generator=torch.Generator().manual_seed(0))
    y = inputs.pool.targets
    g = torch.Generator().manual_seed(0)
    own = []
    for c, share in zip(range(3), [30, 20, 10], strict=True):
        pos = torch.nonzero(y == c).flatten()
        val = inputs.val
        assert val is not None
        alone = select_gradmatch(
            SelectionInputs(
                inputs.pool.take(pos),
                val.take(torch.nonzero(val.targets == c).flatten()),
                classifier_weight=inputs.classifier_weight,
                classifier_bias=inputs.classifier_bias,
            ),
            share,
            generator=g,
        )
        assert torch.equal(pos[alone.rows], sel.rows[y[sel.rows] == c])
        own.append(alone.weights.double() / alone.weight_scale)
    own_all = torch.cat(own)
    ours = torch.cat([sel.weights[y[sel.rows] == c].double() for c in range(3)])
    torch.testing.assert_close(ours / ours.sum(), own_all / own_all.sum(), rtol=1e-5, atol=0)
    assert sel.weight_scale == pytest.approx(float(ours.sum() / own_all.sum()), rel=1e-5)


# ---------------------------------------------------------------- GraNd and EL2N by autograd


def autograd_norms(h: Tensor, y: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Per-sample ||d CE / d (W, b)|| of the layer itself by torch.func, [N] float64."""
    params = {"weight": weight.double()} | ({} if bias is None else {"bias": bias.double()})

    def loss(p: dict[str, Tensor], x: Tensor, t: Tensor) -> Tensor:
        z = torch.nn.functional.linear(x[None], p["weight"], p.get("bias"))
        return torch.nn.functional.cross_entropy(z, t[None])

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    norms = []
    for s in range(0, len(y), 250):
        grads = per_sample(params, h[s : s + 250].double(), y[s : s + 250])
        norms.append(sum((g.flatten(1) ** 2).sum(1) for g in grads.values()).sqrt())
    return torch.cat(norms)


@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(("classes", "dim", "per_class"), [(10, 128, 500), (100, 512, 20)])
def test_grand_and_el2n_are_the_per_sample_gradient_norms(
    has_bias: bool, classes: int, dim: int, per_class: int
) -> None:
    # GraNd: the norm of each row's gradient w.r.t. the final layer's parameters, the bias
    # included only where the layer has one (a head without a bias scored as if it had one was
    # up to 7% off, most for rows with small embeddings); EL2N: w.r.t. the logits
    inputs = relu_inputs([per_class] * classes, [1] * classes, dim=dim, seed=4, sharp=2.0)
    pool, W = inputs.pool, inputs.classifier_weight
    assert W is not None
    b = inputs.classifier_bias if has_bias else None
    logits = pool.embeddings @ W.T + (0.0 if b is None else b)
    pool = PoolOutputs(logits, pool.embeddings, pool.targets, pool.indices)
    inputs = SelectionInputs(pool, classifier_weight=W, classifier_bias=b)
    reference = autograd_norms(pool.embeddings, pool.targets, W, b)
    scores = mean_score(inputs, "grand").double()
    # float32 resolves p_y - 1 to ~1e-7, which the embedding's norm multiplies: the tolerance
    # (the bias's share of the norm, left in, is 1/(2 ||h||^2) ~ 1e-3 of it here)
    scale = (pool.embeddings.double().norm(dim=1) ** 2 + 1.0).sqrt()
    torch.testing.assert_close(scores / scale, reference / scale, rtol=1e-4, atol=3e-7)
    # EL2N is the same norm w.r.t. the logits (the bias gradient, whether the layer has one)
    z = logits.double().requires_grad_(True)
    (dz,) = torch.autograd.grad(
        torch.nn.functional.cross_entropy(z, pool.targets, reduction="sum"), z
    )
    el2n = dz.norm(dim=1)  # [N]: row i of d(sum CE)/dz is dL_i/dz_i
    torch.testing.assert_close(mean_score(inputs, "el2n").double(), el2n, rtol=1e-4, atol=3e-7)
    # and the selector keeps the rows of the highest such norms
    budget = len(pool) // 10
    sel = select_grand(inputs, budget, generator=torch.Generator().manual_seed(0))
    kth = torch.sort(reference, descending=True).values[budget - 1]
    assert float(reference[sel.rows].min()) >= float(kth) * (1 - 1e-4)


def test_gradmatch_per_batch_covers_the_budget_with_whole_batches_it_picked() -> None:
    # 10,000 rows cut into 157 batches of 63 or 64 (batch_size 64): 3,000 rows need 48 of
    # them when OMP picks 63-row ones, not ceil(3000 / 64) = 47 (those left 3 to 21 rows to
    # random back-fill, reported as OMP stopping early)
    counts = [1000] * 10
    inputs = relu_inputs(counts, [10] * 10, seed=1)
    budget, batch_size = 3000, 64
    sel = select_gradmatch(
        inputs,
        budget,
        generator=torch.Generator().manual_seed(0),
        granularity="batch",
        batch_size=batch_size,
    )
    assert sel.diagnostics["backfill_rows"] == 0
    assert len(sel.rows.unique()) == budget
    # the batches select_gradmatch cut (its generator's first draw): every one it drew from is
    # taken whole, all at one weight, but the last (cut to the budget)
    batches = random_partitions(10_000, batch_size, torch.Generator().manual_seed(0))
    assert {len(b) for b in batches} == {63, 64}
    chosen = set(sel.rows.tolist())
    weight = dict(zip(sel.rows.tolist(), sel.weights.tolist(), strict=True))
    partial_batches = 0
    for rows in batches:
        taken = [r for r in rows.tolist() if r in chosen]
        if taken:
            assert len({weight[r] for r in taken}) == 1
            partial_batches += len(taken) < len(rows)
    assert partial_batches <= 1


# ---------------------------------------------------------------- a head without a bias


def bias_free_inputs(seed: int) -> SelectionInputs:
    """3,000 pool and 300 held-out rows of 10 classes, 128-dim ReLU embeddings, and a final
    layer without a bias: logits h W^T, `classifier_bias` None."""
    inputs = relu_inputs([300] * 10, [30] * 10, seed=seed)
    W, val = inputs.classifier_weight, inputs.val
    assert W is not None and val is not None

    def logits_of(p: PoolOutputs) -> PoolOutputs:
        z = (p.embeddings.double() @ W.double().T).float()  # [N, C]
        return PoolOutputs(z, p.embeddings, p.targets, p.indices)

    return SelectionInputs(logits_of(inputs.pool), logits_of(val), classifier_weight=W)


def bias_free_gradients(pool: PoolOutputs, weight: Tensor) -> Tensor:
    """Per-sample gradients of the cross-entropy w.r.t. the parameters of a bias-free
    nn.Linear head by torch.func, [N, C*D] float64 (its weight, row-major: all it has)."""
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False).double()
    params = {"weight": weight.double()}
    assert set(dict(head.named_parameters())) == set(params)

    def loss(p: dict[str, Tensor], x: Tensor, t: Tensor) -> Tensor:
        z = torch.func.functional_call(head, p, (x[None],))
        return torch.nn.functional.cross_entropy(z, t[None])

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    grads = per_sample(params, pool.embeddings.double(), pool.targets)
    return grads["weight"].flatten(1)  # [N, C*D]


@pytest.mark.parametrize(
    "variant",
    [{}, {"target": "val"}, {"granularity": "batch", "batch_size": 30}],
    ids=["class", "class-val", "batch"],
)
def test_gradmatch_matches_the_gradients_of_a_head_without_a_bias(variant: dict) -> None:
    # GradMatch's atoms and target are the per-sample gradients of the model's last layer: for
    # a head without a bias, the weight's alone. Its selection (3,000 rows, 10%) is that of
    # OMP run on those gradients made explicitly by torch.func (with a bias part the head does
    # not have, rows differ, or the same batches' weights are 0.2% off)
    inputs = bias_free_inputs(seed=6)
    assert (
        not inputs.head_has_bias and inputs.val is not None and inputs.classifier_weight is not None
    )
    grads = bias_free_gradients(inputs.pool, inputs.classifier_weight)  # [3000, 1280]
    budget = 300
    sel = select_gradmatch(inputs, budget, generator=torch.Generator().manual_seed(0), **variant)
    assert sel.diagnostics == {"backfill_rows": 0, "pool_as_target": 0}
    # the partitions select_gradmatch cuts (its generator's first draw): one of all 3,000 rows,
    # or 100 batches of 30 whose mean gradients are the atoms
    groups = random_partitions(
        3000, variant.get("batch_size", 4096), torch.Generator().manual_seed(0)
    )
    atoms = torch.stack([grads[g].mean(0) for g in groups]) if "batch_size" in variant else grads
    if variant.get("target") == "val":  # the mean held-out gradient x the partition's size
        goal = bias_free_gradients(inputs.val, inputs.classifier_weight).mean(0) * len(atoms)
    else:
        goal = atoms.sum(0)
    k = budget // len(groups[0]) if "batch_size" in variant else budget
    # explicit vectors as "bias-only" gradients: OMP on plain inner products
    chosen, w = omp_nonneg(atoms, None, LastLayerGradient(None, goal), k, lam=0.5, eps=1e-4)
    assert len(chosen) == k
    if "batch_size" in variant:  # every row of a picked batch at its batch's weight
        sizes = torch.tensor([len(groups[int(a)]) for a in chosen])
        chosen = torch.cat([groups[int(a)] for a in chosen])
        w = w.repeat_interleave(sizes)
    order = torch.argsort(chosen)
    assert torch.equal(sel.rows, chosen[order])
    # float32 errors (softmax - onehot) against float64 autograd: OMP's weights to ~1e-5
    ours = sel.weights.double() / sel.weight_scale
    torch.testing.assert_close(ours, w[order], rtol=1e-4, atol=0)


def test_craig_similarity_is_that_of_the_gradients_of_a_head_without_a_bias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CRAIG's similarity d_max - ||g_i - g_j|| (bias_only=False) is of the weight's gradients
    # alone for a head without a bias: as torch.func's per-sample gradients give it, to float32
    # rounding (~5e-7 of d_max; with a bias part the head does not have, 2e-3 of d_max off)
    inputs = bias_free_inputs(seed=7)
    assert inputs.classifier_weight is not None
    seen: list[Tensor] = []
    real = craig_module.facility_location

    def recording(sim: Tensor, k: int, **kwargs: Any) -> Tensor:
        seen.append(sim.clone())
        return real(sim, k, **kwargs)

    monkeypatch.setattr(craig_module, "facility_location", recording)
    sel = select_craig(inputs, 300, generator=torch.Generator().manual_seed(0), bias_only=False)
    assert len(seen) == 1 and sel.rows.shape == (300,)  # one partition: all 3,000 rows
    grads = bias_free_gradients(inputs.pool, inputs.classifier_weight)  # [3000, 1280]
    d = torch.cdist(grads, grads)  # [3000, 3000]
    reference = d.max() - d
    torch.testing.assert_close(seen[0].double(), reference, rtol=0, atol=1e-5 * float(d.max()))
