"""The classifier and the schedules on what a researcher brings: a model of their own, a
warm-up phase of no steps."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import OneCycleLR
from torch.utils.data import TensorDataset

import lipt
from lipt.core.errors import UserError
from lipt.models.schedules import Clock, one_cycle


def _trace(schedule: OneCycleLR, optimizer: torch.optim.Optimizer, steps: int) -> list:
    """(lr, momentum, betas) before each step and after the last, as Lightning steps them."""
    trace = []
    for _ in range(steps):
        group = optimizer.param_groups[0]
        trace.append((group["lr"], group.get("momentum"), group.get("betas")))
        optimizer.step()
        schedule.step()
    group = optimizer.param_groups[0]
    return [*trace, (group["lr"], group.get("momentum"), group.get("betas"))]


def _optimizer(kind: str) -> torch.optim.Optimizer:
    parameter = nn.Parameter(torch.zeros(1))
    if kind == "sgd":
        return torch.optim.SGD([parameter], lr=0.1, momentum=0.9)
    return torch.optim.AdamW([parameter], lr=0.1)


@pytest.mark.parametrize(("steps", "pct_start"), [(10, 0.1), (5, 0.2), (4, 0.25), (10, 1.0)])
def test_one_cycle_with_a_phase_of_no_steps_runs_to_its_end(steps, pct_start):
    """pct_start x steps = 1 (the warm-up ends at step 0) divided by zero when the schedule was
    made (`scheduler.pct_start=0.1` was refused for any run), pct_start = 1 after the fit's last
    step, when the whole run had trained: each phase of no steps is done at once."""
    optimizer = _optimizer("sgd")
    schedule = one_cycle(optimizer, Clock(total_steps=lambda: steps), pct_start=pct_start)
    lrs = [lr for lr, _, _ in _trace(schedule, optimizer, steps)]
    if pct_start == 1.0:  # warms up over the whole run: the peak on the last step
        assert lrs[-2] == pytest.approx(0.1) and lrs[0] == pytest.approx(0.1 / 25)
    else:  # no warm-up: the peak at once, annealed to lr / (25 x 1e4) on the last step
        assert lrs[0] == pytest.approx(0.1) and lrs[steps - 1] == pytest.approx(0.1 / 25e4)
    rising = pct_start == 1.0
    assert all((a <= b) == rising for a, b in itertools.pairwise(lrs[:steps]))


def test_one_cycle_elsewhere_is_torchs_own_bit_for_bit():
    """Every schedule with phases of some steps: torch's OneCycleLR's learning rates and
    momenta (SGD's momentum, AdamW's beta1) at every step, exactly."""
    settings = itertools.product(
        [1, 2, 3, 7, 48], [0.0, 0.05, 0.3, 0.5, 0.999], ["cos", "linear"], ["sgd", "adamw"]
    )
    for steps, pct_start, strategy, kind in settings:
        if pct_start * steps == 1:
            continue  # a warm-up of no steps: torch's divides by zero
        ours, torchs = _optimizer(kind), _optimizer(kind)
        mine = one_cycle(
            ours, Clock(total_steps=lambda s=steps: s), pct_start, anneal_strategy=strategy
        )
        theirs = OneCycleLR(
            torchs, [0.1], total_steps=steps, pct_start=pct_start, anneal_strategy=strategy
        )
        assert _trace(mine, ours, steps) == _trace(theirs, torchs, steps), (steps, pct_start)


def _fit(net: nn.Module, num_classes: int) -> lipt.Classifier:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, 8, generator=gen), torch.randint(0, 3, (256,), generator=gen)
    module = lipt.Classifier(net, num_classes)
    data = lipt.PoolDataModule(TensorDataset(x, y), batch_size=64, val_size=64)
    _one_epoch_trainer(num_sanity_val_steps=0).fit(module, datamodule=data)
    return module


class _Features(nn.Module):
    """A model whose forward gives (logits, features), as many do."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x).relu()
        return self.head(h), h


@pytest.mark.parametrize(
    ("net", "classes", "said"),
    [
        (_Features(), 3, "gave a tuple"),
        (nn.Linear(8, 5), 3, r"shape \(64, 5\) for a batch of 64, not the logits \[batch, 3\]"),
        (nn.Linear(8, 3), 10, r"shape \(64, 3\) for a batch of 64, not the logits \[batch, 10\]"),
    ],
)
def test_classifier_refuses_a_forward_without_the_logits_at_the_first_batch(net, classes, said):
    """A forward that gives a tuple failed in cross-entropy with a traceback; logits of other
    classes than num_classes trained a whole epoch, then failed in torchmetrics' words. Both
    are one line at the first training batch, naming what the forward gave."""
    with pytest.raises(UserError, match=said) as refused:
        _fit(net, classes)
    assert "\n" not in str(refused.value)
    # raised by the first training step, before its backward pass
    weight = net.head.weight if isinstance(net, _Features) else net.weight
    assert weight.grad is None


def test_classifier_trains_a_model_of_its_own_classes_as_before():
    torch.manual_seed(0)
    module = _fit(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)), 3)
    assert module.samples_seen == 192


@pytest.mark.parametrize(("mode", "metric"), [("min", "val/loss"), ("max", "val/acc")])
def test_reduce_on_plateau_steps_on_the_validation_metric_of_its_mode(mode, metric):
    """torch's ReduceLROnPlateau, a scheduler class of torch.optim.lr_scheduler as the
    `scheduler` group takes them, stopped the fit at its start (Lightning asks for a metric to
    watch): it watches the validation loss (mode min) or accuracy (max) each epoch."""
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, 8, generator=gen), torch.randint(0, 3, (256,), generator=gen)
    plateau = functools.partial(ReduceLROnPlateau, mode=mode, patience=0)
    module = lipt.Classifier(nn.Linear(8, 3), 3, scheduler=plateau)
    data = lipt.PoolDataModule(TensorDataset(x, y), batch_size=64, val_size=64)
    trainer = _one_epoch_trainer()
    trainer.fit(module, datamodule=data)
    schedule = trainer.lr_scheduler_configs[0].scheduler
    assert isinstance(schedule, ReduceLROnPlateau)
    assert schedule.best == pytest.approx(float(trainer.callback_metrics[metric]))


class _TwoInputs(nn.Module):
    """A model of two inputs, which the data set gives as one (a, b) pair per item."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        return self.a(x[0]) + self.b(x[1])


class _Pairs(torch.utils.data.Dataset):
    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(128, 8, generator=gen), torch.randint(0, 3, (128,))

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
        return (self.x[i, :4], self.x[i, 4:]), int(self.y[i])


def test_classifier_trains_a_model_whose_input_is_not_one_tensor():
    """The logits are checked against the labels' count: an input of a pair of tensors (what a
    DataLoader makes of (a, b) items) trains and validates as before."""
    module = lipt.Classifier(_TwoInputs(), 3)
    data = lipt.PoolDataModule(_Pairs(), batch_size=32, val_size=32)
    trainer = _one_epoch_trainer()
    trainer.fit(module, datamodule=data)
    assert module.samples_seen == 96 and "val/acc" in trainer.callback_metrics


def test_train_py_takes_torchs_reduce_on_plateau_as_its_scheduler():
    """The config checks stepped every schedule without a metric: ReduceLROnPlateau, which
    steps on one, was refused ("step() missing ... 'metrics'") though the Classifier runs it."""
    from lipt.run.precheck import precheck

    plateau = [
        "scheduler._target_=torch.optim.lr_scheduler.ReduceLROnPlateau",
        "+scheduler.mode=max",
    ]
    assert precheck("train", [*plateau], False) is None


def _one_epoch_trainer(**options: Any) -> L.Trainer:
    """One epoch on the CPU, with nothing written and nothing drawn."""
    return L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **options,
    )
