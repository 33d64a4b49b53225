"""The Lightning side of dynamic pruning: scores from the training losses, a plan per epoch.

`DynamicPruning` works with any LightningModule whose training step gives per-sample losses
(`module.last_losses`, [B], which `lipt.weighted_loss` sets; lipt's `Classifier` does) and any
lipt data module (`PoolDataModule` for your own data set, lipt's `DataModule`): each training
batch's losses (from the training forward pass: no extra pass) overwrite the scores of the
samples they came from; under DDP every rank gathers all ranks' (position, loss) pairs first, so
all ranks keep identical scores and draw identical plans. The data module asks `epoch_subset`
for its training set whenever it builds a training loader (every epoch: the callback sets
`reload_dataloaders_every_n_epochs=1`), at the trainer's epoch, after a resumed fit has
restored the epoch and the scores; the plan's generator is seeded from the run's seed and the
epoch alone, so a resumed run draws what an uninterrupted one draws. A checkpoint keeps the
epoch's plan as well: a fit resumed from one taken in mid-epoch trains the set it was stopped in
(its loader, as Lightning restarts a loader that keeps no state, from a fresh shuffle).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor

from lipt.core.artifacts import atomic_write_bytes
from lipt.core.errors import UserError
from lipt.core.seeding import generator
from lipt.data import SubsetData
from lipt.data.contract import check_subset_data
from lipt.dynamic.plan import EpochPlan, PruningMethod, ensemble_losses
from lipt.selection.gradients import model_outputs
from lipt.selection.types import LearnerHeads

AUDIT_DIR = "dynamic"


def epoch_number(item: tuple[str, float]) -> int:
    """The epoch of a (str(epoch), share) entry of the ledger's pruned_share."""
    return int(item[0])


def on_device(t: Tensor, device: torch.device) -> Tensor:
    """`t` on `device`: itself where it is there already (batches and scores are on the
    module's device), so a step moves nothing, and a copy that waits for the device only
    where a tensor was elsewhere."""
    return t if t.device == device else t.to(device)


def audit_path(out_dir: Path, epoch: int, rank: int) -> Path:
    return Path(out_dir) / AUDIT_DIR / f"epoch_{epoch}.rank{rank}.npz"


class DynamicPruning(L.Callback):
    """Prunes the pool of `datamodule` per epoch with `method` (lipt.dynamic.plan: `InfoBatch`,
    `LiptBudget`). `initial_scores` [N]: the pool's scores before epoch 0 (None: the method's
    own; `ensemble_scores` gives LiptBudget's; extra DDP ranks get rank 0's at fit start).
    `audit_dir`: write each epoch's plan and the scores it was drawn from, per rank, to
    `dynamic/epoch_E.rankR.npz` there (record_seen=true).

    The trainer must fit with `datamodule`, and the module's training step must set
    `last_losses` (`lipt.weighted_loss` does) and weigh its loss by the batch's `w` with
    `norm="batch"`.

    Raises:
        ValueError: at the start of fit, for a module without `last_losses`, a trainer fitting
            other data, or a training step that gives no per-sample losses (first batch).
    """

    def __init__(
        self,
        method: PruningMethod,
        datamodule: SubsetData,
        seed: int = 0,
        initial_scores: Tensor | None = None,
        audit_dir: Path | None = None,
    ) -> None:
        if not hasattr(method, "plan") or not hasattr(method, "initial_scores"):
            raise ValueError(f"method must be InfoBatch(...) or LiptBudget(...), not {method!r}")
        check_subset_data(datamodule, "DynamicPruning")
        self.method, self.dm, self.seed, self.audit_dir = method, datamodule, seed, audit_dir
        self.pool = datamodule.pool_indices  # [N] positions in the data set, ascending
        n = len(self.pool)
        given = None if initial_scores is None else torch.as_tensor(initial_scores)  # numpy too
        scores = method.initial_scores(n) if given is None else given
        if scores.shape != (n,):
            raise ValueError(f"initial scores {tuple(scores.shape)} do not fit the pool of {n}")
        if given is not None and not bool(torch.isfinite(given).all()):
            raise ValueError("initial_scores hold NaN or infinite values: give each row a score")
        self.scores = scores.float().clone()  # [N], on the training device during fit
        # The pool row of each position of the data set (-1: not in the pool).
        self.row_of = torch.full((int(self.pool.max()) + 1,), -1, dtype=torch.int64)
        self.row_of[self.pool] = torch.arange(n)
        self.fed = torch.zeros(n, dtype=torch.bool)  # rows trained on at least once
        self.pruned_share: dict[str, float] = {}  # str(epoch) -> share of the pool left out
        self.planned: tuple[int, EpochPlan] | None = None
        self.scheduled_epochs: int | None = None  # the fit's trainer.max_epochs: the plans'

    # --- scores --------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not hasattr(pl_module, "last_losses"):
            raise ValueError(
                f"{type(pl_module).__name__} gives no per-sample losses: in training_step, "
                "return lipt.weighted_loss(self, losses, w, norm='batch') with losses computed "
                "with reduction='none' (it sets self.last_losses)"
            )
        if getattr(trainer, "datamodule", None) is not self.dm:
            raise ValueError(
                "DynamicPruning prunes the data module it was given: pass that one to "
                "trainer.fit(module, datamodule=...)"
            )
        reload = trainer.reload_dataloaders_every_n_epochs  # type: ignore[attr-defined]
        if reload not in (0, 1):
            raise ValueError(
                f"DynamicPruning needs a training loader per epoch; reload_dataloaders_every_n_"
                f"epochs={reload} would train on stale plans: leave it 0 or set it to 1"
            )
        trainer.reload_dataloaders_every_n_epochs = 1  # type: ignore[attr-defined]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1:  # the ensemble scored the pool on rank 0 only
            self.scores = trainer.strategy.broadcast(self.scores.cpu(), src=0)
        device = pl_module.device
        self.scores, self.row_of, self.fed = (
            t.to(device) for t in (self.scores, self.row_of, self.fed)
        )
        self.dm.epoch_subset = lambda epoch: self.epoch_subset(trainer, epoch)
        epochs = trainer.max_epochs
        self.scheduled_epochs = epochs if epochs is not None and epochs >= 0 else None

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        losses = getattr(pl_module, "last_losses", None)  # [B], detached
        positions = batch[2]  # [B] positions in the data set
        if not isinstance(losses, Tensor) or losses.shape != positions.shape:
            shape = None if not isinstance(losses, Tensor) else tuple(losses.shape)
            raise ValueError(
                f"training_step left last_losses {shape} for a batch of "
                f"{tuple(positions.shape)}: set it to the batch's per-sample losses in every "
                "step (lipt.weighted_loss does)"
            )
        # A step that does not set them again is caught above.
        pl_module.last_losses = None  # type: ignore[assignment]
        if trainer.world_size > 1:  # every rank's batch: equal sizes, ranks are padded alike
            positions = trainer.strategy.all_gather(positions).flatten()  # [W * B]
            losses = trainer.strategy.all_gather(losses).flatten()
        # Loaders yield the plan only, so every row is in the pool (not asserted: a GPU sync).
        rows = self.row_of[on_device(positions, self.row_of.device)]
        self.scores[rows] = on_device(losses.float(), self.scores.device)
        self.fed[rows] = True

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.dm.epoch_subset = None  # later loaders (a second fit) train on what set_subset says

    # --- plans ---------------------------------------------------------------------------

    def plan(self, epoch: int, num_epochs: int) -> EpochPlan:
        """Epoch `epoch`'s plan, drawn once (a loader built twice for one epoch gets the same)."""
        if self.planned is None or self.planned[0] != epoch:
            stream = generator(self.seed, "dynamic", epoch)
            scores = self.scores.cpu()
            self.check_scores(scores, epoch)
            self.planned = (epoch, self.method.plan(scores, epoch, num_epochs, stream))
        return self.planned[1]

    def check_scores(self, scores: Tensor, epoch: int) -> None:
        """UserError for a NaN or infinite training loss among the scores: InfoBatch would
        compare with a NaN mean and prune nothing, LiptBudget's draw would fail in torch."""
        bad = ~torch.isfinite(scores)
        if bool(bad.any()):
            first = int(self.pool[torch.nonzero(bad)[0, 0]])
            raise UserError(
                f"dynamic pruning: the training loss of {int(bad.sum())} of {len(scores)} pool "
                f"items is NaN or infinite before epoch {epoch} (data set position {first} "
                "first): training diverged, or those inputs hold NaN or infinite values; lower "
                "the learning rate, or fix or drop those items"
            )

    def epoch_subset(self, trainer: L.Trainer, epoch: int) -> tuple[Tensor, Tensor]:
        """(positions in the original split, loss weights) that epoch `epoch` trains on."""
        plan = self.plan(epoch, int(trainer.max_epochs or 1))
        return self.pool[plan.rows], plan.weights

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Recorded here, not when a loader is built: a fit resumed from an epoch's end builds
        # one for that finished epoch first, then the next epoch's, and trains only the latter.
        epoch = trainer.current_epoch
        assert self.planned is not None and self.planned[0] == epoch, "loader not reloaded"
        plan = self.planned[1]
        self.pruned_share[str(epoch)] = plan.pruned_share(len(self.pool))
        if self.audit_dir is not None:
            self.write_audit(epoch, trainer.global_rank, plan)

    def write_audit(self, epoch: int, rank: int, plan: EpochPlan) -> None:
        buffer = io.BytesIO()
        np.savez(
            buffer,
            indices=self.pool[plan.rows].numpy(),
            weights=plan.weights.numpy(),
            scores=self.scores.cpu().numpy(),
        )
        assert self.audit_dir is not None
        atomic_write_bytes(audit_path(self.audit_dir, epoch, rank), buffer.getvalue())

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        share = self.pruned_share.get(str(trainer.current_epoch))
        if share is not None:
            pl_module.log("train/pruned_share", share, on_step=False, on_epoch=True)

    # --- the ledger and the checkpoint -----------------------------------------------------

    def ledger(self, samples: int, full_epochs: int) -> dict[str, Any]:
        """summary.json's stages.train.dynamic: the method, its knobs, what the whole pool's
        run costs (the pool for `full_epochs`, trainer.max_epochs: what `fraction` is a share
        of, whatever epochs the budget trained), what pruning saved against it (the rows its
        plans left out of the epochs that began, and the epochs its schedule leaves out of
        `full_epochs`; negative for a run that cost more), what a stop cut short of the
        schedule (trainer.limit_train_batches, max_time), the share pruned per epoch."""
        n = len(self.pool)
        full = n * full_epochs
        pruned = sum(round(share * n) for share in self.pruned_share.values())
        scheduled = full_epochs if self.scheduled_epochs is None else self.scheduled_epochs
        cut = max(n * scheduled - pruned - samples, 0)  # the schedule's rows not trained
        return {
            "method": self.method.name,
            **self.method.settings(),
            "samples_full": full,
            # full = saved + cut + samples; negative for a run that cost more than the full one
            "samples_saved": full - cut - samples,
            "samples_cut": cut,
            # by epoch, as numbers (as strings, "10" came before "2")
            "pruned_share": {
                k: round(v, 6) for k, v in sorted(self.pruned_share.items(), key=epoch_number)
            },
        }

    def unique_samples(self) -> int:
        return int(self.fed.sum())

    # Kept in Lightning checkpoints: a resumed run scores, plans and reports as if never stopped.
    # The epoch's plan too: a checkpoint taken mid-epoch (every_n_train_steps) holds scores that
    # the epoch's first batches changed already, from which the resumed epoch drew another set.
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "scores": self.scores.cpu(),
            "fed": self.fed.cpu(),
            "pruned_share": dict(self.pruned_share),
        }
        if self.planned is not None:
            epoch, plan = self.planned
            state["planned"] = {
                "epoch": epoch,
                "rows": plan.rows.int(),  # pool rows: int32 halves the checkpoint's share
                "weights": plan.weights,
                "annealing": plan.annealing,
            }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scores = state_dict["scores"].float().clone()
        self.fed = state_dict["fed"].bool().clone()
        self.pruned_share = {str(k): float(v) for k, v in state_dict["pruned_share"].items()}
        planned = state_dict.get("planned")  # absent from checkpoints written before it was kept
        if planned is not None:
            plan = EpochPlan(
                planned["rows"].long().clone(),
                planned["weights"].float().clone(),
                bool(planned["annealing"]),
            )
            self.planned = (int(planned["epoch"]), plan)


def ensemble_scores(
    soup: torch.nn.Module,
    data: SubsetData,
    learner_heads: LearnerHeads | None = None,
    head: torch.nn.Linear | str | None = None,
    batches: Iterable[Any] | None = None,
) -> Tensor:
    """`LiptBudget`'s epoch-0 scores [N], in pool order: each pool sample's cross-entropy under
    the jigsaw ensemble, the soup and its learners' heads (`lipt.jigsaw_pretrain` gives both) on
    the soup's embeddings (`head`: its final nn.Linear, as `lipt.select` takes it). `batches`:
    the pool's (x, y, idx) batches, by default `data.pool_dataloader()`."""
    pool_batches = data.pool_dataloader() if batches is None else batches
    pool = model_outputs(soup, pool_batches, None, head)
    if not torch.equal(pool.indices, data.pool_indices.cpu()):
        raise ValueError("the pool loader must yield every pool position once")
    return ensemble_losses(pool.logits, pool.embeddings, pool.targets, learner_heads)
