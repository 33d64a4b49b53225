"""Main training end to end: summary.json and subset.npz as DESIGN.md specifies, every data
format, subsets from files, re-selection, and DDP on two CPU processes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lipt import select as select_stage
from lipt import train as train_stage
from lipt.build import build_datamodule
from lipt.errors import UserError
from tests.conftest import FAST, run_entry


def test_random_subset_run_writes_summary_and_subset(make_cfg, tmp_path):
    cfg = make_cfg([*FAST, "selector=random", "fraction=0.2", "trainer.max_epochs=2"])
    summary = train_stage.run(cfg)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["subset_size"] == summary["subset_size"] == 100  # 0.2 * (600 - 100)
    assert on_disk["train_size"] == 500 and on_disk["dataset_train_size"] == 600
    assert 0.0 <= on_disk["test_accuracy"] <= 1.0
    assert on_disk["stages"]["train"]["samples"] == 2 * 100
    assert on_disk["stages"]["train"]["unique_samples"] == 100
    assert "pretrain" not in on_disk["stages"]  # random needs no model: no pre-training ran
    assert on_disk["config"]["selector"]["name"] == "random"
    with np.load(tmp_path / "subset.npz") as data:
        indices, weights = data["indices"], data["weights"]
    assert indices.dtype == np.int64 and weights.dtype == np.float32
    dm = build_datamodule(cfg)
    assert len(np.unique(indices)) == 100
    assert np.isin(indices, dm.pool_indices.numpy()).all()  # positions in the original split
    assert not np.isin(indices, dm.val_indices.numpy()).any()


def test_full_selector_trains_on_the_whole_pool_and_learns(make_cfg, tmp_path):
    cfg = make_cfg([*FAST, "selector=full", "trainer.max_epochs=3", "optim.lr=0.05"])
    summary = train_stage.run(cfg)
    assert summary["subset_size"] == 500 and summary["stages"]["train"]["samples"] == 1500
    assert summary["test_accuracy"] > 0.6  # 4 well-separated classes: chance is 0.25
    assert not (tmp_path / "subset.npz").exists()


@pytest.mark.parametrize("fmt", ["fashion_mnist", "cifar10", "cifar100", "imagenet"])
def test_trains_on_each_on_disk_format(make_cfg, fmt, request):
    extra = {
        "fashion_mnist": ["dataset.val_size=50"],
        "cifar10": ["dataset.val_size=20", "dataset.num_workers=0"],
        "cifar100": ["dataset.val_size=50", "dataset.num_workers=0"],
        "imagenet": [
            "dataset.val_size=9",
            "dataset.num_workers=0",
            "dataset.num_classes=3",
            "dataset.image_size=32",
            "dataset.resize=36",
            "dataset.crop_padding=4",
        ],
    }[fmt]
    fixture = {
        "fashion_mnist": "fashion_mnist_dir",
        "cifar10": "cifar10_dir",
        "cifar100": "cifar100_dir",
        "imagenet": "imagefolder_dir",
    }[fmt]
    data_dir = request.getfixturevalue(fixture)
    fast = [o for o in FAST if not o.startswith("dataset=")]
    cfg = make_cfg(
        [
            *fast,
            f"dataset={fmt}",
            f"dataset.data_dir={data_dir}",
            *extra,
            "selector=el2n",
            "fraction=0.5",
        ]
    )
    summary = train_stage.run(cfg)
    assert summary["subset_size"] == round(0.5 * summary["train_size"])
    assert summary["test_accuracy"] is not None


def test_train_on_a_saved_subset_and_refuse_one_for_other_data(make_cfg, tmp_path):
    cfg = make_cfg([*FAST, "selector=el2n", "fraction=0.1"], config_name="select")
    select_stage.run(cfg)
    saved = tmp_path / "subset.npz"
    with np.load(saved) as data:
        chosen = data["indices"].copy()
    run2 = tmp_path / "second"
    cfg2 = make_cfg([*FAST, f"subset_path={saved}", f"paths.output_dir={run2}"])
    summary = train_stage.run(cfg2)
    assert summary["subset_size"] == len(chosen)
    assert "select" not in summary["stages"]
    other = make_cfg(
        [*FAST, f"subset_path={saved}", f"paths.output_dir={run2}", "dataset.num_train=700"]
    )
    with pytest.raises(UserError, match="made for"):
        train_stage.run(other)


def test_reselection_changes_the_subset_and_counts_unique_samples(make_cfg, tmp_path):
    cfg = make_cfg(
        [*FAST, "selector=el2n", "fraction=0.2", "reselect_every=1", "trainer.max_epochs=3"]
    )
    summary = train_stage.run(cfg)
    train = summary["stages"]["train"]
    assert train["reselections"] == 2 and train["samples"] == 3 * 100
    first = np.load(tmp_path / "subset.npz")["indices"]
    later = np.load(tmp_path / "subsets" / "epoch_1.npz")["indices"]
    assert len(later) == 100 and not np.array_equal(first, later)
    union = set(first) | set(later) | set(np.load(tmp_path / "subsets" / "epoch_2.npz")["indices"])
    assert train["unique_samples"] == len(union)


def test_init_from_pretrained_starts_main_training_from_the_warm_model(make_cfg):
    cfg = make_cfg(
        [*FAST, "selector=el2n", "pretrain=full", "pretrain.epochs=1", "init_from=pretrained"]
    )
    summary = train_stage.run(cfg)
    assert summary["stages"]["pretrain"]["samples"] == 500
    with pytest.raises(UserError, match="init_from=pretrained"):
        train_stage.run(make_cfg([*FAST, "selector=el2n", "init_from=pretrained"]))


@pytest.mark.ddp
def test_ddp_two_cpu_processes_share_one_subset(tmp_path):
    run_dir = tmp_path / "run"
    out = run_entry(
        "train.py",
        [
            *FAST,
            "selector=el2n",
            "fraction=0.4",
            "trainer.max_epochs=3",
            "reselect_every=1",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.strategy=ddp",
            f"hydra.run.dir={run_dir}",
        ],
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # each rank trained on its own half of the 200-sample subset: 3 epochs * 200 in total
    assert summary["stages"]["train"]["samples"] == 3 * 200
    assert summary["stages"]["train"]["reselections"] == 2
    for epoch in (1, 2):
        digests = {
            (run_dir / "subsets" / f"epoch_{epoch}.rank{r}.sha256").read_text() for r in (0, 1)
        }
        assert len(digests) == 1  # both ranks train on the same re-selected subset
    # selection ran once (rank 0): only one subset file per epoch, one summary
    assert sorted(p.name for p in (run_dir / "subsets").glob("*.npz")) == [
        "epoch_1.npz",
        "epoch_2.npz",
    ]
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3 * 4  # 3 epochs of ceil(100 / 32) steps per rank
