"""The device-resident data path: for data sets that fit in memory (Fashion-MNIST, CIFAR).

The uint8 image tensor is copied once to the training device; a batch is an index slice of it,
augmented as a whole batch there (lipt.data.batch_transforms). No DataLoader, no workers, no
per-image Python. Re-selection only swaps the positions (and weights) a loader slices.

Training items are (x, y, idx, w); evaluation items (x, y, idx), as on the DataLoader path.
Under DDP each rank takes its own part of one shared permutation, padded like Lightning's
DistributedSampler so that every rank runs the same number of steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from lipt.data.batch_transforms import RandAugmentSettings, augment_batch, normalize, to_device
from lipt.data.sources import TensorImages


class DeviceCopies(Protocol):
    """Inputs and labels of one split, copied to a device on first use."""

    def on(self, device: torch.device) -> tuple[Tensor, Tensor]: ...


def copy_key(device: torch.device | str) -> str:
    """One key per device a copy lives on: "cuda" is the current CUDA device, the one
    "cuda:0" names on a one-GPU machine (the learners ask for the one, the trainer the other:
    two copies of the split on one GPU)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


@dataclass
class ResidentImages:
    """One split's images and labels, with a copy per device made on first use."""

    source: TensorImages
    _copies: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict, repr=False)

    def on(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """images uint8 [N, C, H, W] and labels int64 [N] on `device` (copied once)."""
        key = copy_key(device)
        if key not in self._copies:
            images, labels = self.source.images, self.source.labels
            if device.type == "cuda":
                images, labels = images.pin_memory(), labels.pin_memory()
            self._copies[key] = (images.to(device), labels.to(device))
        return self._copies[key]


@dataclass(frozen=True)
class Augmentation:
    crop_padding: int = 0
    flip: bool = False
    randaugment: RandAugmentSettings | None = None


class ResidentBatches:
    """An iterable of batches sliced from `images` at `positions` (positions in the split).

    `augmentation` None gives evaluation batches (x, y, idx) in order; otherwise training
    batches (x, y, idx, w), shuffled and augmented with a fresh permutation each epoch from
    `seed` + the epoch: what `epoch_source` says when an iteration starts (the trainer's epoch,
    so a resumed run, or a loader a re-selection rebuilt, draws what an uninterrupted run
    draws), else the number of earlier iterations. `device` is a callable so the device can be
    resolved when iteration starts (the trainer is known then, not when the loader is made).
    """

    def __init__(
        self,
        images: DeviceCopies,
        positions: Tensor,
        batch_size: int,
        device: torch.device,
        mean: Sequence[float],
        std: Sequence[float],
        augmentation: Augmentation | None = None,
        weights: Tensor | None = None,
        seed: int = 0,
        world_size: int = 1,
        rank: int = 0,
        epoch_source: Callable[[], int | None] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        if weights is not None and weights.shape != positions.shape:
            raise ValueError(
                f"weights {tuple(weights.shape)} != positions {tuple(positions.shape)}"
            )
        self.images, self.positions = images, positions.long().cpu()
        self.weights = None if weights is None else weights.float().cpu()
        self.batch_size, self.device = batch_size, torch.device(device)
        self.mean, self.std = list(mean), list(std)
        self.augmentation, self.seed = augmentation, seed
        self.world_size, self.rank = world_size, rank
        self.epoch, self.epoch_source = 0, epoch_source

    @property
    def training(self) -> bool:
        return self.augmentation is not None

    def rows_this_rank(self) -> int:
        n = len(self.positions)
        return -(-n // self.world_size) if self.training else n

    def __len__(self) -> int:
        return -(-self.rows_this_rank() // self.batch_size)

    def order(self, epoch: int) -> Tensor:
        """Rows of `positions` this rank visits in `epoch`."""
        n = len(self.positions)
        if not self.training:
            return torch.arange(n)
        g = torch.Generator().manual_seed(self.seed + epoch)
        perm = torch.randperm(n, generator=g)
        total = self.rows_this_rank() * self.world_size
        if total > n:  # pad by wrapping, as DistributedSampler does
            perm = torch.cat([perm, perm[: total - n]])
        return perm[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        # Asked, not told: Lightning starts a resumed fit's first iteration before any hook runs.
        known = None if self.epoch_source is None else self.epoch_source()
        if known is not None:
            self.epoch = known
        epoch, self.epoch = self.epoch, self.epoch + 1
        images, labels = self.images.on(self.device)
        rows = self.order(epoch)
        positions = to_device(self.positions[rows], self.device)
        weights = None if self.weights is None else to_device(self.weights[rows], self.device)
        # Augmentation parameters: their own stream per (seed, epoch, rank), drawn on the CPU.
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 4099 + self.rank)
        for start in range(0, len(rows), self.batch_size):
            idx = positions[start : start + self.batch_size]
            x, y = self.prepare(images[idx], g), labels[idx]
            if not self.training:
                yield x, y, idx
                continue
            w = (
                torch.ones(len(idx), device=self.device)
                if weights is None
                else weights[start : start + self.batch_size]
            )
            yield x, y, idx, w

    def prepare(self, x: Tensor, generator: torch.Generator) -> Tensor:
        """A batch as the model sees it: normalised, and augmented when training."""
        aug = self.augmentation
        if aug is None:
            return normalize(x, self.mean, self.std)
        return augment_batch(
            x, generator, self.mean, self.std, aug.crop_padding, aug.flip, aug.randaugment
        )
