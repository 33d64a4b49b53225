"""Learning-rate schedules of the `scheduler` group, stepped after every optimiser step.

A schedule is called as `schedule(optimizer, clock)` and returns a torch scheduler (None: the
learning rate stays as the optimiser has it). The `Clock` says what a schedule may ask of the
run: its number of optimiser steps (Lightning's estimate, asked only by schedules that need it),
and, under dynamic pruning (lipt.dynamic), whose epochs differ in length, the share of training
done, counted in (fractional) epochs. A plain `torch.optim.lr_scheduler` class in the group (a
partial that takes the optimiser alone) is stepped once per epoch instead
(lipt.models.classifier.Classifier.configure_optimizers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import lightning as L
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LRScheduler, OneCycleLR


@dataclass(frozen=True)
class Clock:
    """What a schedule may ask of the fit it runs over."""

    total_steps: Callable[[], int]  # optimiser steps of the whole fit
    # The share of training done in [0, 1], after the current batch; set when epochs differ in
    # length (dynamic pruning), so a schedule runs over epochs instead of steps.
    progress: Callable[[], float] | None = None


Schedule = Callable[[Optimizer, Clock], LRScheduler | None]


def cosine(optimizer: Optimizer, clock: Clock) -> LRScheduler:
    """Cosine annealing to zero over the fit: per step (so short runs, one epoch or a jigsaw
    learner's few steps, still anneal), or over the share of epochs done (`clock.progress`)."""
    progress = clock.progress
    if progress is not None:
        return LambdaLR(optimizer, lambda _step: 0.5 * (1.0 + math.cos(math.pi * progress())))
    return CosineAnnealingLR(optimizer, T_max=max(1, int(clock.total_steps())))


def linear(optimizer: Optimizer, clock: Clock) -> LRScheduler:
    """Linear decay from the optimiser's learning rate to zero over the fit (per step, or over
    the share of epochs done): the schedule of budgeted training (Li, Yumer and Ramanan, ICLR
    2020, https://arxiv.org/abs/1905.04753), which beats step and cosine schedules at small
    budgets. Reaches zero on the budget's last step, wherever the budget ends."""
    progress = clock.progress
    if progress is not None:
        return LambdaLR(optimizer, lambda _step: max(0.0, 1.0 - progress()))
    total = max(1, int(clock.total_steps()))
    # LambdaLR calls the factor with the steps taken so far: 1 before the first, 0 after the last.
    return LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / total))


def constant(optimizer: Optimizer, clock: Clock) -> None:
    """No schedule: the optimiser's learning rate throughout."""
    return None


def one_cycle(
    optimizer: Optimizer,
    clock: Clock,
    pct_start: float = 0.3,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
    anneal_strategy: Literal["cos", "linear"] = "cos",
    cycle_momentum: bool = True,
) -> LRScheduler:
    """The 1cycle policy (Smith and Topin, 2017) peaking at the optimiser's learning rate:
    torch's OneCycleLR over the fit's steps. Over epochs of varying length (`clock.progress`)
    the same learning-rate curve runs over the share of training done, and momentum is not
    cycled."""
    if not 0 <= pct_start <= 1:
        raise ValueError(f"pct_start must be in [0, 1], not {pct_start}")
    if anneal_strategy not in ("cos", "linear"):
        raise ValueError(f"anneal_strategy must be 'cos' or 'linear', not {anneal_strategy!r}")
    if div_factor <= 0 or final_div_factor <= 0:
        raise ValueError("div_factor and final_div_factor must be positive")
    progress = clock.progress
    if progress is None:
        return _OneCycle(
            optimizer,
            max_lr=[group["lr"] for group in optimizer.param_groups],
            total_steps=max(1, int(clock.total_steps())),
            pct_start=pct_start,
            anneal_strategy=anneal_strategy,
            cycle_momentum=cycle_momentum,
            div_factor=div_factor,
            final_div_factor=final_div_factor,
        )
    start, end = 1.0 / div_factor, 1.0 / (div_factor * final_div_factor)

    def factor(_step: int) -> float:
        done = min(1.0, max(0.0, progress()))
        if done < pct_start:
            return _anneal(start, 1.0, done / pct_start, anneal_strategy)
        rest = 1.0 - pct_start
        return _anneal(1.0, end, (done - pct_start) / rest if rest > 0 else 1.0, anneal_strategy)

    return LambdaLR(optimizer, factor)


class _OneCycle(OneCycleLR):
    """torch's OneCycleLR, where a phase of no steps is done at once rather than divided by
    zero: the warm-up when pct_start x total_steps is 1 (0.1 of 10 steps), the annealing when
    pct_start is 1 (torch failed there after the fit's last step). Every other step's learning
    rate and momentum are torch's own."""

    def get_lr(self) -> list[float | Tensor]:
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"stepped {step} times, past the {self.total_steps} total steps")
        lrs: list[float | Tensor] = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == len(self._schedule_phases) - 1:
                    share = (step - start) / (end - start) if end != start else 1.0
                    lrs.append(
                        self._anneal_func(group[phase["start_lr"]], group[phase["end_lr"]], share)
                    )
                    if self.cycle_momentum:
                        momentum = self._anneal_func(
                            group[phase["start_momentum"]], group[phase["end_momentum"]], share
                        )
                        if self.use_beta1:
                            group["betas"] = (momentum, *group["betas"][1:])
                        else:
                            group["momentum"] = momentum
                    break
                start = end
        return lrs


def _anneal(begin: float, finish: float, share: float, strategy: str) -> float:
    if strategy == "linear":
        return begin + (finish - begin) * share
    return finish + (begin - finish) * 0.5 * (1.0 + math.cos(math.pi * share))


def is_torch_scheduler(make: Callable[..., object]) -> bool:
    """Whether a `scheduler` option names a torch.optim.lr_scheduler class (a partial of it),
    called with the optimiser alone and stepped once per epoch, rather than a Schedule."""
    target = getattr(make, "func", make)
    return isinstance(target, type) and issubclass(target, LRScheduler)


# The schedules a jigsaw learner names in `pretrain.optim.scheduler`.
LEARNER_SCHEDULES: dict[str, Schedule] = {"cosine": cosine, "linear": linear, "constant": constant}


class StopAtStep(L.Callback):
    """Ends the fit once `steps` optimiser steps are done (the Trainer's global_step: one per
    `accumulate_grad_batches` batches, every process's together, as lipt.budget counts them): a
    step budget that a schedule spans (budget=full_schedule, full_steps), mid-epoch too.
    Lightning's `max_steps` is not used: a fit resumed from an epoch's end would stop an epoch
    short."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.steps:
            trainer.should_stop = True
