"""Re-selection during main training (lipt.selection.reselection): each epoch trains on the
subset in force, in a resumed fit too; a resumed run takes up only its own re-selected subsets;
a fit bounded by max_steps alone re-selects."""

from __future__ import annotations

import logging
import os
import signal
import time
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn
from torch.utils.data import TensorDataset

import lipt
from lipt.core.artifacts import load_subset, save_subset
from lipt.data.seen import load_seen
from lipt.selection.reselection import latest_subset
from tests.helpers import FAST, run_entry, start_entry

POOL, ROWS = 300, 20  # every subset: 20 rows of a 300-row pool, 4 batches of 5
X = torch.randn(POOL, 4, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 2, (POOL,), generator=torch.Generator().manual_seed(1))
INITIAL = torch.arange(ROWS)


class KilledError(Exception):
    """A run killed mid-epoch."""


class Recorder(L.LightningModule):
    """Records the pool positions each epoch trains on; raises at epoch `crash_at` (a run
    killed there, its last checkpoint the previous epoch's)."""

    def __init__(self, crash_at: int | None = None) -> None:
        super().__init__()
        self.classifier = nn.Linear(4, 2)
        self.crash_at = crash_at
        self.seen: dict[int, set[int]] = {}

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        if self.current_epoch == self.crash_at:
            raise KilledError
        self.seen.setdefault(self.current_epoch, set()).update(batch[2].tolist())
        return nn.functional.cross_entropy(self.classifier(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), 0.1)


def rows_from(offset: int):
    """A Chooser: the re-selection after E epochs picks rows offset + 20 E .. + 20."""

    def choose(module: nn.Module, epoch: int, profile: dict[str, float]) -> tuple[Tensor, Tensor]:
        start = offset + ROWS * epoch
        return torch.arange(start, start + ROWS), torch.ones(ROWS)

    return choose


def fit(
    out: Path,
    every: int,
    epochs: int,
    *,
    offset: int = 0,
    initial: Tensor = INITIAL,
    crash_at: int | None = None,
    resume: bool = False,
    **trainer_args,
) -> tuple[Recorder, lipt.Reselection]:
    """A fit as train.py's: the initial subset in out/subset.npz, re-selected every `every`
    epochs into out/subsets, one rolling checkpoint; resumed, the subset in force taken from
    latest_subset."""
    warnings.filterwarnings("ignore", module="lightning")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    # resident: each epoch's order comes from the seed and the epoch, so a resumed fit can end
    # bit for bit where the uninterrupted one does
    data = lipt.PoolDataModule(TensorDataset(X, Y), batch_size=5, val_size=0, resident=True)
    saved = out / "subset.npz"
    ckpt = out / "checkpoints" / "last.ckpt"
    if not resume:
        save_subset(saved, initial, torch.ones(len(initial)), {})
    completed = torch.load(ckpt, weights_only=True)["epoch"] + 1 if resume else 0
    indices, weights, _ = load_subset(
        latest_subset(out, completed, every, load_subset(saved)[0]) or saved
    )
    data.set_subset(indices, weights)
    torch.manual_seed(0)  # the same initial weights in every fit
    module = Recorder(crash_at)
    reselect = lipt.Reselection(every, data, choose=rows_from(offset), out_dir=out)
    checkpoints = ModelCheckpoint(dirpath=out / "checkpoints", filename="last")
    trainer = L.Trainer(
        max_epochs=epochs,
        callbacks=[reselect, checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        **trainer_args,
    )
    try:
        trainer.fit(module, datamodule=data, ckpt_path=ckpt if resume else None)
    except KilledError:
        assert crash_at is not None
    return module, reselect


def in_force(epoch: int, every: int, offset: int = 0) -> set[int]:
    """The rows epoch `epoch` must train on: the last re-selection's, else the initial."""
    last = every * (epoch // every)
    start = 0 if last == 0 else offset + ROWS * last
    return set(range(start, start + ROWS))


@pytest.mark.parametrize("crash_at", [2, 3])  # its checkpoint: after epoch 1 or 2
def test_a_resumed_fit_trains_each_epoch_on_the_subset_in_force(tmp_path, crash_at):
    clean, _ = fit(tmp_path / "clean", 2, 7)
    assert clean.seen == {e: in_force(e, 2) for e in range(7)}  # re-selected after 2, 4, 6
    out = tmp_path / "killed"
    killed, _ = fit(out, 2, 7, crash_at=crash_at)
    assert sorted(killed.seen) == list(range(crash_at))
    resumed, reselect = fit(out, 2, 7, resume=True)
    # Lightning counts the epochs to a loader reload from the epoch a resumed fit starts at:
    # every epoch after a re-selection must train on it all the same.
    assert resumed.seen == {e: in_force(e, 2) for e in range(crash_at, 7)}
    assert reselect.reselections == 3  # the checkpoint carried those of the killed attempt
    assert (
        latest_subset(out, 7, 2, load_subset(out / "subset.npz")[0])
        == out / "subsets" / "epoch_6.npz"
    )
    # bit for bit where the uninterrupted fit ends
    weights = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    clean_weights = torch.load(tmp_path / "clean" / "checkpoints" / "last.ckpt", weights_only=True)[
        "state_dict"
    ]
    assert all(torch.equal(weights[k], clean_weights[k]) for k in clean_weights)


def test_the_reload_period_is_the_trainers_own_outside_the_forced_reload(tmp_path):
    # reload_dataloaders_every_n_epochs=2, re-selection every 4: the loader is rebuilt every 2
    # epochs as asked, and the period is back at 2 when the fit ends.
    module, reselect = fit(tmp_path, 4, 6, reload_dataloaders_every_n_epochs=2)
    assert module.seen == {e: in_force(e, 4) for e in range(6)}
    assert reselect.reload_period is None and module.trainer.reload_dataloaders_every_n_epochs == 2


def test_a_resumed_run_takes_up_only_its_own_reselections(tmp_path):
    # Run A re-selected every epoch (rows from 100 on) and left subsets/epoch_1..3.npz; run B
    # starts afresh in the same folder.
    fit(tmp_path, 1, 4, offset=100)
    subsets = tmp_path / "subsets"
    assert sorted(p.name for p in subsets.glob("*.npz")) == [f"epoch_{e}.npz" for e in (1, 2, 3)]
    saved = tmp_path / "subset.npz"
    # B never re-selects: none of A's subsets is its own
    assert latest_subset(tmp_path, 3, 0, load_subset(saved)[0]) is None
    # B re-selects every epoch too, from another first subset, killed before its first
    # re-selection: A's do not replace B's first subset
    fit(tmp_path, 1, 4, initial=torch.arange(20, 40), crash_at=0)
    assert latest_subset(tmp_path, 3, 1, load_subset(saved)[0]) is None
    # B from the same first subset, re-selecting every 2: its epoch_2 replaced A's, epoch_3 is
    # A's; after 3 epochs B's own epoch_2 is in force
    fit(tmp_path, 2, 4, crash_at=3)
    assert latest_subset(tmp_path, 3, 2, load_subset(saved)[0]) == subsets / "epoch_2.npz"
    assert set(load_subset(subsets / "epoch_2.npz")[0].tolist()) == in_force(2, 2)
    # the same files read as A's: A's chain is broken at B's epoch_2
    assert latest_subset(tmp_path, 3, 1, load_subset(saved)[0]) == subsets / "epoch_1.npz"


def test_reselections_written_before_files_named_their_run_are_taken_up(tmp_path):
    # a run resumed across the upgrade: its subset files have no record of whose they are
    saved = tmp_path / "subset.npz"
    save_subset(saved, INITIAL, torch.ones(ROWS), {})
    for epoch in (1, 2):
        rows = torch.arange(ROWS * epoch, ROWS * epoch + ROWS)
        save_subset(tmp_path / "subsets" / f"epoch_{epoch}.npz", rows, torch.ones(ROWS), {})
    assert (
        latest_subset(tmp_path, 3, 2, load_subset(saved)[0]) == tmp_path / "subsets" / "epoch_2.npz"
    )
    assert (
        latest_subset(tmp_path, 1, 2, load_subset(saved)[0]) is None
    )  # epoch_1 is no multiple of 2
    assert latest_subset(tmp_path, 3, 0, load_subset(saved)[0]) is None


def test_a_fit_bounded_by_max_steps_alone_reselects(tmp_path):
    # 4 steps an epoch, 20 steps: 5 epochs; Lightning sets max_epochs to -1
    module, reselect = fit(tmp_path, 1, -1, max_steps=20)
    assert module.trainer.max_epochs == -1 and sorted(module.seen) == list(range(5))
    assert reselect.reselections == 4  # after epochs 1..4, none after the last step
    assert module.seen == {e: in_force(e, 1) for e in range(5)}


@pytest.mark.slow
def test_train_py_resumed_at_an_odd_epoch_trains_each_epoch_on_the_subset_in_force(tmp_path):
    """train.py at a constant learning rate (no schedule builds the loader before the
    checkpoint is restored), re-selecting every 2 epochs, killed once epoch 1 is checkpointed
    (the resumed fit counts its loader reloads from there), resumed: every epoch feeds the
    subset in force, as the uninterrupted run's do, and it ends with the same weights."""
    run_dir = tmp_path / "run"
    args = [
        *[o for o in FAST if not o.startswith(("trainer.max_epochs", "budget="))],
        "dataset.num_train=3000",  # epochs long enough for the kill to land at epoch 1
        "dataset.image_size=28",
        "model.width=16",
        "fraction=0.5",
        "selector=random",
        "budget=subset",
        "reselect_every=2",
        # 4 epochs: resumed after epoch 1, epoch 2 re-selects and epoch 3 keeps its subset,
        # as 6 would show again at 4 and 5
        "trainer.max_epochs=4",
        "scheduler=constant",
        "record_seen=true",
    ]
    last = run_dir / "checkpoints" / "last.ckpt"
    proc = start_entry("train.py", [*args, f"hydra.run.dir={run_dir}"])
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if last.is_file() and torch.load(last, weights_only=True)["epoch"] >= 1:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "training finished before it could be killed"
    finally:
        if proc.poll() is None:  # SIGKILL: no clean-up, as a crash or a pre-emption
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    killed_at = torch.load(last, weights_only=True)["epoch"]
    out = run_entry("train.py", [*args, f"hydra.run.dir={run_dir}", "ckpt_path=last"])
    assert out.returncode == 0, out.stderr[-3000:]
    clean = tmp_path / "clean"
    out = run_entry("train.py", [*args, f"hydra.run.dir={clean}"])
    assert out.returncode == 0, out.stderr[-3000:]
    for folder in (run_dir, clean):
        for epoch in range(4):
            last_reselection = 2 * (epoch // 2)
            path = folder / "subsets" / f"epoch_{last_reselection}.npz"
            want = load_subset(path if last_reselection else folder / "subset.npz")[0]
            fed = load_seen(folder, epoch)[0]
            assert np.array_equal(np.sort(fed), want.numpy()), (folder.name, epoch, killed_at)
    weights = torch.load(last, weights_only=True)["state_dict"]
    clean_weights = torch.load(clean / "checkpoints" / "last.ckpt", weights_only=True)
    assert all(torch.equal(weights[k], clean_weights["state_dict"][k]) for k in weights)
