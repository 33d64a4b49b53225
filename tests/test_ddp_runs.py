"""Main training on two CPU processes (Lightning DDP, gloo) as a user runs it: the evaluation
splits each item counted once on the DataLoader path, a resume after an attempt on one device
that saved nothing, and an extra rank that reads rank 0's subset, not an earlier run's."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from lipt.core.artifacts import save_subset
from lipt.run.config import run_of
from lipt.stages import training_set
from lipt.stages.build import build_parts, build_trainer, quiet_trainer
from lipt.stages.resume import Resume
from lipt.stages.select import SUBSET_FILE, subset_meta
from lipt.stages.training_set import obtain_subset
from tests.helpers import FAST, ROOT, acting_on_first_refusal, run_entry

# Sizes two ranks do not divide: Lightning's DistributedSampler padded each rank's part.
VAL, TEST = 101, 201


class Recorder(L.LightningModule):
    """Trains one weight on a batch; records the item positions each evaluation step sees."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.seen: dict[str, list[int]] = {"val": [], "test": []}

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        return (self.weight * batch[0].float().mean()) ** 2

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self.seen["val"] += batch[2].tolist()

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self.seen["test"] += batch[2].tolist()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def lipt_data() -> L.LightningDataModule:
    from lipt.data import DataModule
    from lipt.data.sources import make_synthetic

    load = functools.partial(make_synthetic, 600, TEST, 4, 1, 12, 0)
    dm = DataModule(load, 4, 1, 12, [0.5], [0.25], val_size=VAL, batch_size=32, resident=False)
    dm.setup()
    return dm


def pool_data() -> L.LightningDataModule:
    from lipt.data import PoolDataModule

    g = torch.Generator().manual_seed(0)
    items = TensorDataset(torch.rand(600, 3, generator=g), torch.randint(0, 4, (600,), generator=g))
    return PoolDataModule(items, val_size=VAL, batch_size=32)


def ddp_main(out: Path) -> None:
    """Each of two ranks fits and tests on both data modules' DataLoader paths and writes the
    positions its validation and test steps saw."""
    for name, data in (("lipt", lipt_data()), ("pool", pool_data())):
        module = Recorder()
        trainer = L.Trainer(
            max_epochs=1,
            limit_train_batches=1,
            num_sanity_val_steps=0,
            accelerator="cpu",
            devices=2,
            strategy="ddp",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module, datamodule=data)
        if name == "lipt":  # the pool module has no test split
            trainer.test(module, datamodule=data, verbose=False)
        (out / f"{name}.rank{trainer.global_rank}.json").write_text(json.dumps(module.seen))


@pytest.mark.slow
@pytest.mark.ddp
def test_every_rank_evaluates_each_item_once_on_the_dataloader_path(tmp_path):
    """Lightning's DistributedSampler padded a split the ranks do not divide, so that
    summary.json's val_accuracy and test_accuracy counted an item twice (test 80/202 of a
    201-image split); the resident path evaluates everything on every rank, and so does the
    DataLoader path now."""
    env = {"PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    done = run_entry(str(Path(__file__)), [str(tmp_path)], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lipt, pool = lipt_data(), pool_data()
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"lipt.rank{rank}.json").read_text())
        assert seen["val"] == lipt.val_indices.tolist()  # each once, in order
        assert seen["test"] == list(range(TEST))
        seen = json.loads((tmp_path / f"pool.rank{rank}.json").read_text())
        assert seen["val"] == pool.val_indices.tolist()


@pytest.mark.slow
@pytest.mark.ddp
def test_two_processes_resume_a_run_that_saved_nothing_on_one(tmp_path):
    """`ckpt_path=last` on two devices after an attempt on one that was killed before it saved
    anything: rank 0 starts over, and so does its extra rank (it refused the run, its own log
    being new: "ckpt_path=last but .../last.ckpt does not exist")."""
    out = tmp_path / "run"
    out.mkdir()
    earlier = time.strftime("[%Y-%m-%d %H:%M:%S,000]", time.localtime(time.time() - 600))
    (out / "train.log").write_text(f"{earlier}[lipt.stages.train][INFO] - training: ...\n")
    args = [*FAST, "budget=full", "trainer=ddp", "trainer.accelerator=cpu", "ckpt_path=last"]
    done = run_entry("train.py", [*args, f"hydra.run.dir={out}"], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "starting over" in done.stdout
    assert json.loads((out / "summary.json").read_text())["stages"]["train"]["samples"] == 500


@pytest.mark.parametrize(
    ("this", "earlier"),
    [
        (["fraction=0.2"], ["fraction=0.4"]),  # another fraction
        # the same fraction drawn from another pool: label cleaning, one way or the other
        (["fraction=0.2", "clean=none"], ["fraction=0.2", "clean=lipt"]),
        (["fraction=0.2", "clean=lipt"], ["fraction=0.2", "clean=none"]),
    ],
)
def test_an_extra_rank_waits_for_this_runs_subset_not_an_earlier_runs(
    make_cfg, tmp_path, monkeypatch, this, earlier
):
    """srun starts every task with rank 0: in a folder an earlier run of other settings left
    its subset.npz in, the extra rank trained on that one while rank 0 selected anew."""
    selection = [*FAST, "selector=random", "budget=subset"]
    run = run_of(make_cfg([*selection, *this]))
    parts = build_parts(run)
    dm, out = parts.dm, tmp_path / "run"
    out.mkdir()
    pool = dm.pool_indices
    earlier_meta = subset_meta(run_of(make_cfg([*selection, *earlier])), dm)
    save_subset(out / SUBSET_FILE, pool[:200], torch.ones(200), earlier_meta)
    chosen = pool[-100:]  # what rank 0 selects, written once the extra rank refused the earlier
    write = functools.partial(
        save_subset, out / SUBSET_FILE, chosen, torch.ones(100), subset_meta(run, dm)
    )
    refused: list[Path] = []  # the extra rank's check sees the earlier file first
    checked = acting_on_first_refusal(training_set.selected_for, write, refused)
    monkeypatch.setattr(training_set, "selected_for", checked)
    monkeypatch.setenv("SLURM_PROCID", "1")
    subset = obtain_subset(run, parts, out, Resume())
    assert refused == [out / SUBSET_FILE]  # it waited past the earlier run's subset
    assert subset.subset is not None and torch.equal(subset.subset[0], chosen)


def test_inner_stages_train_in_one_process_whatever_main_training_spans(make_cfg):
    """`trainer.num_nodes=2`: the jigsaw learners' trainer in rank 0 waited for a second process
    ("Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2") that never came, the other node's
    rank waiting for rank 0's subset."""
    nodes = ["trainer=ddp", "trainer.accelerator=cpu", "+trainer.num_nodes=2"]
    run = run_of(make_cfg([*FAST, *nodes]))
    assert build_trainer(run).world_size == 4  # main training: 2 devices on each of 2 nodes
    assert quiet_trainer(run).world_size == 1


def test_the_opening_line_counts_every_nodes_devices(make_cfg):
    """It said nothing of DDP on 2 nodes of 1 device, and 2 devices on 2 nodes of 2."""
    from lipt.stages.train import describe_training

    for nodes, devices in ((2, 1), (2, 2)):
        ddp = ["trainer=ddp", f"trainer.devices={devices}", f"+trainer.num_nodes={nodes}"]
        run = run_of(make_cfg([*FAST, *ddp, "trainer.accelerator=cpu"]))
        processes = build_trainer(run).world_size
        line = describe_training(run, 100, 500, 3, processes)
        assert line.endswith(f"from the initial model, {nodes * devices} devices (ddp)"), line


if __name__ == "__main__":
    ddp_main(Path(sys.argv[1]))
