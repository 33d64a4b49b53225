"""Main training end to end: summary.json and subset.npz as docs/DESIGN.md ("Artifacts")
specifies, every data format, subsets from files, re-selection, and DDP on two CPU processes."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn

from lipt.budget import PoolSizes, WholePool
from lipt.core.errors import UserError
from lipt.data.seen import load_seen
from lipt.jigsaw.learner import state_dict_cpu
from lipt.models.classifier import Classifier
from lipt.run.config import run_of, validate
from lipt.stages import pretrain as pretrain_stage
from lipt.stages import select as select_stage
from lipt.stages import train as train_stage
from lipt.stages import training_plan as plan_stage
from lipt.stages.build import build_datamodule, build_model
from tests.helpers import FAST, run_entry


def test_random_subset_run_writes_summary_and_subset(make_cfg, tmp_path):
    cfg = make_cfg(
        [*FAST, "selector=random", "budget=subset", "fraction=0.2", "trainer.max_epochs=2"]
    )
    summary = train_stage.run(validate(cfg))
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
    dm = build_datamodule(run_of(cfg))
    assert len(np.unique(indices)) == 100
    assert np.isin(indices, dm.pool_indices.numpy()).all()  # positions in the original split
    assert not np.isin(indices, dm.val_indices.numpy()).any()


def test_the_full_budget_trains_on_the_whole_pool_and_learns(make_cfg, tmp_path):
    cfg = make_cfg(
        [*FAST, "budget=full", "trainer.max_epochs=3", "optimizer.lr=0.05", "record_seen=true"]
    )
    summary = train_stage.run(validate(cfg))
    assert summary["subset_size"] == 500 and summary["stages"]["train"]["samples"] == 1500
    pool = build_datamodule(run_of(cfg)).pool_indices.numpy()
    for epoch in range(3):  # every pool item once per epoch with weight 1, no validation item
        indices, weights = load_seen(tmp_path, epoch)
        assert np.array_equal(np.sort(indices), pool) and (weights == 1).all()
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
            "budget=subset",
            "fraction=0.5",
        ]
    )
    summary = train_stage.run(validate(cfg))
    assert summary["subset_size"] == round(0.5 * summary["train_size"])
    assert summary["test_accuracy"] is not None


def test_a_subset_ranked_by_a_checkpoint_is_labelled_with_its_pre_training(make_cfg, tmp_path):
    """select.py ckpt_path=...: the subset records the checkpoint's pre-training (a warm-up
    here), not the `pretrain` group's default, which did not run."""
    warm = tmp_path / "warm"
    pretrain = ["pretrain=full", "pretrain.epochs=1", f"paths.output_dir={warm}"]
    pretrain_stage.run(validate(make_cfg([*FAST, *pretrain], config_name="pretrain")))
    picks = [*FAST, "selector=el2n", "budget=subset", f"ckpt_path={warm / 'pretrain.ckpt'}"]
    select_stage.run(validate(make_cfg(picks, config_name="select")))  # FAST: pretrain=none
    with np.load(tmp_path / "subset.npz") as data:
        meta = json.loads(str(data["meta"]))
    assert meta["pretrain"] == "full"


def test_train_on_a_saved_subset_and_refuse_one_for_other_data(make_cfg, tmp_path):
    cfg = make_cfg([*FAST, "selector=el2n", "budget=subset", "fraction=0.1"], config_name="select")
    select_stage.run(validate(cfg))
    saved = tmp_path / "subset.npz"
    with np.load(saved) as data:
        chosen = data["indices"].copy()
    run2 = tmp_path / "second"
    cfg2 = make_cfg([*FAST, f"subset_path={saved}", f"paths.output_dir={run2}", "record_seen=true"])
    summary = train_stage.run(validate(cfg2))
    assert summary["subset_size"] == len(chosen)
    indices, _ = load_seen(run2, 0)
    assert np.array_equal(np.sort(indices), chosen)  # trained on the saved subset
    assert "select" not in summary["stages"]
    # The saved subset replaces FAST's budget=infobatch, its pruning and its epochs.
    assert summary["stages"]["train"].get("dynamic") is None
    assert summary["stages"]["train"]["samples"] == len(chosen)  # trainer.max_epochs=1
    other = make_cfg(
        [*FAST, f"subset_path={saved}", f"paths.output_dir={run2}", "dataset.num_train=700"]
    )
    with pytest.raises(UserError, match="made for"):
        train_stage.run(validate(other))


def _in_force(run_dir: Path, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """The subset file in force during 0-based `epoch`: the last re-selection made after K <= epoch
    completed epochs, else the initial subset.npz."""
    made = sorted(int(p.stem.split("_")[1]) for p in (run_dir / "subsets").glob("epoch_*.npz"))
    after = [k for k in made if k <= epoch]
    path = run_dir / "subsets" / f"epoch_{after[-1]}.npz" if after else run_dir / "subset.npz"
    with np.load(path) as data:
        return data["indices"], data["weights"]


def _assert_fed_exactly(indices: np.ndarray, weights: np.ndarray, run_dir: Path, epoch: int):
    """`indices`/`weights` (what the loader yielded in `epoch`) are the subset in force, each
    position once, each with its own weight from the subset file."""
    expected, expected_weights = _in_force(run_dir, epoch)
    assert np.array_equal(np.sort(indices), np.sort(expected)), epoch
    weight_of = dict(zip(expected.tolist(), expected_weights.tolist(), strict=True))
    assert np.array_equal(weights, np.array([weight_of[i] for i in indices.tolist()], np.float32))


class SimulatedCrashError(RuntimeError):
    pass


@pytest.mark.slow
def test_each_epoch_feeds_the_loss_the_subset_in_force_also_after_a_resume(
    make_cfg, tmp_path, monkeypatch
):
    # GradMatch: non-uniform weights, so a weight that reaches the wrong sample shows.
    args = [
        *FAST,
        "selector=gradmatch",
        "budget=subset",
        "fraction=0.2",
        "reselect_every=1",
        "trainer.max_epochs=4",
        "record_seen=true",
    ]
    real_step = Classifier.training_step

    def crash_in_epoch_2(self, batch, batch_idx):
        if self.current_epoch == 2 and batch_idx == 1:
            raise SimulatedCrashError("killed")  # after epochs 0 and 1 are checkpointed
        return real_step(self, batch, batch_idx)

    monkeypatch.setattr(Classifier, "training_step", crash_in_epoch_2)
    with pytest.raises(SimulatedCrashError):
        train_stage.run(validate(make_cfg(args)))
    monkeypatch.setattr(Classifier, "training_step", real_step)
    assert not (tmp_path / "seen" / "epoch_2.rank0.npz").exists()  # the crash lost epoch 2
    summary = train_stage.run(validate(make_cfg([*args, "ckpt_path=last"])))

    subsets = [_in_force(tmp_path, e)[0] for e in range(4)]
    # the test has teeth only if each re-selection changed the subset
    assert all(not np.array_equal(a, b) for a, b in pairwise(subsets))
    assert np.unique(_in_force(tmp_path, 0)[1]).size > 1  # non-uniform weights
    fed = []
    for epoch in range(4):  # 0: initial, 1: re-selected, 2 and 3: resumed (2 reloaded from disk)
        indices, weights = load_seen(tmp_path, epoch)
        _assert_fed_exactly(indices, weights, tmp_path, epoch)
        assert not np.array_equal(indices, np.sort(indices))  # the loader shuffles
        fed.append(indices)
    train = summary["stages"]["train"]
    assert train["samples"] == sum(len(f) for f in fed)
    assert train["unique_samples"] == len(set(np.concatenate(fed).tolist()))


def test_each_reselection_records_where_its_subset_sits(make_cfg, tmp_path):
    # EL2N keeps the rows the model being trained finds hardest: each re-selection's profile,
    # ranked by that model, must show the hard tail. Random ranks nothing and records none.
    args = [*FAST, "fraction=0.2", "reselect_every=1", "trainer.max_epochs=3"]
    logged = [o for o in args if o != "logger=none"]  # the default logger, csv
    train = train_stage.run(validate(make_cfg([*logged, "selector=el2n", "budget=subset"])))[
        "stages"
    ]["train"]
    profiles = train["reselect_profiles"]
    assert sorted(profiles) == ["1", "2"]  # after epochs 1 and 2, none after the last
    for profile in profiles.values():
        assert profile["difficulty_percentile"] > 0.75  # random: 0.5
        assert profile["coverage_distance"] > 0 and profile["random_coverage_distance"] > 0
    assert profiles["1"] != profiles["2"]  # each from its own model and subset
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["stages"]["train"]["reselect_profiles"] == profiles
    metrics = next((tmp_path / "csv").rglob("metrics.csv")).read_text().splitlines()[0]
    assert "stages/train/reselect_profiles/2/difficulty_percentile" in metrics.split(",")
    random_run = train_stage.run(validate(make_cfg([*args, "selector=random", "budget=subset"])))[
        "stages"
    ]["train"]
    assert random_run["reselections"] == 2 and "reselect_profiles" not in random_run


def test_loss_weights_each_sample_by_its_subset_weight():
    """A sample of weight k counts as k copies of it: the weighted loss of a batch equals the
    plain mean loss of the batch with each sample repeated k times."""
    torch.manual_seed(0)
    module = Classifier(nn.Sequential(nn.Flatten(), nn.Linear(144, 4)), num_classes=4)
    x, y = torch.randn(64, 1, 12, 12), torch.randint(0, 4, (64,))
    k = torch.randint(1, 4, (64,))
    loss = module.training_step((x, y, torch.arange(64), k.float()), 0)
    repeated = module.training_step(
        (
            x.repeat_interleave(k, 0),
            y.repeat_interleave(k),
            torch.arange(int(k.sum())),
            torch.ones(int(k.sum())),
        ),
        0,
    )
    torch.testing.assert_close(loss, repeated)
    unweighted = module.training_step((x, y, torch.arange(64), torch.ones(64)), 0)
    assert abs(float((loss - unweighted).detach())) > 1e-3  # the weights matter at this batch


class StartWeights(L.Callback):
    """The model's weights when main training's first step is about to run."""

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer, pl_module):
        self.state = state_dict_cpu(pl_module.model)


def _watch_main_training(monkeypatch) -> tuple[StartWeights, list]:
    start, pretrained = StartWeights(), []
    real_pretrain, real_trainer = pretrain_stage.pretrain_model, plan_stage.build_trainer

    def pretrain(*args, **kwargs):
        result = real_pretrain(*args, **kwargs)
        pretrained.append(state_dict_cpu(result.model))  # as pre-training left it
        return result

    def trainer(cfg, **kwargs):
        return real_trainer(cfg, **{**kwargs, "callbacks": [*kwargs["callbacks"], start]})

    monkeypatch.setattr(pretrain_stage, "pretrain_model", pretrain)
    monkeypatch.setattr(plan_stage, "build_trainer", trainer)
    return start, pretrained


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("init_from", ["pretrained", "init"])
def test_main_training_starts_from_the_pretrained_or_the_common_init(
    make_cfg, monkeypatch, init_from
):
    cfg = make_cfg(
        [
            *FAST,
            "selector=el2n",
            "budget=subset",
            "pretrain=full",
            "pretrain.epochs=1",
            f"init_from={init_from}",
        ]
    )
    start, pretrained = _watch_main_training(monkeypatch)
    summary = train_stage.run(validate(cfg))
    assert summary["stages"]["pretrain"]["samples"] == 500
    common_init = state_dict_cpu(build_model(run_of(cfg), int(cfg.seed)))
    assert len(pretrained) == 1 and not _same(pretrained[0], common_init)
    expected = pretrained[0] if init_from == "pretrained" else common_init
    assert _same(start.state, expected)


def test_init_from_pretrained_needs_a_pretrained_model(make_cfg):
    with pytest.raises(UserError, match="init_from=pretrained"):
        train_stage.run(
            validate(make_cfg([*FAST, "selector=el2n", "budget=subset", "init_from=pretrained"]))
        )


@pytest.mark.ddp
def test_ddp_ranks_train_disjoint_halves_of_the_subset_in_force(tmp_path):
    run_dir = tmp_path / "run"
    out = run_entry(
        "train.py",
        [
            *FAST,
            "selector=gradmatch",
            "budget=subset",
            "fraction=0.4",
            "trainer.max_epochs=3",
            "reselect_every=1",
            "record_seen=true",
            "trainer=ddp",  # the preset (two processes) trains on the CPU here
            "trainer.accelerator=cpu",
            f"hydra.run.dir={run_dir}",
        ],
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stages"]["train"]["reselections"] == 2
    for epoch in range(3):
        (i0, w0), (i1, w1) = (load_seen(run_dir, epoch, rank) for rank in (0, 1))
        assert len(i0) == len(i1) == 100  # each rank its own half of the 200-sample subset
        assert not set(i0.tolist()) & set(i1.tolist())  # disjoint
        _assert_fed_exactly(np.concatenate([i0, i1]), np.concatenate([w0, w1]), run_dir, epoch)
    assert not np.array_equal(_in_force(run_dir, 0)[0], _in_force(run_dir, 1)[0])
    assert summary["stages"]["train"]["samples"] == 3 * 200
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


# --- step budgets on any trainer ---------------------------------------------------------------


def trained_samples(pool: int, batch_size: int, world_size: int, accumulate: int, steps: int):
    """(samples, epochs begun) of a fit stopped at `steps` optimiser steps, stepping as
    Lightning does: every process trains its ceil(pool / W) rows an epoch in batches and
    steps every `accumulate` batches and after an epoch's last; StopAtStep ends it after the
    batch that completes the last step."""
    rows = -(-pool // world_size)
    batches = [min(batch_size, rows - start) for start in range(0, rows, batch_size)]
    samples = done = epochs = 0
    while True:
        epochs += 1
        for i, size in enumerate(batches):
            samples += size * world_size
            if (i + 1) % accumulate == 0 or i == len(batches) - 1:
                done += 1
                if done >= steps:
                    return samples, epochs


# 30% of 4 epochs of a 3,000-image pool in batches of 256: 12 steps an epoch on one device,
# round(0.3 x 4 x 12) = 14 steps, 3,512 samples; a 900-image subset's 4 x 4 steps: 4,024.
# (processes, batches per step) -> full_schedule's and full_steps' (epochs, steps)
STEPPING = [
    ((1, 1), (2, 14), (4, 16)),
    ((2, 1), (2, 7), (4, 8)),  # 1,500 rows a process: 6 steps an epoch
    ((1, 2), (2, 7), (4, 8)),
    ((2, 2), (2, 4), (4, 4)),  # 3 steps an epoch
    ((1, 5), (2, 4), (4, 4)),  # 12 batches: steps after the 5th, 10th and the epoch's last
]


@pytest.mark.parametrize(("stepping", "schedule", "subset"), STEPPING)
def test_a_step_budget_trains_as_many_samples_on_any_devices_and_accumulation(
    stepping, schedule, subset
):
    world_size, accumulate = stepping
    sizes = PoolSizes(3000, 3000, 256, 4, 0.3, world_size, accumulate)
    per_step = 256 * world_size * accumulate  # the most one optimiser step trains
    for steps, expected, one_device in (("schedule", schedule, 3512), ("subset", subset, 4024)):
        planned = WholePool(steps=steps).schedule(sizes)
        assert (planned.epochs, planned.steps) == expected
        samples, epochs = trained_samples(3000, 256, world_size, accumulate, expected[1])
        assert abs(samples - one_device) < per_step, (steps, samples)
        assert epochs <= planned.epochs  # not cut off before its last step


def test_a_step_budget_counts_the_steps_of_an_accumulating_trainer(make_cfg, tmp_path):
    # FAST: 500 rows in 16 batches of 32. Accumulating 3, an epoch takes ceil(16 / 3) = 6 steps
    # (Lightning steps after the epoch's last batch too): round(0.3 x 4 x 6) = 7 steps, the
    # first epoch and 3 batches, the 596 samples that 19 steps of one batch train.
    budget = [*FAST, "budget=full_schedule", "fraction=0.3", "trainer.max_epochs=4"]
    runs = {}
    for name, extra in (("plain", []), ("accumulating", ["+trainer.accumulate_grad_batches=3"])):
        out = tmp_path / name
        summary = train_stage.run(validate(make_cfg([*budget, *extra, f"paths.output_dir={out}"])))
        ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
        runs[name] = (summary["stages"]["train"]["samples"], ckpt)
    assert runs["plain"][0] == runs["accumulating"][0] == 596
    for name, steps in (("plain", 19), ("accumulating", 7)):
        ckpt = runs[name][1]
        assert ckpt["global_step"] == steps
        schedule = ckpt["lr_schedulers"][0]  # the cosine ends at zero on the last step
        assert schedule["T_max"] == steps and schedule["_last_lr"][0] == pytest.approx(0)


# Several devices on the CPU: `auto` would ask a machine with one GPU for two (Lightning refuses).
LIGHTNING_DEVICES = [
    {"devices": 1},
    {"devices": "2", "strategy": "ddp", "accelerator": "cpu"},
    {"devices": 2, "num_nodes": 2, "strategy": "ddp", "accelerator": "cpu"},
    {"devices": "auto", "accelerator": "cpu"},
    {"devices": "auto", "accelerator": "auto"},
]


@pytest.mark.parametrize("node", LIGHTNING_DEVICES)
def test_the_plan_counts_the_processes_lightnings_trainer_runs(node):
    trainer = L.Trainer(logger=False, enable_checkpointing=False, **node)
    assert plan_stage.trainer_world_size(node) == trainer.world_size


def test_a_step_budget_on_devices_the_trainer_node_does_not_count_is_refused(make_cfg):
    tpu = ["trainer.accelerator=tpu", "trainer.devices=auto"]  # how many: only Lightning knows
    run = run_of(make_cfg([*FAST, "budget=full_steps", *tpu]))
    dm = build_datamodule(run)
    with pytest.raises(UserError, match=r"give trainer\.devices as a number") as refused:
        plan_stage.main_schedule(run, dm, len(dm.pool_indices))
    assert "\n" not in str(refused.value)
    by_epochs = run_of(make_cfg([*FAST, *tpu]))  # budget=infobatch counts no steps
    assert plan_stage.main_schedule(by_epochs, dm, len(dm.pool_indices)).steps is None


@pytest.mark.slow
@pytest.mark.ddp
def test_a_step_budget_on_two_ddp_processes_trains_the_samples_of_one(tmp_path):
    # Each process: 250 rows, 8 batches of 32 an epoch. round(0.3 x 4 x 8) = 10 steps: the
    # first epoch and 2 steps of 2 x 32, 628 samples (one device: 19 steps of 32, 596).
    run_dir = tmp_path / "run"
    args = [*FAST, "budget=full_schedule", "fraction=0.3", "trainer.max_epochs=4"]
    args += ["trainer=ddp", "trainer.accelerator=cpu", f"hydra.run.dir={run_dir}"]
    out = run_entry("train.py", args, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stages"]["train"]["samples"] == 628
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 10 and ckpt["lr_schedulers"][0]["T_max"] == 10
    assert ckpt["lr_schedulers"][0]["_last_lr"][0] == pytest.approx(0)


def test_validating_every_n_batches_a_pruned_epoch_may_lack_is_refused_before_training(
    make_cfg, tmp_path
):
    """InfoBatch's pruned epochs of the 500-image pool train 13 or so of its 16 batches, and as
    few as 8 (all but one row below the mean, half of them dropped): a validation every 14
    batches of an epoch ended the fit with Lightning's traceback at the first epoch it pruned,
    the full one before it trained. Refused in one line before main training; every 8 batches
    (what the fewest rows hold) trains, and so does every 14 across epochs
    (check_val_every_n_epoch=null)."""
    args = [*FAST, "budget.epochs=all", "trainer.max_epochs=4"]
    with pytest.raises(UserError) as refused:
        train_stage.run(validate(make_cfg([*args, "+trainer.val_check_interval=14"])))
    assert str(refused.value) == (
        "trainer.val_check_interval=14 validates every 14 batches of an epoch, but main "
        "training's epoch has 8 (as few as 250 of the 500 images budget=infobatch prunes it to, "
        "in batches of 32); give a smaller number, a share of an epoch "
        "(+trainer.val_check_interval=0.5), or +trainer.check_val_every_n_epoch=null"
    )
    assert not (tmp_path / "checkpoints").exists()
    within = train_stage.run(validate(make_cfg([*args, "+trainer.val_check_interval=8"])))
    assert len(within["stages"]["train"]["dynamic"]["pruned_share"]) == 4
    across = [*args, "+trainer.val_check_interval=14", "+trainer.check_val_every_n_epoch=null"]
    summary = train_stage.run(validate(make_cfg([*across, f"paths.output_dir={tmp_path / 'b'}"])))
    assert len(summary["stages"]["train"]["dynamic"]["pruned_share"]) == 4
    assert summary["val_accuracy"] is not None


def test_lipts_budget_validates_every_few_batches_its_epochs_hold(make_cfg, tmp_path):
    """budget=lipt keeps about half of the pool's 16 batches in a pruned epoch at fraction 0.5:
    a validation every 2 batches trains (a blanket refusal of any batch interval under pruning
    refused it), one every 12 is refused as soon as the pool is read, before the jigsaw
    learners train."""
    jigsaw = ["pretrain=jigsaw", "pretrain.num_learners=3", "pretrain.local_epochs=2"]
    args = [*FAST, *jigsaw, "merge.ratios=3", "budget=lipt", "fraction=0.5"]
    args += ["trainer.max_epochs=2"]
    summary = train_stage.run(validate(make_cfg([*args, "+trainer.val_check_interval=2"])))
    assert summary["val_accuracy"] is not None
    with pytest.raises(UserError, match=r"^trainer\.val_check_interval=12 .* \(as few as \d+ of "):
        train_stage.run(
            validate(
                make_cfg(
                    [
                        *args,
                        "+trainer.val_check_interval=12",
                        f"paths.output_dir={tmp_path / 'b'}",
                    ]
                )
            )
        )
    assert list((tmp_path / "b").iterdir()) == [], list((tmp_path / "b").iterdir())


def test_an_optimized_metric_is_held_to_the_epochs_a_step_budget_trains(make_cfg, tmp_path):
    """budget=full_steps at 10% of 15 epochs trains a 50-image subset's 15 x 2 optimiser steps
    on the 500-image pool's 16 batches an epoch: 2 epochs, which the config alone does not tell.
    A validation every 5 epochs never ran, and the run ended, trained, with "summary.json has
    no number there". Refused once the pool is read, before the fit; every 2 epochs, the run
    trains and reports its validation accuracy."""
    args = [
        *FAST,
        "budget=full_steps",
        "fraction=0.1",
        "trainer.max_epochs=15",
        "optimized_metric=val_accuracy",
    ]
    run = validate(make_cfg([*args, "+trainer.check_val_every_n_epoch=5"]))
    with pytest.raises(UserError) as refused:
        train_stage.run(run)
    assert str(refused.value) == (
        "optimized_metric=val_accuracy needs a validation result, but "
        "trainer.check_val_every_n_epoch=5 validates nothing in the 2 epochs budget=full_steps "
        "trains on this pool (500 images); set trainer.check_val_every_n_epoch=2 or less"
    )
    assert not (tmp_path / "checkpoints").exists()
    summary = train_stage.run(validate(make_cfg([*args, "+trainer.check_val_every_n_epoch=2"])))
    assert summary["stages"]["train"]["samples"] == 500 + 14 * 32  # 30 steps: 16, then 14
    assert summary["val_accuracy"] is not None


def test_a_step_budget_beside_the_trainers_least_epochs_is_refused_not_overspent(make_cfg):
    """Lightning ignores a stop before trainer.min_epochs (or min_steps): a full_schedule run of
    29 steps with +trainer.min_epochs=6 trained its 2 epochs' 32, the cosine past its end.
    Refused before any work; without it the budget's steps train."""
    args = [*FAST, "budget=full_schedule", "fraction=0.3", "trainer.max_epochs=6"]
    for least in ("+trainer.min_epochs=6", "+trainer.min_steps=30"):
        with pytest.raises(UserError, match=r"^trainer\.min_(epochs|steps)=\d+ may keep train"):
            validate(make_cfg([*args, least]))
    validate(make_cfg([*args, "+trainer.min_epochs=0", "+trainer.min_steps=0"]))  # no least
    summary = train_stage.run(validate(make_cfg(args)))
    assert summary["stages"]["train"]["samples"] == 28 * 32 + 20  # round(0.3 x 6 x 16) steps


def test_validating_every_n_batches_of_a_shorter_epoch_is_one_line(make_cfg, tmp_path):
    """A 10% subset of the 500-image pool is 2 batches an epoch: a validation every 3 batches
    was Lightning's traceback when the fit started. One line naming the epoch's batches, before
    main training; the selected subset is kept for the run again with ckpt_path=last."""
    args = [*FAST, "selector=random", "budget=subset", "fraction=0.1", "trainer.max_epochs=2"]
    with pytest.raises(UserError) as refused:
        train_stage.run(validate(make_cfg([*args, "+trainer.val_check_interval=3"])))
    assert str(refused.value).startswith(
        "trainer.val_check_interval=3 validates every 3 batches of an epoch, but main "
        "training's epoch has 2 (50 images in batches of 32)"
    )
    assert f"ckpt_path=last hydra.run.dir={tmp_path} keeps its subset" in str(refused.value)
    assert (tmp_path / "subset.npz").is_file() and not (tmp_path / "checkpoints").exists()
    again = [*args, "+trainer.val_check_interval=2", "ckpt_path=last"]
    summary = train_stage.run(validate(make_cfg(again)))
    assert summary["stages"]["train"]["samples"] == 2 * 50 and summary["val_accuracy"] is not None
    # The whole pool's 16 batches an epoch, and a trainer limited to 4 of them, alike.
    whole = [*FAST, "budget=full", "+trainer.val_check_interval=8"]
    validate(make_cfg(whole))  # the pool is not known before the data is read
    with pytest.raises(UserError, match=r"main training's epoch has 4 \(500 images"):
        train_stage.run(validate(make_cfg([*whole, "+trainer.limit_train_batches=4"])))


def test_jigsaw_pretrains_a_users_model_whose_head_is_not_called_classifier(make_cfg, tmp_path):
    """`model._target_` of the user's, its final nn.Linear named `head`: every learner trained,
    then the soup's learner heads were read as `classifier.weight` (KeyError)."""
    jigsaw = ["pretrain=jigsaw", "pretrain.num_learners=2", "pretrain.local_epochs=1"]
    model = ["model._target_=tests.helpers.HeadNet", "~model.channels_last", "~model.compile"]
    cfg = make_cfg([*FAST, *jigsaw, *model], config_name="pretrain")
    pretrain_stage.run(validate(cfg))
    payload = torch.load(tmp_path / "pretrain.ckpt", weights_only=False)
    heads = payload["learner_heads"]
    assert heads["weight"].shape == (2, 4, 8)  # learners x classes x the head's inputs
