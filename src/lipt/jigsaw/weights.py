"""State-dict arithmetic for model soups: weighted averages, interpolation, finiteness, and
BatchNorm statistics re-estimated after averaging.

Floating tensors are averaged; integer and bool tensors (BatchNorm's ``num_batches_tracked``)
are never averaged and never turned into floats: a result takes them from its *first* argument
(the first state dict of an average, the soup side of an interpolation). Model soups: Wortsman
et al., ICML 2022, https://arxiv.org/abs/2203.05482; used by lipt.jigsaw.soup.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = [
    "StateDict",
    "average_state_dicts",
    "check_compatible",
    "interpolate",
    "is_finite_state_dict",
    "recompute_batchnorm_stats",
]

StateDict = dict[str, Tensor]


# --------------------------------------------------------------------------- arithmetic


def _is_float(t: Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def check_compatible(state_dicts: Sequence[StateDict]) -> None:
    """Raise ValueError unless all state dicts have the same keys, shapes and dtypes."""
    if not state_dicts:
        raise ValueError("need at least one state dict")
    first = state_dicts[0]
    for key, value in first.items():
        if not isinstance(value, Tensor):
            raise ValueError(f"state dict entry {key!r} is a {type(value).__name__}, not a Tensor")
    for i, sd in enumerate(state_dicts[1:], start=1):
        if sd.keys() != first.keys():
            missing = sorted(first.keys() - sd.keys())[:5]
            extra = sorted(sd.keys() - first.keys())[:5]
            raise ValueError(
                f"state dict {i} has other keys than state dict 0 (missing {missing}, "
                f"extra {extra}): soups need models of one architecture"
            )
        for key, ref in first.items():
            value = sd[key]
            if (
                not isinstance(value, Tensor)
                or value.shape != ref.shape
                or value.dtype != ref.dtype
            ):
                got = (
                    f"{tuple(value.shape)} {value.dtype}"
                    if isinstance(value, Tensor)
                    else type(value).__name__
                )
                raise ValueError(
                    f"state dict {i}[{key!r}] is {got}, state dict 0 has "
                    f"{tuple(ref.shape)} {ref.dtype}"
                )


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    # Sum half/bfloat16 weights in float32 to avoid rounding the soup twice.
    return torch.promote_types(dtype, torch.float32)


def average_state_dicts(
    state_dicts: Sequence[StateDict], weights: Sequence[float] | None = None
) -> StateDict:
    """Weighted average of state dicts (uniform when ``weights`` is None).

    ``weights`` are normalised to sum to 1. Floating tensors are averaged (accumulated in at
    least float32, returned in their own dtype, on the first state dict's device); integer and
    bool tensors are copied from the *first* state dict and keep their dtype. The result shares
    no storage with the inputs.

    Raises:
        ValueError: no state dicts, mismatched keys/shapes/dtypes, or bad weights (wrong count,
            negative, non-finite, or summing to 0).
    """
    check_compatible(state_dicts)
    n = len(state_dicts)
    if weights is None:
        coeffs = [1.0 / n] * n
    else:
        raw = [float(w) for w in weights]
        if len(raw) != n:
            raise ValueError(f"got {len(raw)} weights for {n} state dicts")
        if any(not math.isfinite(w) or w < 0 for w in raw) or sum(raw) <= 0:
            raise ValueError(f"weights must be finite, >= 0 and not all 0, got {raw}")
        total = sum(raw)
        coeffs = [w / total for w in raw]

    out: StateDict = {}
    for key, ref in state_dicts[0].items():
        if not _is_float(ref):
            out[key] = ref.detach().clone()
            continue
        acc = torch.zeros(ref.shape, dtype=_accumulation_dtype(ref.dtype), device=ref.device)
        for coeff, sd in zip(coeffs, state_dicts, strict=True):
            acc.add_(sd[key].detach().to(device=ref.device, dtype=acc.dtype), alpha=coeff)
        out[key] = acc.to(ref.dtype)
    return out


def interpolate(soup: StateDict, candidate: StateDict, alpha: float) -> StateDict:
    """``(1 - alpha) * soup + alpha * candidate`` for floating tensors.

    Integer and bool tensors are copied from ``soup``. The result shares no storage with the
    inputs.

    Raises:
        ValueError: ``alpha`` outside [0, 1], or mismatched state dicts.
    """
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:  # also rejects NaN
        raise ValueError(f"interpolation ratio alpha must be in [0, 1], got {alpha}")
    check_compatible([soup, candidate])
    out: StateDict = {}
    for key, s in soup.items():
        if not _is_float(s):
            out[key] = s.detach().clone()
            continue
        dtype = _accumulation_dtype(s.dtype)
        c = candidate[key].detach().to(device=s.device, dtype=dtype)
        mixed = s.detach().to(dtype) * (1.0 - alpha) + c * alpha
        out[key] = mixed.to(s.dtype)
    return out


def is_finite_state_dict(state_dict: StateDict) -> bool:
    """True when no floating tensor holds NaN or inf (a diverged learner; leave it out)."""
    return all(
        bool(torch.isfinite(t).all())
        for t in state_dict.values()
        if isinstance(t, Tensor) and _is_float(t)
    )


# --------------------------------------------------------------------------- BatchNorm


def recompute_batchnorm_stats(
    model: nn.Module, batches: Iterable[Tensor | Sequence[Tensor]]
) -> None:
    """Re-estimate every BatchNorm layer's running statistics on ``batches``.

    A soup's weights are an average, but its BatchNorm running mean/var are averages of the
    ingredients' statistics, which do not match the averaged weights. As in
    ``torch.optim.swa_utils.update_bn``: reset the running stats, set ``momentum=None``
    (cumulative average: each batch counts equally), forward every batch in train mode without
    gradients, then restore each layer's momentum and each module's train/eval mode. A batch
    may be an input tensor or a sequence whose first entry is the input (a ``(x, y)`` batch);
    inputs are moved to the model's device. Layers with ``track_running_stats=False`` are left
    alone.

    Raises:
        ValueError: ``batches`` is empty (the model is then left as it was).
    """
    layers = [
        m
        for m in model.modules()
        if isinstance(m, _BatchNorm) and m.track_running_stats and m.running_mean is not None
    ]
    if not layers:
        return
    first_stats = layers[0].running_mean
    assert isinstance(first_stats, Tensor)
    device = first_stats.device
    modes = {m: m.training for m in model.modules()}
    momenta = {m: m.momentum for m in layers}
    # Kept to undo the reset if no batch arrives or the forward fails.
    saved = {m: {k: v.clone() for k, v in m.named_buffers(recurse=False)} for m in layers}
    seen = 0
    done = False
    try:
        for m in layers:
            m.reset_running_stats()
            m.momentum = None
        model.train()
        with torch.no_grad():
            for batch in batches:
                inputs = batch if isinstance(batch, Tensor) else batch[0]
                model(inputs.to(device))
                seen += 1
        done = seen > 0
    finally:
        for m, momentum in momenta.items():
            m.momentum = momentum
        for module, training in modes.items():
            module.training = training
        if not done:
            with torch.no_grad():
                for m in layers:
                    for k, v in m.named_buffers(recurse=False):
                        v.copy_(saved[m][k])
    if seen == 0:
        raise ValueError("recompute_batchnorm_stats needs at least one batch")
