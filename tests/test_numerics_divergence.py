"""Training whose numbers go wrong: a diverging main training, dynamic pruning fed NaN losses,
and NaN inputs in the Python API. Each must end in one line saying what happened, never train on
NaN weights and write their accuracy down as the run's result."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import lipt
from lipt.core.errors import UserError
from lipt.models.classifier import QUIET_TRAINER, Classifier, DivergedError
from tests.helpers import run_entry

# On the CPU, where the loss is checked every step: on an accelerator it is checked every
# trainer.log_every_n_steps steps (Classifier.checks_loss_now), so a run there stops at the
# epoch's end with "a weight became NaN or infinite" instead.
DIVERGING = [
    "dataset=synthetic",
    "trainer.accelerator=cpu",
    "model.width=8",
    "pretrain=none",
    "selector=random",
    "budget=subset",
    "fraction=0.5",
    "batch_size=32",
    "logger=none",
    "callbacks=none",
    "trainer.max_epochs=3",
    "optimizer.lr=1e10",
]


def test_main_training_that_diverges_stops_in_one_line_and_writes_no_result(tmp_path: Path):
    run = tmp_path / "run"
    done = run_entry("train.py", [*DIVERGING, f"hydra.run.dir={run}"])
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training diverged: the loss became nan at step "), last
    assert "lower the learning rate (optimizer.lr" in last
    # No accuracy of NaN weights is written down as the run's result.
    assert not (run / "summary.json").exists()
    for ckpt in (run / "checkpoints").glob("*.ckpt"):
        state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
        assert all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())


def blobs(n: int = 1200, dim: int = 16, classes: int = 4) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % classes
    centres = torch.randn(classes, dim, generator=g) * 3
    return TensorDataset(centres[y] + torch.randn(n, dim, generator=g), y)


def net(dim: int = 16, classes: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, classes))


def quiet_trainer(**kwargs) -> L.Trainer:
    """On the CPU, where Classifier checks every step's loss (see DIVERGING)."""
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_classifier_stops_before_the_step_that_would_train_on_a_nan_loss():
    data = lipt.PoolDataModule(blobs(), batch_size=100)
    sgd = lambda params: torch.optim.SGD(params, lr=1e12)  # noqa: E731
    module = Classifier(net(), 4, optimizer=sgd)
    with pytest.raises(DivergedError, match=r"^training diverged: the loss became (nan|inf) "):
        quiet_trainer(max_epochs=3).fit(module, datamodule=data)
    # It diverged, and was stopped before any NaN loss reached the weights.
    assert 0 < module.samples_seen < 3 * 1200
    assert all(bool(torch.isfinite(p).all()) for p in module.parameters())


class Own(L.LightningModule):
    """A user's module, as README's example: per-sample losses through lipt.weighted_loss."""

    def __init__(self, lr: float) -> None:
        super().__init__()
        self.net, self.lr, self.last_losses = net(), lr, None

    def training_step(self, batch, batch_idx):
        x, y, _, w = batch
        losses = F.cross_entropy(self.net(x), y, reduction="none")
        return lipt.weighted_loss(self, losses, w, norm="batch")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


@pytest.mark.parametrize("method", [lipt.InfoBatch(ratio=0.5), lipt.LiptBudget(0.5)])
def test_dynamic_pruning_refuses_to_plan_on_nan_losses(method):
    # Unchecked, InfoBatch compared with a NaN mean and pruned nothing; LiptBudget's draw failed in
    # torch.multinomial with a traceback.
    data = lipt.PoolDataModule(blobs(), batch_size=100)
    pruning = lipt.DynamicPruning(method, data)
    with pytest.raises(
        UserError,
        match=r"^dynamic pruning: the training loss of \d+ of 1200 pool items is NaN or "
        r"infinite before epoch 1 \(data set position \d+ first\): training diverged",
    ):
        quiet_trainer(max_epochs=3, callbacks=[pruning]).fit(Own(1e12), datamodule=data)
    assert list(pruning.pruned_share) == ["0"]  # no epoch trained on a plan of NaN scores


def test_dynamic_pruning_on_finite_losses_plans_as_before():
    data = lipt.PoolDataModule(blobs(), batch_size=100)
    pruning = lipt.DynamicPruning(lipt.InfoBatch(ratio=0.5), data)
    quiet_trainer(max_epochs=3, callbacks=[pruning]).fit(Own(0.1), datamodule=data)
    assert pruning.pruned_share["1"] > 0  # epoch 1 pruned well-trained rows


def test_pool_data_module_refuses_nan_or_infinite_inputs_naming_the_items():
    x, y = blobs().tensors
    x = x.clone()
    x[700, 3], x[5, 0] = float("nan"), float("inf")
    with pytest.raises(
        ValueError,
        match=r"^train: the data's inputs are not finite \(NaN or inf\) in 2 item\(s\): 5, 700; "
        r"fix or drop those items",
    ):
        lipt.PoolDataModule(TensorDataset(x, y), batch_size=100)
    view = TensorDataset(x, y)
    with pytest.raises(ValueError, match=r"^eval_view: the data's inputs are not finite"):
        lipt.PoolDataModule(blobs(), eval_view=view, batch_size=100)
    lipt.PoolDataModule(TensorDataset(x.nan_to_num(posinf=0.0), y), batch_size=100)  # fixed


def test_an_epochs_last_update_that_breaks_the_weights_stops_before_the_epochs_end() -> None:
    """Every loss finite, the epoch's one update makes the weights NaN (lr 1e37): the fit
    stops before any epoch-end callback (re-selection, checkpoints) reads the model, and no
    test runs on it."""
    torch.manual_seed(0)
    x = torch.randn(64, 4) * 1e3
    y = (x[:, 0] > 0).long()
    loader = torch.utils.data.DataLoader(
        TensorDataset(x, y, torch.arange(64), torch.ones(64)), batch_size=64
    )
    seen: list[bool] = []

    class EpochEnd(L.Callback):  # as Reselection: it reads the model at the epoch's end
        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            seen.append(all(bool(p.isfinite().all()) for p in pl_module.parameters()))

    module = Classifier(
        nn.Linear(4, 2), 2, optimizer=lambda params: torch.optim.SGD(params, lr=1e37)
    )
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", callbacks=[EpochEnd()], **QUIET_TRAINER)
    with pytest.raises(DivergedError, match="a weight became NaN or infinite at step 1"):
        trainer.fit(module, loader)
    assert seen == []  # stopped before the epoch's end
