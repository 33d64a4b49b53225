"""One-shot global pruning of jigsaw learners (lipt.jigsaw.pruning)."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import prune

from lipt.core.seeding import torch_threads
from lipt.jigsaw.pruning import (
    draw_density,
    prunable_parameters,
    prune_magnitude,
    prune_model,
    prune_random,
    prune_snip,
)

PRUNABLE = ["conv1.weight", "conv2.weight", "fc.weight"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from intra-op threads, which oversubscribe a busy small CPU."""
    with torch_threads(1):
        yield


class Net(nn.Module):
    """Tiny CNN with every kind of parameter pruning must tell apart."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1, bias=False)
        self.norm = nn.GroupNorm(2, 8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.norm(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


def _net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    model = Net()
    with torch.no_grad():  # non-trivial norm parameters, so "untouched" means something
        for p in (model.bn1.weight, model.bn1.bias, model.norm.weight, model.norm.bias):
            p.uniform_(0.5, 1.5)
    return model


def _batch(seed: int = 0, n: int = 16) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)


def _snapshot(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_plain_module(model: Net, keys_before: list[str]) -> None:
    """Masks permanent, state dict as before, loadable strictly into a fresh instance."""
    assert not prune.is_pruned(model)
    assert list(model.state_dict()) == keys_before  # same keys, same order
    assert not any(k.endswith(("_orig", "_mask")) for k in model.state_dict())
    assert all(not m._forward_pre_hooks for m in model.modules())
    for name, p in model.named_parameters():
        assert isinstance(p, nn.Parameter) and p.requires_grad, name
    fresh = Net()
    fresh.load_state_dict(model.state_dict(), strict=True)
    x, _ = _batch(3)
    model.eval(), fresh.eval()
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


def _expected_top(scores: dict[str, Tensor], density: float) -> dict[str, Tensor]:
    """Reference global top-k by a plain sort of all scores jointly."""
    flat = torch.cat([scores[n].flatten() for n in PRUNABLE])
    keep = round(density * flat.numel())
    threshold = flat.sort(descending=True).values[keep - 1]
    return {n: scores[n] >= threshold for n in PRUNABLE}


def test_prunable_parameters_are_conv_and_linear_weights_only() -> None:
    model = nn.Sequential(
        nn.Conv1d(2, 3, 3),
        nn.BatchNorm1d(3),
        nn.Conv3d(3, 3, 1),
        nn.LayerNorm(3),
        nn.Linear(3, 4, bias=False),
        nn.Embedding(5, 3),
        nn.Conv2d(3, 3, 1),
    )
    found = prunable_parameters(model)
    assert [(m, n) for m, n in found] == [
        (model[0], "weight"),
        (model[2], "weight"),
        (model[4], "weight"),
        (model[6], "weight"),
    ]


@pytest.mark.parametrize("density", [0.85, 0.9, 0.95, 0.5, 1.0])
def test_omp_keeps_global_top_magnitudes(density: float) -> None:
    model = _net()
    before = _snapshot(model)
    keys = list(model.state_dict())
    masks = prune_magnitude(model, density)

    assert set(masks) == set(PRUNABLE)
    total = sum(before[n].numel() for n in PRUNABLE)
    assert sum(int(m.sum()) for m in masks.values()) == round(density * total)
    expected = _expected_top({n: before[n].abs() for n in PRUNABLE}, density)
    after = model.state_dict()
    for n in PRUNABLE:
        assert masks[n].dtype == torch.bool
        assert torch.equal(masks[n], expected[n]), n
        assert torch.equal(after[n], before[n] * expected[n]), n
    # Global, not per layer: the layers end with different densities.
    per_layer = {n: float(masks[n].float().mean()) for n in PRUNABLE}
    if density < 1.0:
        assert len(set(per_layer.values())) > 1
    # Biases, norm parameters and buffers are untouched.
    for k in before:
        if k not in PRUNABLE:
            assert torch.equal(after[k], before[k]), k
    _assert_plain_module(model, keys)


def test_random_pruning_keeps_exact_count_reproducibly() -> None:
    density = 0.85
    before = _snapshot(_net())
    results = []
    for seed in (11, 11, 12):
        model = _net()
        keys = list(model.state_dict())
        masks = prune_random(model, density, generator=torch.Generator().manual_seed(seed))
        total = sum(m.numel() for m in masks.values())
        assert sum(int(m.sum()) for m in masks.values()) == round(density * total)
        after = model.state_dict()
        for n in PRUNABLE:  # kept weights keep their values, the others are zero
            assert torch.equal(after[n], before[n] * masks[n])
        for k in before:
            if k not in PRUNABLE:
                assert torch.equal(after[k], before[k]), k
        _assert_plain_module(model, keys)
        results.append(masks)
    assert all(torch.equal(results[0][n], results[1][n]) for n in PRUNABLE)
    assert not all(torch.equal(results[0][n], results[2][n]) for n in PRUNABLE)
    # Random, not magnitude: differs from the OMP mask.
    omp = prune_magnitude(_net(), density)
    assert not all(torch.equal(results[0][n], omp[n]) for n in PRUNABLE)


def test_snip_keeps_top_connection_sensitivity() -> None:
    density = 0.8
    model = _net()
    model.train()
    x, y = _batch(1)
    # Reference saliency |w * dL/dw| on an untouched copy, in the same (train) mode.
    reference = copy.deepcopy(model)
    loss = F.cross_entropy(reference(x), y)
    loss.backward()
    named = dict(reference.named_parameters())
    saliency = {}
    for n in PRUNABLE:
        grad = named[n].grad
        assert grad is not None
        saliency[n] = (named[n].detach() * grad).abs()

    before = _snapshot(model)
    keys = list(model.state_dict())
    masks = prune_snip(model, density, x, y)
    expected = _expected_top(saliency, density)
    after = model.state_dict()
    for n in PRUNABLE:
        assert torch.equal(masks[n], expected[n]), n
        assert torch.equal(after[n], before[n] * expected[n]), n
    # Only weights change: BatchNorm running stats and .grad are as before.
    for k in before:
        if k not in PRUNABLE:
            assert torch.equal(after[k], before[k]), k
    assert all(p.grad is None for p in model.parameters())
    assert model.training
    _assert_plain_module(model, keys)
    # SNIP ranks by |w * g|, not |w|: the masks differ from OMP's.
    omp = prune_magnitude(_net(), density)
    assert not all(torch.equal(masks[n], omp[n]) for n in PRUNABLE)


def _learner(seed: int) -> Net:
    """The common init, trained a few steps on its own batch."""
    model = _net(0)
    x, y = _batch(100 + seed)
    for _ in range(5):  # plain SGD, no optimizer state to carry
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads, strict=True):
                p.sub_(0.5 * g)
    return model


def test_two_learners_get_different_masks() -> None:
    gen = torch.Generator().manual_seed(0)
    densities = [draw_density(0.85, 0.95, generator=gen) for _ in range(2)]
    assert densities[0] != densities[1]
    a, b = _learner(1), _learner(2)
    mask_a = prune_model(a, "omp", densities[0])
    mask_b = prune_model(b, "omp", densities[1])
    count = {
        k: sum(int(m.sum()) for m in masks.values()) for k, masks in [("a", mask_a), ("b", mask_b)]
    }
    assert count["a"] != count["b"]
    assert not all(torch.equal(mask_a[n], mask_b[n]) for n in PRUNABLE)
    # Same density, different data: still different masks.
    c, d = _learner(3), _learner(4)
    mask_c, mask_d = prune_model(c, "omp", 0.9), prune_model(d, "omp", 0.9)
    assert not all(torch.equal(mask_c[n], mask_d[n]) for n in PRUNABLE)


def test_draw_density_range_and_reproducibility() -> None:
    draws = [
        draw_density(0.85, 0.95, generator=torch.Generator().manual_seed(s)) for s in range(50)
    ]
    assert all(0.85 <= d <= 0.95 for d in draws)
    assert len(set(draws)) == 50
    again = draw_density(0.85, 0.95, generator=torch.Generator().manual_seed(3))
    assert again == draws[3]
    assert draw_density(0.9, 0.9, generator=None) == pytest.approx(0.9)
    for low, high in [(0.0, 0.5), (0.6, 0.5), (0.5, 1.1), (-0.1, 0.5), (math.nan, 0.5)]:
        with pytest.raises(ValueError):
            draw_density(low, high, generator=None)


def test_prune_model_dispatch() -> None:
    x, y = _batch(2)
    for method in ("omp", "random", "snip"):
        model = _net()
        masks = prune_model(
            model, method, 0.9, generator=torch.Generator().manual_seed(0), batch=(x, y)
        )
        assert set(masks) == set(PRUNABLE)
        assert sum(int(m.sum()) for m in masks.values()) == round(
            0.9 * sum(m.numel() for m in masks.values())
        )
    # The dispatcher gives what the direct call gives.
    a, b = _net(), _net()
    direct = prune_random(a, 0.9, generator=torch.Generator().manual_seed(4))
    via = prune_model(b, "random", 0.9, generator=torch.Generator().manual_seed(4))
    assert all(torch.equal(direct[n], via[n]) for n in PRUNABLE)
    # "none" changes nothing and reports dense masks.
    model = _net()
    before = _snapshot(model)
    masks = prune_model(model, "none", 0.9)
    assert all(bool(m.all()) for m in masks.values()) and set(masks) == set(PRUNABLE)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("density", [0.0, -0.1, 1.01, math.nan])
def test_bad_density_raises(density: float) -> None:
    for method in ("omp", "random", "none"):
        with pytest.raises(ValueError, match="density"):
            prune_model(_net(), method, density)


def test_bad_method_and_snip_without_batch_raise() -> None:
    with pytest.raises(ValueError, match="unknown pruning method"):
        prune_model(_net(), "magnitude", 0.9)
    with pytest.raises(ValueError, match="batch"):
        prune_model(_net(), "snip", 0.9)


def test_refuses_already_pruned_and_tied_weights() -> None:
    model = _net()
    prune.l1_unstructured(model.fc, "weight", amount=0.5)
    with pytest.raises(ValueError, match=r"prune\.remove"):
        prune_magnitude(model, 0.9)
    tied = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    tied[1].weight = tied[0].weight
    with pytest.raises(ValueError, match="tied"):
        prune_magnitude(tied, 0.9)


@pytest.mark.parametrize("method", ["omp", "snip"])
def test_channels_last_weights_are_pruned_as_the_standard_layouts(method: str) -> None:
    """model.channels_last: torch's pruning views each weight flat, which NHWC convolution
    weights cannot give ("view size is not compatible"): every jigsaw learner failed."""
    density = 0.6
    standard, nhwc = _net(), _net().to(memory_format=torch.channels_last)
    assert not nhwc.conv1.weight.is_contiguous()
    x, y = _batch(1)
    if method == "omp":
        expected, masks = prune_magnitude(standard, density), prune_magnitude(nhwc, density)
    else:
        expected = prune_snip(standard, density, x, y)
        masks = prune_snip(nhwc, density, x.to(memory_format=torch.channels_last), y)
    after, reference = nhwc.state_dict(), standard.state_dict()
    for n in PRUNABLE:
        assert torch.equal(masks[n], expected[n]), n
        assert torch.equal(after[n], reference[n]), n
    assert nhwc.conv1.weight.is_contiguous(memory_format=torch.channels_last)
