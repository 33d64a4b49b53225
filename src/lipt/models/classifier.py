"""The LightningModule used for main training, the full warm-up and each jigsaw learner."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torchmetrics.classification import MulticlassAccuracy

from lipt.core.errors import UserError
from lipt.core.seeding import global_rng_states, set_global_rng_states
from lipt.models.loss import weighted_loss
from lipt.models.schedules import Clock, cosine, is_torch_scheduler

# What training_step, validation_step and test_step log (what a callback may monitor).
LOGGED_METRICS = (
    "val/acc",
    "val/loss",
    "train/loss",
    "train/loss_step",
    "train/loss_epoch",
    "train/weighted_loss",
)

# The paper's optimiser (appendix A), configs/optimizer/sgd.yaml's settings.
PAPER_SGD = functools.partial(
    torch.optim.SGD, lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4
)


def plateau_config(schedule: Any) -> dict[str, Any]:
    """Lightning's scheduler config for a torch scheduler stepped once per epoch. One that steps
    on a metric (ReduceLROnPlateau) watches the validation loss it lowers (mode "min"), or the
    accuracy it raises ("max"); an epoch without a validation (check_val_every_n_epoch > 1,
    no validation split) leaves the learning rate as it is rather than failing the fit."""
    if not isinstance(schedule, ReduceLROnPlateau):
        return {"scheduler": schedule}
    monitor = "val/loss" if schedule.mode == "min" else "val/acc"
    return {"scheduler": schedule, "monitor": monitor, "strict": False}


# A trainer that only trains: no logger, no checkpoints, no bars, no validation.
QUIET_TRAINER: dict[str, Any] = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
}


class DivergedError(UserError):
    """Training's loss became NaN or infinite. Raised before the step that would train on it,
    so the fit ends there instead of training on NaN weights and then writing down their
    accuracy (argmax of NaN logits, a plausible-looking number) as the run's result."""

    def __init__(
        self, loss: float, step: int, epoch: int, lr: float | None, weights: bool = False
    ) -> None:
        self.loss, self.step = loss, step
        rate = "" if lr is None else f", learning rate {lr:.3g}"
        what = "a weight became NaN or infinite" if weights else f"the loss became {loss}"
        super().__init__(
            f"training diverged: {what} at step {step} (epoch {epoch}{rate}); "
            "lower the learning rate (optimizer.lr; pretrain.optim.lr for jigsaw learners) "
            "or look for NaN or infinite values in the inputs"
        )


class Classifier(L.LightningModule):
    """Cross-entropy classifier with per-sample loss weights.

    The weighted loss is normalised by the batch's weight sum (as CORDS does), so selectors whose
    weights sum to the pool size do not silently multiply the learning rate. The optimiser and
    its schedule are the groups `optimizer` and `scheduler` (lipt.models.schedules); by default
    the paper's appendix A: SGD lr 0.1, momentum 0.9, nesterov, weight decay 5e-4, cosine.

    Dynamic pruning (lipt.dynamic) asks for two changes: `loss_norm="batch"` divides the weighted
    loss by the batch size instead (InfoBatch's mean: its weights restore a full epoch's loss
    sum, which a weight-sum normalisation would undo), and `schedule_over="epochs"` anneals the
    learning rate over (fractional) epochs instead of steps, so epochs of different lengths
    each take their share of the schedule and the last step still ends at zero.
    """

    def __init__(
        self,
        model: nn.Module,
        num_classes: int,
        optimizer: Callable[..., Optimizer] | None = None,
        scheduler: Callable[..., Any] | None = None,
        loss_norm: str = "weights",
        schedule_over: str = "steps",
        total_steps: int | None = None,
    ) -> None:
        super().__init__()
        if loss_norm not in ("weights", "batch"):
            raise ValueError(f"loss_norm must be 'weights' or 'batch', not {loss_norm!r}")
        if schedule_over not in ("steps", "epochs"):
            raise ValueError(f"schedule_over must be 'steps' or 'epochs', not {schedule_over!r}")
        self.save_hyperparameters(ignore=["model", "optimizer", "scheduler"])
        # (parameters) -> optimiser, and (optimiser, clock) -> schedule: the groups `optimizer` and
        # `scheduler` (lipt.stages.build.build_classifier); the paper's SGD and cosine unless
        # set.
        self.make_optimizer: Callable[..., Optimizer] = optimizer or PAPER_SGD
        self.make_scheduler: Callable[..., Any] = scheduler or cosine
        self.loss_norm, self.schedule_over = loss_norm, schedule_over
        self.num_classes = num_classes
        # A step budget the fit stops at (lipt.models.schedules.StopAtStep); None: the Trainer's.
        self.total_steps = total_steps
        self.model = model
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        # Training samples passed forward and backward by this process (summed over ranks at
        # the end of fit); kept in checkpoints so a resumed run keeps counting.
        self.samples_seen = 0
        # Seconds of training kept in checkpoints before this fit (a resumed run's earlier
        # attempts), and when this fit started: what stages.train.seconds adds up.
        self.seconds_before = 0.0
        self.fit_started: float | None = None
        # The last training batch's per-sample losses, detached: what dynamic pruning scores by.
        self.last_losses: Tensor | None = None
        self.last_loss: Tensor | None = None  # the loss trained on, detached (NaN: diverged)
        # Batches done in the current epoch, and its batch count (schedule_over="epochs").
        self.epoch_batches_done, self.epoch_batches = 0, 1
        # The optimizer step the weights were last validated at (None: not yet in this process)
        self.validated_at_step: int | None = None

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    def logits(self, x: Any, batch: int) -> Tensor:
        """The model's logits [batch, num_classes] for the inputs `x` of `batch` samples (`x`:
        whatever the model takes, a tensor or not).

        Raises:
            UserError: a forward that gives anything else (a tuple, logits of other
                classes), at the first batch; cross-entropy or the accuracy metric failed on
                it later (after a whole epoch), in words that do not name the model.
        """
        out = self.model(x)
        if isinstance(out, Tensor) and out.shape == (batch, self.num_classes):
            return out
        gave = f"a {type(out).__name__}"
        if isinstance(out, Tensor):
            gave = f"a tensor of shape {tuple(out.shape)} for a batch of {batch}"
        raise UserError(
            f"the model's forward gave {gave}, not the logits [batch, {self.num_classes}] "
            f"that Classifier(num_classes={self.num_classes}) trains on: make forward return "
            "the logits alone, one per class of the data"
        )

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x, y, _, w = batch
        y = y.long()  # a user's int32 labels (int64 stays as it is, not copied)
        per_sample = F.cross_entropy(self.logits(x, len(y)), y, reduction="none")  # [B]
        loss = weighted_loss(self, per_sample, w, self.loss_norm)  # sets self.last_losses
        if self.checks_loss_now():
            self.stop_if_diverged(loss)
        self.last_loss = loss.detach()
        if self._trainer is not None:
            batches = self.trainer.num_training_batches
            self.epoch_batches = int(batches) if math.isfinite(batches) else 1
        self.epoch_batches_done = batch_idx + 1
        self.samples_seen += int(y.shape[0])
        # The bar shows the samples' own mean loss. The loss trained on differs under dynamic
        # pruning, whose weights restore a whole epoch's sum (~1/(1 - pruned share) larger).
        shown = per_sample.detach().mean()
        self.log("train/loss", shown, prog_bar=True, on_step=True, on_epoch=True)
        self.log("train/weighted_loss", loss.detach(), on_step=False, on_epoch=True)
        return loss

    def checks_loss_now(self) -> bool:
        """Whether this step's loss is checked for NaN: every step on the CPU, where reading it
        costs nothing; on an accelerator, where it waits for the device, every
        `log_every_n_steps` steps. A diverged model stays diverged (NaN weights give NaN
        losses), so a later check still sees it; the epoch's end checks the weights
        (`on_train_batch_end`), so no result is written of NaN weights."""
        if self._trainer is None or self.device.type == "cpu":
            return True
        every = int(getattr(self.trainer, "log_every_n_steps", 50))  # set in Trainer.__init__
        return self.trainer.global_step % max(1, every) == 0

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After the epoch's last update, before any epoch-end callback (re-selection,
        checkpoints) reads the model: its weights, which that update may have made NaN after
        its loss was checked."""
        if batch_idx + 1 >= self.trainer.num_training_batches:
            self.check_weights()

    def on_train_epoch_end(self) -> None:
        """An epoch of no known length (an iterable's): its end, before the checkpoints and the
        test."""
        if not math.isfinite(self.trainer.num_training_batches):
            self.check_weights()

    def check_weights(self) -> None:
        """DivergedError where a weight is NaN or infinite (one pass, one wait per epoch)."""
        if self.last_loss is None:
            return
        finite = torch.stack([p.detach().isfinite().all() for p in self.parameters()]).all()
        self.stop_if_diverged(torch.where(finite, self.last_loss, torch.nan), weights=True)

    def stop_if_diverged(self, loss: Tensor, weights: bool = False) -> None:
        """Raise DivergedError for a non-finite loss. Every rank decides together under DDP:
        a rank that stopped alone would leave the others waiting in the gradient all-reduce."""
        loss = loss.detach()
        bad = not bool(torch.isfinite(loss).all())
        if self._trainer is None:
            if bad:
                raise DivergedError(float(loss), 1, 0, None)
            return
        trainer = self.trainer
        if trainer.world_size > 1:
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if not bad:
            return
        optimizers = trainer.optimizers
        lr = float(optimizers[0].param_groups[0]["lr"]) if optimizers else None
        # the step about to train on the loss; `weights`: the step that made them
        step = trainer.global_step + (0 if weights else 1)
        raise DivergedError(float(loss), step, trainer.current_epoch, lr, weights)

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        x, y, _ = batch
        y = y.long()
        logits = self.logits(x, len(y))
        self.val_acc(logits, y)
        self.log("val/loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val/acc", self.val_acc, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.validated_at_step = self.trainer.global_step

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        x, y, _ = batch
        self.test_acc(self.logits(x, len(y)), y)
        self.log("test/acc", self.test_acc)

    def configure_optimizers(self) -> Any:
        optimizer = self.make_optimizer(self.parameters())
        if is_torch_scheduler(self.make_scheduler):
            # A torch scheduler class configured as it is: stepped once per epoch.
            schedule = self.make_scheduler(optimizer)
            return {"optimizer": optimizer, "lr_scheduler": plateau_config(schedule)}
        budget = self.total_steps
        clock = Clock(
            total_steps=lambda: max(1, int(budget or self.trainer.estimated_stepping_batches)),
            progress=self.epochs_done_share if self.schedule_over == "epochs" else None,
        )
        schedule = self.make_scheduler(optimizer, clock)
        if schedule is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def epochs_done_share(self) -> float:
        """The share of max_epochs done after the current batch, counting the current epoch's
        share of batches done (a schedule over epochs asks it after each step)."""
        epochs = max(1, int(self.trainer.max_epochs or 1))
        done = self.trainer.current_epoch + self.epoch_batches_done / max(1, self.epoch_batches)
        return min(1.0, done / epochs)

    def on_fit_start(self) -> None:
        self.fit_started = time.perf_counter()

    def seconds_trained(self) -> float:
        """Training seconds of the whole run: earlier attempts' checkpointed ones and this fit's."""
        now = 0.0 if self.fit_started is None else time.perf_counter() - self.fit_started
        return self.seconds_before + now

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["samples_seen"] = self.samples_seen
        checkpoint["seconds_trained"] = self.seconds_trained()
        # The global streams (dropout, the DataLoader path's shuffling and transforms), so a
        # resumed run continues them instead of restarting them from the seed.
        checkpoint["rng_states"] = global_rng_states()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.samples_seen = int(checkpoint.get("samples_seen", 0))
        self.seconds_before = float(checkpoint.get("seconds_trained", 0.0))
        if "rng_states" in checkpoint:  # absent from checkpoints written before it was kept
            set_global_rng_states(checkpoint["rng_states"])

    def total_samples_seen(self) -> int:
        """Samples over all ranks (call on every rank: it is a collective under DDP)."""
        # int64: a float32 count rounds past 2**24 (ImageNet's pool, 14 epochs); MPS has no float64
        count = torch.tensor(self.samples_seen, dtype=torch.int64, device=self.device)
        return int(self.trainer.strategy.reduce(count, reduce_op="sum").item())
