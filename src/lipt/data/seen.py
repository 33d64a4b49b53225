"""An audit trail of what main training fed the loss (`record_seen=true`).

Per epoch and rank, `seen/epoch_{E}.rank{R}.npz` holds the positions (in the original training
split) that the train loader yielded, in the order it yielded them, and the loss weights that
came with them. E is the 0-based epoch index, so with re-selection `seen/epoch_E` should hold
exactly the subset in force during that epoch: `subsets/epoch_K.npz` for the last K <= E, else
`subset.npz`. The callback only reads the batches: it draws no random numbers and changes no
order, so a run trains the same model with it on or off.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor

from lipt.core.artifacts import atomic_write_bytes

SEEN_DIR = "seen"


def seen_path(out_dir: Path, epoch: int, rank: int) -> Path:
    return Path(out_dir) / SEEN_DIR / f"epoch_{epoch}.rank{rank}.npz"


class SeenSamples(L.Callback):
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.indices: list[Tensor] = []
        self.weights: list[Tensor] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.indices, self.weights = [], []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        _, _, idx, w = batch  # the training items are (x, y, position, loss weight)
        self.indices.append(idx.detach().cpu())
        self.weights.append(w.detach().cpu())

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        empty = torch.zeros(0)
        buffer = io.BytesIO()
        np.savez(
            buffer,
            indices=torch.cat(self.indices or [empty]).numpy().astype(np.int64),
            weights=torch.cat(self.weights or [empty]).numpy().astype(np.float32),
        )
        path = seen_path(self.out_dir, trainer.current_epoch, trainer.global_rank)
        atomic_write_bytes(path, buffer.getvalue())


def load_seen(out_dir: Path, epoch: int, rank: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(positions, weights) that rank `rank` fed the loss in epoch `epoch`, in loader order."""
    with np.load(seen_path(out_dir, epoch, rank)) as data:
        return data["indices"], data["weights"]
