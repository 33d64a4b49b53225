"""`pretrain=full` and `pretrain=none`: pre-training strategies (lipt.jigsaw.context.Strategy)
that a subset selector's gradients are ranked with when lipt's jigsaw learners are not used.

A full warm-up of E_w epochs over the whole pool is what gradient-based selectors published
with: GradMatch's warm start (Killamsetty et al., ICML 2021, https://arxiv.org/abs/2103.00123,
section 4) and the 15-40 epochs the ICML 2023 paper counts as the pre-training tax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, ClassVar

import lightning as L
from torch import nn

from lipt.core import console
from lipt.core.bounds import POSITIVE, Interval
from lipt.core.settings import Checked
from lipt.data import DataModule
from lipt.jigsaw.context import PretrainContext, Pretrained


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
    (Killamsetty et al., ICML 2021, https://arxiv.org/abs/2103.00123, section 4)."""

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
        return f"pre-training: full, {epochs} epochs{how} on the whole pool of {pool_size:,}"

    def __call__(
        self, ctx: PretrainContext, dm: DataModule, model: nn.Module, seed: int
    ) -> Pretrained:
        module = ctx.classifier(model)
        L.seed_everything(seed, workers=True, verbose=False)
        trainer = ctx.trainer(
            max_epochs=self.warmup_epochs(ctx.main_epochs, ctx.fraction),
            enable_progress_bar=console.bars_enabled(),
        )
        dm.set_subset(None)
        trainer.fit(module, train_dataloaders=dm.train_dataloader())
        return Pretrained(model, 0.0, module.samples_seen, len(dm.pool_indices))
