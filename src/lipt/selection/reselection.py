"""Re-selection during main training (`reselect_every=R`, or `lipt.Reselection` on any
LightningModule): every R epochs a new subset is chosen with the current model's gradients (the
paper re-selects every 20 epochs, appendix A), by `lipt.select` or by the function it is given
(train.py's runs the configured selector). Each re-selection that ranked the pool with the model
also records where its subset sits (`lipt.selection.profile`), as the first selection does, so a
re-selecting run shows whether its later subsets drift towards the hard tail or away from
coverage.

Rank 0 computes the new subset once and broadcasts it; every rank then rebuilds its loader
at the next epoch and trains on its own part of the same subset. Each subset file records the
period and the subset it replaced, so a resumed run takes up its own re-selections
(`latest_subset`), never those another run left in the folder.
The Lightning wrapper of this folder's selectors, as lipt.dynamic.callback is of its plans.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch import Tensor, nn

from lipt.core.artifacts import atomic_write_bytes, load_subset, save_subset
from lipt.core.seeding import reselect_seed
from lipt.data import SubsetData
from lipt.data.contract import check_subset_data
from lipt.selection.api import (
    Selector,
    budget_of,
    seed_of,
    select,
)
from lipt.selection.gradients import resolve_head
from lipt.selection.selectors import check_held_out, selector_of

# (the LightningModule being trained, epoch, profile to fill) -> indices, weights; the profile
# stays empty when the selector ranks nothing (random)
Chooser = Callable[[nn.Module, int, dict[str, float]], tuple[Tensor, Tensor]]


def selecting(
    datamodule: SubsetData,
    budget: int | float,
    selector: str | Selector,
    head: nn.Linear | str | None,
    seed: int,
    balance: bool,
) -> Chooser:
    """A Chooser that re-selects with `lipt.select`, re-selection E drawing from
    reselect_seed(seed, E)."""

    def choose(module: nn.Module, epoch: int, profile: dict[str, float]) -> tuple[Tensor, Tensor]:
        subset = select(
            module,
            datamodule,
            budget,
            selector,
            head=head,
            seed=reselect_seed(seed, epoch),
            balance=balance,
        )
        profile.update(subset.profile)
        return subset.indices, subset.weights

    return choose


def fingerprint(indices: Tensor, weights: Tensor) -> str:
    digest = hashlib.sha256(indices.cpu().numpy().tobytes())
    digest.update(weights.cpu().numpy().tobytes())
    return digest.hexdigest()


def subset_digest(indices: Tensor | None) -> str | None:
    """Names a subset by its indices as a subset file holds them (int64); None: the pool."""
    if indices is None:
        return None
    return hashlib.sha256(indices.cpu().numpy().astype(np.int64).tobytes()).hexdigest()


# The key of a re-selected subset file's metadata that says which run wrote it.
RECORD = "reselection"


class Reselection(L.Callback):
    """Every `every` epochs (not after the last), choose a new subset with the module being
    trained and train on it. The subset of `budget` (a count or a share of the pool) is chosen by
    `lipt.select` on `datamodule`'s pool (set the first with `datamodule.set_subset`):
    `selector`, `head`, `balance` as in `lipt.select`, re-selection E drawing from
    `reselect_seed(seed, E)`. Or, in place of those, `choose` chooses (train.py's: the
    configured selector). `out_dir`: where each re-selection's subset (subsets/epoch_E.npz) and
    every rank's fingerprint of it are written (None: nowhere); `meta`: the subset files'
    metadata, to which each file adds its period and the digest of the subset it replaced
    (what `latest_subset` checks). The epoch after a re-selection trains on the new subset,
    in a resumed fit too.

    Raises:
        ValueError: at construction for a bad period, budget or selector, or data that is not a
            lipt data module; at the start of fit for a trainer fitting other data or a `head`
            the module does not have.
    """

    def __init__(
        self,
        every: int,
        datamodule: SubsetData,
        budget: int | float | None = None,
        selector: str | Selector = "coverage",
        *,
        head: nn.Linear | str | None = None,
        seed: int = 0,
        balance: bool = False,
        out_dir: Path | None = None,
        meta: dict | None = None,
        choose: Chooser | None = None,
    ) -> None:
        if isinstance(every, bool) or every < 1:
            raise ValueError(f"reselect every must be >= 1, got {every}")
        check_subset_data(datamodule, "re-selection")
        if (budget is None) == (choose is None):
            raise ValueError("give re-selection a budget (lipt.select chooses) or choose, not both")
        if choose is None:
            assert budget is not None
            # a bad selector or budget fails here, not epochs later
            check_held_out(selector_of(selector), datamodule, None)
            budget_of(budget, len(datamodule.pool_indices))
            seed = seed_of(seed)  # None failed at the first re-selection, an epoch in
            choose = selecting(datamodule, budget, selector, head, seed, balance)
        self.every, self.dm, self.choose = every, datamodule, choose
        self.out_dir, self.meta = out_dir, meta or {}
        # lipt.select finds the head when it runs: a bad one fails when fit starts instead
        self.head, self.checks_head = head, budget is not None
        self.reselections = 0
        # The trainer's reload period while one reload is forced (on_train_epoch_end).
        self.reload_period: int | None = None
        self.seconds = 0.0  # profiles included, as in stages.select
        # str(completed epochs) -> subset profile: keyed as summary.json and the checkpoint keep it
        self.profiles: dict[str, dict[str, float]] = {}
        initial = datamodule.subset_indices
        self.unique = set() if initial is None else set(initial.tolist())

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if getattr(trainer, "datamodule", None) is not self.dm:
            raise ValueError(
                "re-selection changes the data module it was given: pass that one to "
                "trainer.fit(module, datamodule=...)"
            )
        reload = trainer.reload_dataloaders_every_n_epochs  # type: ignore[attr-defined]
        if reload == 0:  # the training loader must be rebuilt after each re-selection
            trainer.reload_dataloaders_every_n_epochs = self.every  # type: ignore[attr-defined]
        elif self.every % reload:
            raise ValueError(
                f"reload_dataloaders_every_n_epochs={reload} misses re-selections every "
                f"{self.every} epochs: leave it 0 or set it to {self.every}"
            )
        if self.checks_head:
            resolve_head(pl_module, self.head)  # a bad head fails now, not epochs later

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch + 1  # epochs completed
        # None after the last epoch or step (max_epochs is -1 where max_steps alone bounds a fit)
        last_epoch = trainer.max_epochs is not None and 0 < trainer.max_epochs <= epoch
        steps_done = 0 < trainer.max_steps <= trainer.global_step
        if epoch % self.every != 0 or last_epoch or steps_done:
            return
        start = time.perf_counter()
        subset: tuple[Tensor, Tensor] | None = None
        if trainer.is_global_zero:
            profile: dict[str, float] = {}
            indices, weights = self.choose(pl_module, epoch, profile)
            if profile:
                self.profiles[str(epoch)] = profile
            subset = (indices.cpu(), weights.cpu())
            if self.out_dir is not None:
                path = self.out_dir / "subsets" / f"epoch_{epoch}.npz"
                record = {"every": self.every, "replaces": subset_digest(self.dm.subset_indices)}
                save_subset(path, *subset, {**self.meta, RECORD: record})
        subset = trainer.strategy.broadcast(subset, src=0)
        assert subset is not None
        indices, weights = subset
        self.dm.set_subset(indices, weights)
        # Lightning rebuilds the training loader once current_epoch minus the epoch it last did
        # reaches reload_dataloaders_every_n_epochs; a resumed fit counts from the epoch it
        # resumed at (the count is not checkpointed), which can be off the re-selection period.
        # A period of 1 until the next epoch starts rebuilds it there whatever that count.
        if self.reload_period is None:
            self.reload_period = trainer.reload_dataloaders_every_n_epochs  # type: ignore[attr-defined]
        trainer.reload_dataloaders_every_n_epochs = 1  # type: ignore[attr-defined]
        self.unique.update(indices.tolist())
        self.reselections += 1
        self.seconds += time.perf_counter() - start
        if self.out_dir is not None:  # an audit trail that each rank trains on the same subset
            name = f"epoch_{epoch}.rank{trainer.global_rank}.sha256"
            atomic_write_bytes(
                self.out_dir / "subsets" / name, fingerprint(indices, weights).encode()
            )

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.restore_reload_period(trainer)  # the loader was rebuilt just before this hook

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.restore_reload_period(trainer)  # a fit stopped early leaves the trainer as it was

    def restore_reload_period(self, trainer: L.Trainer) -> None:
        if self.reload_period is not None:
            trainer.reload_dataloaders_every_n_epochs = self.reload_period  # type: ignore[attr-defined]
            self.reload_period = None

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


def latest_subset(
    out_dir: Path,
    completed_epochs: int,
    every: int | None = None,
    initial: Tensor | None = None,
) -> Path | None:
    """The subset in force after `completed_epochs` epochs of a run that re-selects every
    `every` epochs, starting from the subset of indices `initial`: its last re-selection at or
    before that point (None: the initial subset). Only that run's own re-selections count: a
    file must record the period and replace the subset in force before it, back to `initial`,
    so the files another run left in `out_dir` are passed over (a file written before they
    recorded this is taken at a multiple of `every`). `every` 0: the run never re-selects; None: any
    period. `initial` None: the first re-selection may replace any subset."""
    if every is not None and every <= 0:
        return None
    in_force = subset_digest(initial)
    found: Path | None = None
    paths = {
        int(path.stem.split("_")[1]): path for path in (out_dir / "subsets").glob("epoch_*.npz")
    }
    for epoch in sorted(e for e in paths if e <= completed_epochs):
        indices, _, meta = load_subset(paths[epoch])
        record = meta.get(RECORD)
        if record is None:  # written before subset files said which run wrote them: trusted
            taken = every is None or epoch % every == 0
        else:
            period = record.get("every") if isinstance(record, dict) else None
            ours = isinstance(period, int) and period >= 1 and epoch % period == 0
            ours = ours and every in (None, period)
            first = found is None and initial is None  # no subset it must replace
            taken = ours and (first or record.get("replaces") == in_force)
        if taken:
            in_force, found = subset_digest(indices), paths[epoch]
    return found
