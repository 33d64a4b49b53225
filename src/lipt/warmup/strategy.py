"""`pretrain=full` and `pretrain=none`: pre-training strategies (lipt.jigsaw.context.Strategy)
that a subset selector's gradients are ranked with when lipt's jigsaw learners are not used.

A full warm-up of E_w epochs over the whole pool is what gradient-based selectors published
with: GradMatch's warm start (Killamsetty et al., ICML 2021, https://arxiv.org/abs/2103.00123,
section 4) and the 15-40 epochs the ICML 2023 paper counts as the pre-training tax.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Annotated, ClassVar

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lipt.core import console
from lipt.core.bounds import POSITIVE, Interval
from lipt.core.settings import Checked
from lipt.data import DataModule
from lipt.data.resident import ResidentBatches
from lipt.jigsaw.context import PretrainContext, Pretrained
from lipt.warmup.saved import warmup_checkpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NoPretraining:
    """`pretrain=none`: select with the common initial model, untrained."""

    name: str = "none"

    def __call__(
        self, ctx: PretrainContext, dm: DataModule, model: nn.Module, seed: int
    ) -> Pretrained:
        return Pretrained(model, trained=False)

    def describe(self, ctx: PretrainContext, pool_size: int) -> str:
        return "pre-training: none (selection ranks with the untrained initial model)"


@dataclass(frozen=True)
class FullWarmup(Checked):
    """`pretrain=full`: `epochs` passes over the whole pool, or with `kappa` GradMatch's
    warm-start T_f = kappa * T_s * fraction (T_s: main training epochs), rounded up
    (Killamsetty et al., ICML 2021, https://arxiv.org/abs/2103.00123, section 4). Its progress
    is saved after every epoch (lipt.warmup.saved): run again in its folder after a kill, it
    goes on from there."""

    PREFIX: ClassVar[str] = "pretrain"

    name: str = "full"
    epochs: Annotated[int, Interval(ge=1, le=10**6)] = 10
    kappa: Annotated[float, POSITIVE] | None = None

    def warmup_epochs(self, main_epochs: int, fraction: float) -> int:
        if self.kappa is None:
            return int(self.epochs)
        return max(1, math.ceil(float(self.kappa) * int(main_epochs) * float(fraction)))

    def describe(self, ctx: PretrainContext, pool_size: int) -> str:
        epochs, kappa = self.warmup_epochs(ctx.main_epochs, ctx.fraction), self.kappa
        how = "" if kappa is None else f" (kappa {kappa} x {ctx.main_epochs} x {ctx.fraction:g})"
        plural = "s" * (epochs != 1)
        return f"pre-training: full, {epochs} epoch{plural}{how} on the whole pool of {pool_size:,}"

    def __call__(
        self, ctx: PretrainContext, dm: DataModule, model: nn.Module, seed: int
    ) -> Pretrained:
        module = ctx.classifier(model)
        L.seed_everything(seed, workers=True, verbose=False)
        epochs = self.warmup_epochs(ctx.main_epochs, ctx.fraction)
        # Saved after every epoch: a run killed mid-warm-up goes on from there when run again.
        saved = warmup_checkpoint(ctx, dm, module, seed, epochs)
        every_epoch = ModelCheckpoint(
            dirpath=saved.parent,
            filename=saved.stem,
            save_top_k=1,
            save_last=False,
            enable_version_counter=False,
            save_on_train_epoch_end=True,
        )
        # A bar on a terminal, unless trainer.enable_progress_bar=false turned bars off.
        bars = ctx.trainer_config.get("enable_progress_bar") is not False
        trainer = ctx.trainer(
            max_epochs=epochs,
            enable_progress_bar=bars and console.bars_enabled(),
            enable_checkpointing=True,
            callbacks=[every_epoch],
        )
        dm.set_subset(None)
        loader = dm.train_dataloader()
        if isinstance(loader, ResidentBatches):  # its order follows the epoch, resumed or not
            loader.epoch_source = lambda: int(trainer.current_epoch)
        resume = saved if saved.is_file() else None
        if resume is not None:
            log.info("pre-training: full, going on from %s", console.shown(resume))
        trainer.fit(module, train_dataloaders=loader, ckpt_path=resume)
        # A warm-up cut short (trainer.max_steps, limit_train_batches: debug=fdr) reads fewer
        # than the pool; each epoch is a shuffled pass without repeats.
        samples = module.samples_seen
        unique = min(samples, len(dm.pool_indices))
        # An earlier attempt's epochs are part of the stage's cost (pretrain_model adds them).
        return Pretrained(model, 0.0, samples, unique, reused_seconds=module.seconds_before)
