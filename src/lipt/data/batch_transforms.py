"""Augmentation of whole batches on the batch's device, with per-sample random parameters.

The resident data path (lipt.data.resident) slices uint8 batches out of a tensor that lives on
the training device and augments them here, in a few tensor ops per batch instead of one
torchvision call per image. Every random parameter (crop offsets, flips, RandAugment's operation
and sign per sample) is drawn from a CPU `torch.Generator` and then moved, so the same seed
gives the same batch on any device.

The operations follow torchvision.transforms.v2: `RandomCrop(padding=p)` (zero fill),
`RandomHorizontalFlip()`, and `RandAugment` (Cubuk et al. 2020,
https://arxiv.org/abs/1909.13719) with its 14 operations, magnitude bins and random signs,
nearest interpolation and black fill. Pixels stay float in [0, 255] between operations (no
rounding back to uint8 after each, unlike torchvision on uint8 images).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

RANDAUGMENT_OPS = (
    "identity",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
    "rotate",
    "brightness",
    "color",
    "contrast",
    "sharpness",
    "posterize",
    "solarize",
    "autocontrast",
    "equalize",
)
# The images torchvision's RandAugment takes (its colour operations know no other channel counts).
RANDAUGMENT_CHANNELS = (1, 3)
_SIGNED = {"shear_x", "shear_y", "translate_x", "translate_y", "rotate"} | {
    "brightness",
    "color",
    "contrast",
    "sharpness",
}


@dataclass(frozen=True)
class RandAugmentSettings:
    num_ops: int = 1
    magnitude: int = 9
    num_magnitude_bins: int = 31

    @classmethod
    def from_dict(cls, settings: dict | None) -> RandAugmentSettings | None:
        if settings is None:
            return None
        return cls(
            num_ops=int(settings.get("num_ops", 1)),
            magnitude=int(settings.get("magnitude", 9)),
            num_magnitude_bins=int(settings.get("num_magnitude_bins", 31)),
        )


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """`t`, made on the host, on `device` without the host waiting for it: a blocking copy to a
    GPU first waits for every kernel queued before it, once per batch; one from pinned memory
    is queued behind them. (Not on MPS, whose non-blocking copies race: the blocking one.)"""
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=device.type != "mps")


@functools.lru_cache(maxsize=32)
def _statistics(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[Tensor, Tensor]:
    """mean and std as float32 [1, C, 1, 1] on `device`, copied there once, not every batch."""
    m = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    return m, s


def normalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """uint8 (or float in [0, 255]) [B, C, H, W] -> normalised float32, as
    `ToDtype(float32, scale=True)` then `Normalize(mean, std)`."""
    m, s = _statistics(tuple(map(float, mean)), tuple(map(float, std)), x.device)
    return (x.float() / 255.0 - m) / s


def random_crop(x: Tensor, padding: int, generator: torch.Generator) -> Tensor:
    """Zero-pad by `padding` and crop back to [H, W] at a random offset per sample."""
    if padding <= 0:
        return x
    b, _, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))  # [B, C, H+2p, W+2p]
    top = to_device(torch.randint(0, 2 * padding + 1, (b,), generator=generator), x.device)
    left = to_device(torch.randint(0, 2 * padding + 1, (b,), generator=generator), x.device)
    rows = top[:, None] + torch.arange(h, device=x.device)  # [B, H]
    cols = left[:, None] + torch.arange(w, device=x.device)  # [B, W]
    batch = torch.arange(b, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # [B, H, W, C]
    return out.permute(0, 3, 1, 2)


def random_flip(x: Tensor, generator: torch.Generator) -> Tensor:
    """Mirror each sample left-right with probability 1/2."""
    flip = to_device(torch.rand(x.shape[0], generator=generator) < 0.5, x.device)
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)


def magnitudes(op: str, settings: RandAugmentSettings, height: int, width: int) -> float:
    """torchvision's magnitude for `op` at `settings.magnitude` (before the random sign)."""
    bins, k = settings.num_magnitude_bins, settings.magnitude
    if not 0 <= k < bins:
        raise ValueError(f"magnitude must be in [0, {bins}), got {k}")

    def linspace(hi: float, lo: float = 0.0) -> float:
        return float(torch.linspace(lo, hi, bins)[k]) if bins > 1 else 0.0

    table = {
        "shear_x": lambda: linspace(0.3),
        "shear_y": lambda: linspace(0.3),
        "translate_x": lambda: linspace(150.0 / 331.0 * width),
        "translate_y": lambda: linspace(150.0 / 331.0 * height),
        "rotate": lambda: linspace(30.0),
        "brightness": lambda: linspace(0.9),
        "color": lambda: linspace(0.9),
        "contrast": lambda: linspace(0.9),
        "sharpness": lambda: linspace(0.9),
        "posterize": lambda: float(8 - round(k / ((bins - 1) / 4))) if bins > 1 else 8.0,
        "solarize": lambda: float(torch.linspace(255.0, 0.0, bins)[k]) if bins > 1 else 255.0,
    }
    return table[op]() if op in table else 0.0


def rand_augment(x: Tensor, settings: RandAugmentSettings, generator: torch.Generator) -> Tensor:
    """`settings.num_ops` rounds; in each, every sample gets its own uniformly drawn operation
    and sign. x: float [B, C, H, W] in [0, 255], C grey (1) or RGB (3)."""
    b, c, h, w = x.shape
    if c not in RANDAUGMENT_CHANNELS:
        # contrast would average a missing blue channel into NaN, colour take 3 of 4 as RGB
        raise ValueError(f"RandAugment takes grey (1) or RGB (3) images, not {c} channels")
    for _ in range(settings.num_ops):
        ops = torch.randint(0, len(RANDAUGMENT_OPS), (b,), generator=generator)
        signs = torch.where(torch.rand(b, generator=generator) < 0.5, -1.0, 1.0)
        out = x.clone()
        for k, op in enumerate(RANDAUGMENT_OPS):
            if op == "identity":
                continue
            rows = (ops == k).nonzero().flatten()
            if len(rows) == 0:
                continue
            m = torch.full((len(rows),), magnitudes(op, settings, h, w))
            if op in _SIGNED:
                m = m * signs[rows]
            rows_dev = to_device(rows, x.device)
            out[rows_dev] = apply_op(op, x[rows_dev], to_device(m, x.device))
        x = out
    return x


def apply_op(op: str, x: Tensor, m: Tensor) -> Tensor:
    """One RandAugment operation on float [N, C, H, W] in [0, 255], magnitude m: [N]."""
    if op in ("shear_x", "shear_y", "translate_x", "translate_y", "rotate"):
        return _affine(op, x, m)
    if op == "brightness":
        return _blend(x, torch.zeros_like(x), 1.0 + m)
    # Grey levels and the blur are floored/rounded as torchvision does on uint8 images.
    if op == "color":
        return _blend(x, _grey(x).floor().expand_as(x), 1.0 + m) if x.shape[1] == 3 else x
    if op == "contrast":
        mean = _grey(x).floor().mean(dim=(1, 2, 3), keepdim=True)  # [N, 1, 1, 1]
        return _blend(x, mean.expand_as(x), 1.0 + m)
    if op == "sharpness":
        return _blend(x, _smoothed(x), 1.0 + m)
    if op == "posterize":
        step = (2.0 ** (8 - m)).view(-1, 1, 1, 1)
        return torch.floor(x / step) * step
    if op == "solarize":
        return torch.where(x >= m.view(-1, 1, 1, 1), 255.0 - x, x)
    if op == "autocontrast":
        lo = x.amin(dim=(2, 3), keepdim=True)
        hi = x.amax(dim=(2, 3), keepdim=True)
        scale = torch.where(hi > lo, 255.0 / (hi - lo).clamp(min=1e-6), 1.0)
        return torch.where(hi > lo, (x - lo) * scale, x).clamp(0, 255)
    if op == "equalize":
        return _equalize(x)
    raise ValueError(f"unknown RandAugment operation {op!r}")


def _blend(x: Tensor, other: Tensor, factor: Tensor) -> Tensor:
    f = factor.view(-1, 1, 1, 1)
    return (f * x + (1.0 - f) * other).clamp(0, 255)


def _grey(x: Tensor) -> Tensor:
    if x.shape[1] == 1:
        return x
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    return 0.2989 * r + 0.587 * g + 0.114 * b  # [N, 1, H, W], torchvision's weights


def _smoothed(x: Tensor) -> Tensor:
    """torchvision's sharpness blur: 3x3 kernel (1s, centre 5)/13 inside, borders unchanged."""
    c = x.shape[1]
    kernel = torch.ones(3, 3, dtype=x.dtype, device=x.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / kernel.sum()).expand(c, 1, 3, 3)
    inner = F.conv2d(x, kernel, groups=c)  # [N, C, H-2, W-2]
    out = x.clone()
    out[:, :, 1:-1, 1:-1] = inner.round()
    return out


def _affine(op: str, x: Tensor, m: Tensor) -> Tensor:
    """Shear (about the top-left corner, as torchvision), translate (pixels) or rotate
    (degrees, about the centre); nearest interpolation, black fill."""
    n, _, h, w = x.shape
    # Inverse map from output to input pixel coordinates, centred: [N, 2, 3].
    theta = torch.zeros(n, 2, 3, dtype=torch.float32, device=x.device)
    theta[:, 0, 0] = 1.0
    theta[:, 1, 1] = 1.0
    if op == "shear_x":  # x_in = x_out + s * (y_out + h/2): about the top edge
        theta[:, 0, 1] = m
        theta[:, 0, 2] = m * h / 2
    elif op == "shear_y":
        theta[:, 1, 0] = m
        theta[:, 1, 2] = m * w / 2
    elif op == "translate_x":
        theta[:, 0, 2] = -m
    elif op == "translate_y":
        theta[:, 1, 2] = -m
    else:
        a = m * (math.pi / 180.0)
        cos, sin = torch.cos(a), torch.sin(a)
        theta[:, 0, 0], theta[:, 0, 1] = cos, -sin
        theta[:, 1, 0], theta[:, 1, 1] = sin, cos
    # Pixel offsets from the centre -> affine_grid's [-1, 1] coordinates.
    scale = torch.tensor([w / 2.0, h / 2.0], device=x.device)
    theta[:, :, :2] = theta[:, :, :2] * scale.view(1, 1, 2) / scale.view(1, 2, 1)
    theta[:, :, 2] = theta[:, :, 2] / scale.view(1, 2)
    grid = F.affine_grid(theta, [n, x.shape[1], h, w], align_corners=False)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def _equalize(x: Tensor) -> Tensor:
    """Per-channel histogram equalisation as PIL/torchvision do it, for all samples at once."""
    n, c, h, w = x.shape
    flat = x.round().clamp(0, 255).long().reshape(n * c, h * w)  # [NC, HW]
    hist = torch.zeros(n * c, 256, dtype=torch.long, device=x.device)
    hist.scatter_add_(1, flat, torch.ones_like(flat))  # [NC, 256]
    top = hist.gather(1, flat.amax(dim=1, keepdim=True))  # count of the brightest value
    step = torch.div(h * w - top, 255, rounding_mode="floor")  # [NC, 1]
    safe = step.clamp(min=1)
    lut = torch.div(
        hist.cumsum(1) + torch.div(safe, 2, rounding_mode="floor"), safe, rounding_mode="floor"
    )
    lut = torch.cat([torch.zeros_like(lut[:, :1]), lut[:, :-1]], dim=1).clamp(0, 255)
    out = torch.where(step > 0, lut.gather(1, flat), flat)
    return out.reshape(n, c, h, w).to(x.dtype)


def augment_batch(
    images: Tensor,
    generator: torch.Generator,
    mean: Sequence[float],
    std: Sequence[float],
    crop_padding: int = 0,
    flip: bool = False,
    randaugment: RandAugmentSettings | None = None,
) -> Tensor:
    """uint8 [B, C, H, W] -> normalised float32: crop, flip, RandAugment, normalise (the order
    of lipt.data.transforms.train_transform)."""
    x = images
    if crop_padding > 0:
        x = random_crop(x, crop_padding, generator)
    if flip:
        x = random_flip(x, generator)
    if randaugment is not None:
        x = rand_augment(x.float(), randaugment, generator)
    return normalize(x, mean, std)
