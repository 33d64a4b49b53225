"""One-shot global pruning of a jigsaw learner.

LiPT (Ro et al., ICML 2023, https://proceedings.mlr.press/v202/ro23a.html, section 3.3) prunes
each learner once, after its local training, with one-shot magnitude pruning (OMP) at a density
(kept fraction) drawn per learner from U[0.85, 0.95]: a regulariser against overfitting the
learner's few minibatches and a source of diversity between learners (different masks).
Appendix D compares OMP with random pruning and SNIP (Lee et al., ICLR 2019,
https://arxiv.org/abs/1810.02340); all three are here, plus ``none``.

What is pruned: the weights of every ``nn.Conv1d/2d/3d`` and ``nn.Linear``, ranked *jointly*
over the whole model (global pruning); norm layers and biases are never pruned. The masks are
computed and applied with ``torch.nn.utils.prune`` and then made permanent (``prune.remove``),
so the returned model is a plain module again: its pruned weights are zeros, its state dict
has the same keys in the same order, and it loads into a fresh instance of its class. The
masks are returned (by parameter name) for reporting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import prune

__all__ = [
    "PRUNE_METHODS",
    "PruneMethod",
    "draw_density",
    "prunable_parameters",
    "prune_magnitude",
    "prune_model",
    "prune_random",
    "prune_snip",
]

PruneMethod = Literal["omp", "random", "snip", "none"]
PRUNE_METHODS: tuple[str, ...] = ("omp", "random", "snip", "none")

# Layers whose weights are pruned. Norm layers, embeddings and all biases are left dense.
_PRUNABLE_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)

_ParamRef = tuple[nn.Module, str]


def _named_prunable(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """``(qualified parameter name, module, "weight")`` for every prunable weight."""
    found: list[tuple[str, nn.Module, str]] = []
    seen: dict[int, str] = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, _PRUNABLE_TYPES):
            continue
        weight = getattr(module, "weight", None)
        if weight is None:
            continue
        qualified = f"{module_name}.weight" if module_name else "weight"
        # A weight shared by two layers would be masked twice by torch.nn.utils.prune.
        if id(weight) in seen:
            raise ValueError(
                f"{qualified} is the same tensor as {seen[id(weight)]}: tied weights are not "
                f"supported by global pruning"
            )
        seen[id(weight)] = qualified
        found.append((qualified, module, "weight"))
    return found


def prunable_parameters(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """``(module, "weight")`` for every Conv1d/2d/3d and Linear layer of ``model``.

    This is the ``parameters`` argument of ``torch.nn.utils.prune.global_unstructured``.
    """
    return [(module, name) for _, module, name in _named_prunable(model)]


def _check_density(density: float) -> float:
    density = float(density)
    if not 0.0 < density <= 1.0:  # also rejects NaN
        raise ValueError(f"density (kept fraction) must be in (0, 1], got {density}")
    return density


def draw_density(low: float, high: float, *, generator: torch.Generator | None) -> float:
    """A density drawn from U[low, high]; LiPT draws one per learner from U[0.85, 0.95].

    Raises:
        ValueError: unless ``0 < low <= high <= 1``.
    """
    low, high = float(low), float(high)
    if not 0.0 < low <= high <= 1.0:
        raise ValueError(f"density bounds must satisfy 0 < low <= high <= 1, got [{low}, {high}]")
    device = generator.device if generator is not None else "cpu"
    u = float(torch.rand((), generator=generator, device=device).item())
    return low + (high - low) * u


def _prune_global(
    model: nn.Module, density: float, scores: Sequence[Tensor] | None
) -> dict[str, Tensor]:
    """Keep the ``round(density * total)`` prunable weights with the largest score, jointly.

    ``scores`` (one non-negative tensor per prunable weight, same shapes) defaults to ``|w|``.
    Returns the boolean masks by parameter name; the pruning is permanent.
    """
    density = _check_density(density)
    named = _named_prunable(model)
    if not named:
        return {}
    if prune.is_pruned(model):
        raise ValueError(
            "model already carries torch.nn.utils.prune re-parametrisations; call prune.remove "
            "on them first"
        )
    params = [(module, name) for _, module, name in named]
    total = sum(getattr(module, name).numel() for module, name in params)
    keep = round(density * total)
    # Param order per module, restored after prune.remove (which re-appends "weight" last), so
    # that the state dict keeps the key order of an unpruned model.
    orders = {id(module): list(module._parameters) for module, _ in params}

    # torch's pruning views each tensor flat, which weights in channels_last (model.channels_last)
    # cannot give: they are pruned in the standard layout and put back in theirs afterwards.
    nhwc = [
        (module, name)
        for module, name in params
        if getattr(module, name).dim() == 4
        and not getattr(module, name).is_contiguous()
        and getattr(module, name).is_contiguous(memory_format=torch.channels_last)
    ]
    for module, name in nhwc:
        getattr(module, name).data = getattr(module, name).data.contiguous()
    importance: dict[_ParamRef, Tensor] | None = None
    if scores is not None:
        assert len(scores) == len(params)
        importance = {
            ref: score.detach().contiguous() for ref, score in zip(params, scores, strict=True)
        }

    masks: dict[str, Tensor] = {}
    with torch.no_grad():
        # L1Unstructured with an int amount zeros exactly that many entries of smallest |score|
        # (torch.topk), so exactly `keep` weights survive whatever the ties.
        prune.global_unstructured(
            params,
            pruning_method=prune.L1Unstructured,
            importance_scores=importance,
            amount=total - keep,
        )
        for qualified, module, name in named:
            masks[qualified] = getattr(module, f"{name}_mask").detach().to(torch.bool).clone()
            prune.remove(module, name)
    for module, _ in params:
        for key in orders[id(module)]:
            module._parameters[key] = module._parameters.pop(key)
    for module, name in nhwc:
        weight = getattr(module, name)
        weight.data = weight.data.contiguous(memory_format=torch.channels_last)
    assert sum(int(m.sum()) for m in masks.values()) == keep
    return masks


def prune_magnitude(model: nn.Module, density: float) -> dict[str, Tensor]:
    """One-shot global magnitude pruning (OMP), LiPT's choice.

    Keeps exactly ``round(density * total)`` weights with the largest ``|w|`` over all
    prunable tensors jointly and zeros the rest, in place. Returns the boolean masks
    (True = kept) by parameter name, e.g. ``"features.0.weight"``.

    Raises:
        ValueError: ``density`` outside (0, 1].
    """
    return _prune_global(model, density, scores=None)


def prune_random(
    model: nn.Module, density: float, *, generator: torch.Generator | None
) -> dict[str, Tensor]:
    """Global random pruning: keeps exactly ``round(density * total)`` weights, uniformly.

    The scores are drawn from ``generator`` (not torch's global RNG, unlike
    ``prune.RandomUnstructured``), so the mask is reproducible; ``None`` uses the global RNG.

    Raises:
        ValueError: ``density`` outside (0, 1].
    """
    _check_density(density)
    device = generator.device if generator is not None else "cpu"
    scores: list[Tensor] = []
    for module, name in prunable_parameters(model):
        weight: Tensor = getattr(module, name)
        draw = torch.rand(weight.shape, generator=generator, device=device)
        scores.append(draw.to(device=weight.device, dtype=weight.dtype))
    return _prune_global(model, density, scores)


def prune_snip(
    model: nn.Module,
    density: float,
    inputs: Tensor,
    targets: Tensor,
    *,
    loss_fn: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy,
) -> dict[str, Tensor]:
    """SNIP (Lee et al., ICLR 2019, https://arxiv.org/abs/1810.02340), applied globally.

    Saliency of a weight is the connection sensitivity ``|w * dL/dw|`` of the loss on one
    batch; the ``round(density * total)`` most salient weights are kept. (SNIP's normalisation
    by the sum of saliencies does not change a global ranking, so it is left out.) The gradient
    is taken in the model's current mode with ``torch.autograd.grad``, so ``.grad`` fields are
    untouched, and buffers (BatchNorm running statistics) are restored afterwards: the only
    change to the model is the pruning.

    Raises:
        ValueError: ``density`` outside (0, 1].
    """
    _check_density(density)
    params = prunable_parameters(model)
    if not params:
        return {}
    weights: list[Tensor] = [getattr(module, name) for module, name in params]
    device = weights[0].device
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    with torch.enable_grad():
        loss = loss_fn(model(inputs.to(device)), targets.to(device))
        grads = torch.autograd.grad(loss, weights, allow_unused=True)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    scores = [
        (w.detach() * g).abs() if g is not None else torch.zeros_like(w)
        for w, g in zip(weights, grads, strict=True)
    ]
    return _prune_global(model, density, scores)


def prune_model(
    model: nn.Module,
    method: str,
    density: float,
    *,
    generator: torch.Generator | None = None,
    batch: Sequence[Tensor] | None = None,
) -> dict[str, Tensor]:
    """Prune ``model`` in place with ``method`` (``"omp"``, ``"random"``, ``"snip"``, ``"none"``).

    ``generator`` drives ``random``; ``batch`` = ``(inputs, targets)`` is needed by ``snip``.
    ``none`` leaves the model untouched and returns all-True masks. Returns boolean masks
    (True = kept) by parameter name.

    Raises:
        ValueError: unknown method, ``density`` outside (0, 1], or ``snip`` without a batch.
    """
    if method not in PRUNE_METHODS:
        raise ValueError(f"unknown pruning method {method!r}; choose one of {PRUNE_METHODS}")
    density = _check_density(density)
    if method == "omp":
        return prune_magnitude(model, density)
    if method == "random":
        return prune_random(model, density, generator=generator)
    if method == "snip":
        if batch is None or len(batch) < 2:
            raise ValueError("snip pruning needs batch=(inputs, targets) to compute saliencies")
        return prune_snip(model, density, batch[0], batch[1])
    return {
        qualified: torch.ones_like(getattr(module, name), dtype=torch.bool)
        for qualified, module, name in _named_prunable(model)
    }
