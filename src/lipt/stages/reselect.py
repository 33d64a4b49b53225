"""Re-selection during main training (`reselect_every=R`): every R epochs the selector runs
again with the current model's gradients (the paper re-selects every 20 epochs, appendix A).
Each re-selection that ranked the pool with the model also records where its subset sits
(`lipt.selection.profile`), as the first selection does, so a re-selecting run shows whether its
later subsets drift towards the hard tail or away from coverage.

Rank 0 computes the new subset once and broadcasts it; every rank then rebuilds its loader
(Lightning reloads train loaders every R epochs) and trains on its own part of the same subset.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
from torch import Tensor, nn

from lipt.data import DataModule
from lipt.run.artifacts import atomic_write_bytes, save_subset

# (model, epoch, profile to fill) -> indices, weights; the profile stays empty when the selector
# ranks nothing (random)
Chooser = Callable[[nn.Module, int, dict[str, float]], tuple[Tensor, Tensor]]


def fingerprint(indices: Tensor, weights: Tensor) -> str:
    digest = hashlib.sha256(indices.cpu().numpy().tobytes())
    digest.update(weights.cpu().numpy().tobytes())
    return digest.hexdigest()


class Reselect(L.Callback):
    def __init__(
        self, every: int, datamodule: DataModule, choose: Chooser, out_dir: Path, meta: dict
    ) -> None:
        if every < 1:
            raise ValueError(f"reselect every must be >= 1, got {every}")
        self.every, self.dm, self.choose = every, datamodule, choose
        self.out_dir, self.meta = out_dir, meta
        self.reselections = 0
        self.seconds = 0.0  # profiles included, as in stages.select
        # str(completed epochs) -> subset profile: keyed as summary.json and the checkpoint keep it
        self.profiles: dict[str, dict[str, float]] = {}
        initial = datamodule.subset_indices
        self.unique = set() if initial is None else set(initial.tolist())

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch + 1  # epochs completed
        if epoch % self.every != 0 or epoch >= (trainer.max_epochs or 0):
            return
        start = time.perf_counter()
        subset: tuple[Tensor, Tensor] | None = None
        if trainer.is_global_zero:
            model = pl_module.model
            assert isinstance(model, nn.Module)
            profile: dict[str, float] = {}
            indices, weights = self.choose(model, epoch, profile)
            if profile:
                self.profiles[str(epoch)] = profile
            subset = (indices.cpu(), weights.cpu())
            save_subset(self.out_dir / "subsets" / f"epoch_{epoch}.npz", *subset, self.meta)
        subset = trainer.strategy.broadcast(subset, src=0)
        assert subset is not None
        indices, weights = subset
        self.dm.set_subset(indices, weights)
        self.unique.update(indices.tolist())
        self.reselections += 1
        self.seconds += time.perf_counter() - start
        # An audit trail that each rank trains on the same subset.
        rank_file = self.out_dir / "subsets" / f"epoch_{epoch}.rank{trainer.global_rank}.sha256"
        atomic_write_bytes(rank_file, fingerprint(indices, weights).encode())

    # Kept in Lightning checkpoints, so a resumed run reports the whole run's figures.
    def state_dict(self) -> dict:
        return {
            "reselections": self.reselections,
            "seconds": self.seconds,
            "unique": torch.tensor(sorted(self.unique), dtype=torch.int64),
            "profiles": self.profiles,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.reselections = int(state_dict["reselections"])
        self.seconds = float(state_dict["seconds"])
        self.unique = set(state_dict["unique"].tolist())
        # A checkpoint written before profiles were kept has none.
        self.profiles = dict(state_dict.get("profiles", {}))


def latest_subset(out_dir: Path, completed_epochs: int) -> Path | None:
    """The subset in force after `completed_epochs` epochs: the last re-selection at or before
    that point (None: the initial subset.npz)."""
    best: tuple[int, Path] | None = None
    for path in (out_dir / "subsets").glob("epoch_*.npz"):
        epoch = int(path.stem.split("_")[1])
        if epoch <= completed_epochs and (best is None or epoch > best[0]):
            best = (epoch, path)
    return None if best is None else best[1]
