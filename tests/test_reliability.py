"""Bad input, driven through the real entry scripts: exit code 2, one line on stderr naming the
problem and the fix, no traceback, and no run folder left behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lipt.core.artifacts import save_checkpoint, save_subset
from lipt.run.config import run_of, validate
from tests.helpers import FAST, run_entry

SLOW = pytest.mark.slow  # these load torch and data before they fail: a few seconds each


def slow_case(case_id: str, script: str, overrides: list[str], words: list[str]) -> Any:
    return pytest.param(script, overrides, words, marks=SLOW, id=case_id)


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {}
    meta = {"dataset": "synthetic:0:600:4", "dataset_train_size": 600}
    files["other_data"] = tmp_path / "other.npz"
    save_subset(
        files["other_data"],
        torch.arange(10),
        torch.ones(10),
        {"dataset": "cifar10", "dataset_train_size": 50000},
    )
    files["out_of_range"] = tmp_path / "range.npz"
    save_subset(files["out_of_range"], torch.tensor([1, 2, 9999]), torch.ones(3), meta)
    files["duplicates"] = tmp_path / "dup.npz"
    save_subset(files["duplicates"], torch.tensor([1, 2, 2]), torch.ones(3), meta)
    files["corrupt_ckpt"] = tmp_path / "corrupt.ckpt"
    files["corrupt_ckpt"].write_bytes(b"not a checkpoint at all")
    good = tmp_path / "good.ckpt"
    save_checkpoint(good, {"state_dict": {"w": torch.ones(1000)}, "data": "synthetic:0:600:4"})
    files["truncated_ckpt"] = tmp_path / "truncated.ckpt"
    files["truncated_ckpt"].write_bytes(good.read_bytes()[:200])
    files["foreign_ckpt"] = good  # loads, but does not fit the model
    corrupt = tmp_path / "corrupt-fmnist"
    corrupt.mkdir()
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        (corrupt / name).write_bytes(b"\x00\x00\x08\x03garbage")
    files["corrupt_dir"] = corrupt
    files["empty_dir"] = tmp_path / "empty"
    files["empty_dir"].mkdir()
    for name, labels in (
        ("labels_float", np.zeros(600, np.float32)),
        ("labels_2d", np.zeros((600, 2), np.int64)),
        ("labels_range", np.full(600, 4, np.int64)),  # synthetic has classes 0..3
        ("labels_short", np.zeros(599, np.int64)),
    ):
        files[name] = tmp_path / f"{name}.npy"
        np.save(files[name], labels)
    return files


LIPT_CLEAN = ["pretrain=jigsaw", "selector=random", "clean=lipt"]
STEP_BUDGET = ["budget=full_steps", "trainer.max_epochs=15", "optimized_metric=val_accuracy"]
CASES = [
    # (script, overrides, words the message must contain); {name} is a bad_files path
    ("train.py", ["selector=nope"], ["selector"]),
    ("train.py", ["model=nope"], ["model"]),
    ("train.py", ["no_such_key=1"], ["no_such_key", "+key=value"]),
    ("train.py", ["trainer.max_epochs=abc"], ["trainer.max_epochs"]),
    ("train.py", ["hparams_search=lr_wd", "trainer.max_epochs=abc"], ["trainer.max_epochs"]),
    (
        "train.py",
        ["scheduler=linear", "+trainer.max_time=00:00:10:00"],
        ["scheduler=linear", "trainer.max_time"],
    ),
    ("train.py", ["seed=-3"], ["seed"]),
    ("train.py", ["fraction=0"], ["fraction", "greater than 0"]),
    ("train.py", ["fraction=-1"], ["fraction", "greater than 0"]),
    ("train.py", ["fraction=1.5"], ["fraction", "less than or equal to 1"]),
    ("train.py", ["fraction=abc"], ["fraction", "a valid number"]),
    ("train.py", ["-m", "fraction=0.1,2"], ["fraction"]),
    ("train.py", ["dataset.data_dir=/no/such/dir"], ["/no/such/dir", "dataset.data_dir"]),
    ("train.py", ["dataset.data_dir={corrupt_ckpt}"], ["corrupt.ckpt is a file, not a folder"]),
    (  # a folder to download into is made first: a misspelt one is not filled
        "train.py",
        ["dataset.data_dir={empty_dir}/new", "dataset.download=true"],
        ["empty/new does not exist", "create it (mkdir -p ", "to download the data into it"],
    ),
    ("train.py", ["subset_path=/no/such.npz"], ["subset_path"]),
    ("train.py", ["pretrain=jigsaw", "pretrain.num_learners=0"], ["pretrain.num_learners"]),
    ("pretrain.py", ["pretrain=jigsaw", "pretrain.num_learners=0"], ["pretrain.num_learners"]),
    ("pretrain.py", ["pretrain=nope"], ["pretrain"]),
    ("select.py", ["ckpt_path=/no/such.ckpt"], ["ckpt_path", "pretrain.ckpt"]),
    ("select.py", ["selector=none"], ["selector=none", "selects nothing"]),
    # Settings only main training reads: refused before pre-training starts.
    ("train.py", ["optimizer.lr=0"], ["optimizer.lr", "greater than 0"]),
    ("train.py", ["optimizer.momentum=1"], ["optimizer.momentum"]),
    ("train.py", ["scheduler=step"], ["scheduler"]),
    ("train.py", ["-m", "optimizer.lr=0.1,0"], ["optimizer.lr"]),
    # Wrong labels and label cleaning.
    ("train.py", ["dataset.label_noise.rate=1"], ["dataset.label_noise.rate", "less than 1"]),
    ("train.py", ["dataset.label_noise.kind=uniform"], ["dataset.label_noise.kind"]),
    ("train.py", ["dataset.label_noise.pairs=[1,0]"], ["dataset.label_noise.pairs", "10 classes"]),
    ("train.py", ["dataset.train_labels=/no/such.npy"], ["dataset.train_labels", "/no/such.npy"]),
    (
        "train.py",
        [
            "dataset=synthetic",
            "dataset.label_noise.rate=0.2",
            "dataset.train_labels={labels_short}",
        ],
        ["dataset.train_labels", "label_noise"],
    ),
    (
        "train.py",
        ["clean=lipt", "pretrain=none", "budget=infobatch"],
        ["clean=lipt", "pretrain=none"],
    ),
    ("pretrain.py", ["clean=lipt"], ["select.py clean=lipt"]),
    # DDP's extra processes re-run the command line: under -m, the whole sweep again.
    ("train.py", ["-m", "trainer=ddp", "seed=0,1"], ["trainer.strategy=ddp", "whole sweep"]),
    (  # in one job of the sweep only
        "train.py",
        ["-m", "trainer.strategy=ddp", "trainer.devices=1,2"],
        ["trainer.strategy=ddp on 2 processes", "whole sweep"],
    ),
    (  # strategy auto on 2 devices is DDP
        "train.py",
        ["-m", "trainer.devices=2", "seed=0,1"],
        ["trainer.strategy=auto on 2 processes", "Lightning's DDP", "whole sweep"],
    ),
    # An Optuna search that would train every trial, then end in Optuna's traceback, or that
    # would choose the worst trial.
    (
        "train.py",
        ["hparams_search=lr_wd", "optimized_metric=null"],
        ["optimized_metric=null", "optimized_metric=val_accuracy"],
    ),
    ("train.py", ["hparams_search=lr_wd", "hydra.sweeper.n_trials=0"], ["n_trials=0", "no trial"]),
    (  # validated every 5 epochs of the 2 InfoBatch trains at 10% of 15: never
        "train.py",
        [
            "budget=infobatch",
            "pretrain=none",
            "optimized_metric=val_accuracy",
            "+trainer.check_val_every_n_epoch=5",
        ],
        ["check_val_every_n_epoch=5 validates nothing in the 2 epochs budget=infobatch trains"],
    ),
    (
        "train.py",
        ["hparams_search=lr_wd", "hydra.sweeper.direction=minimize"],
        ["direction=minimize", "lowest val_accuracy", "direction=maximize"],
    ),
    (
        "train.py",
        ["hparams_search=lr_wd", "optimizer.lr=tag(log, interval(0.5, 0.01))"],
        ["optimizer.lr=tag(log, interval(0.5, 0.01))", "give interval(0.01, 0.5)"],
    ),
    # Hydra runs a config's sweep (hydra.mode=MULTIRUN) whole, --run or not.
    ("train.py", ["--run", "+experiment=table2_cpu"], ["--run asks for one run", "-m"]),
    # What Hydra cannot parse, or a ${...} that names no key: the override named.
    ("train.py", ["seed=[0,1"], ["seed=[0,1 cannot be read", "override grammar"]),
    ("train.py", ["optimizer.lr=${{nope}}"], ["optimizer.lr=${nope}:", "'nope' not found"]),
    # A dry run sets the data module up as the run does: what only the data refutes, refused.
    (
        "train.py",
        ["dry_run=true", "dataset=synthetic", "dataset.train_labels={labels_short}"],
        ["599 labels", "600 items"],
    ),
    (
        "train.py",
        ["dry_run=true", "dataset=synthetic", "dataset.val_size=600"],
        ["dataset.val_size=600", "leaves no training pool"],
    ),
    (
        "pretrain.py",
        ["-m", "pretrain.learners=range(2)", "seed=0,1"],
        ["also sweeps seed", "one setting's learners would replace another's"],
    ),
    ("select.py", ["clean=lipt", "pretrain=full"], ["clean=lipt", "pretrain=full", "neither"]),
    ("select.py", ["clean=cleanlab", "clean.action=relabel"], ["subset.npz", "train.py"]),
    ("train.py", ["clean=cleanlab", "clean.folds=0"], ["clean.folds"]),
    ("train.py", ["clean=lipt", "clean.action=burn"], ["clean.action"]),
    ("train.py", ["clean=lipt", "clean.members=all"], ["clean.members"]),
    ("train.py", ["clean=warmup", "clean.epochs=0"], ["clean.epochs"]),
    ("train.py", ["clean=nope"], ["clean"]),
    ("train.py", ["clean=cleanlab", "subset_path={other_data}"], ["subset_path", "clean=none"]),
    ("select.py", ["clean=lipt", "ckpt_path={foreign_ckpt}"], ["clean=lipt", "ckpt_path"]),
    # Settings nothing would read: refused, not silently ignored.
    ("train.py", ["reselect_every=2"], ["budget=lipt", "reselect_every=2", "selector"]),
    (
        "train.py",
        ["budget=infobatch", "pretrain=none", "reselect_every=2"],
        ["budget=infobatch", "whole pool", "reselect_every=0"],
    ),
    (
        "train.py",
        ["budget=full", "selector=none", "pretrain=none", "reselect_every=2"],
        ["budget=full", "reselect_every=2"],
    ),
    (
        "train.py",
        ["selector=random", "pretrain=none", "subset_path={other_data}", "reselect_every=2"],
        ["reselect_every=2", "subset_path", "saved subset"],  # refused before it is read
    ),
    (
        "train.py",
        ["selector=random", "pretrain=none", "reselect_every=15"],
        ["reselect_every=15", "trainer.max_epochs=15", "never re-selected"],
    ),
    ("train.py", ["+clean.action=drop"], ["clean.action=drop", "clean=none", "takes no"]),
    ("train.py", ["+selector.balance=true"], ["selector.balance=true", "selector=none"]),
    ("train.py", ["+dataset.num_train=100"], ["dataset.num_train=100", "takes no num_train"]),
    ("train.py", ["selector=random", "+selector.repeats=3"], ["selector.repeats=3", "random"]),
    (
        "select.py",
        ["selector=grand", "selector.repeats=3", "ckpt_path={foreign_ckpt}"],
        ["selector.repeats=3", "ckpt_path gives one"],
    ),
    ("select.py", ["subset_path={other_data}"], ["subset_path=", "select.py does not run"]),
    ("pretrain.py", ["ckpt_path={foreign_ckpt}"], ["ckpt_path=", "resumes from no checkpoint"]),
    # refused as ignored, not as a missing file: pretrain.py would read none
    ("pretrain.py", ["ckpt_path=/no/such.ckpt"], ["ckpt_path=/no/such.ckpt is ignored"]),
    ("train.py", ["pretrain.learners=[0,1]"], ["pretrain.learners=[0, 1]", "pretrain.py -m"]),
    (
        "train.py",
        ["+trainer.default_root_dir={empty_dir}"],
        ["trainer.default_root_dir=", "hydra.run.dir"],
    ),
    ("train.py", ["+trainer.logger=false"], ["trainer.logger=false", "logger=none"]),
    (  # the spawned ranks train; the model here is attached to no trainer after the fit
        "train.py",
        ["trainer.devices=2", "trainer.strategy=ddp_spawn"],
        ["trainer.strategy=ddp_spawn trains in processes started from this one", "=ddp"],
    ),
    # Settings that would make the run other than it says.
    (  # Lightning trains on past a step budget's stop until the trainer's least epochs
        "train.py",
        ["budget=full_schedule", "pretrain=none", "+trainer.min_epochs=6"],
        ["trainer.min_epochs=6", "budget=full_schedule", "drop trainer.min_epochs"],
    ),
    (  # the best checkpoint would be the highest loss
        "train.py",
        ["callbacks.model_checkpoint.monitor=val/loss"],
        ["monitor=val/loss with mode=max", "callbacks.model_checkpoint.mode=min"],
    ),
    (
        "train.py",
        ["+trainer.enable_checkpointing=false"],
        ["trainer.enable_checkpointing=false", "last.ckpt"],
    ),
    # train.py opens its checkpoint before any stage: one line, not a traceback after selection
    ("train.py", ["ckpt_path={corrupt_ckpt}"], ["ckpt_path=", "not a readable checkpoint"]),
    ("train.py", ["ckpt_path={truncated_ckpt}"], ["ckpt_path=", "not a readable checkpoint"]),
    # Keys that moved: one line naming the new one.
    ("train.py", ["optim.lr=0.05"], ["Could not override 'optim.lr'"]),
    ("train.py", ["optim.scheduler=constant"], ["Could not override 'optim.scheduler'"]),
    ("train.py", ["-m", "optim.lr=0.1,0.2"], ["Could not override 'optim.lr'"]),
    (
        "pretrain.py",
        ["pretrain.optim.momentum=0.5"],
        ["Could not override 'pretrain.optim.momentum'"],
    ),
    ("pretrain.py", ["pretrain.optim.lr=0"], ["pretrain.optim.lr", "greater than 0"]),
    ("pretrain.py", ["pretrain.min_learners=11"], ["pretrain.min_learners"]),
    # --cfg prints the config a run would get: what a run refuses in it, refused the same way
    # (-m with it: Hydra's traceback); --run is a run.
    ("train.py", ["-c", "job", "seed=0,1"], ["seed=0,1 sweeps 2 values", "--cfg", "one value"]),
    ("train.py", ["--cfg", "all", "seed=range(2)"], ["seed=range(2) sweeps 2 values", "--cfg"]),
    ("train.py", ["-c", "hydra", "seed=0,1"], ["seed=0,1 sweeps 2 values", "--cfg"]),
    ("train.py", ["-c", "job", "fraction=2"], ["fraction=2", "less than or equal to 1"]),
    ("train.py", ["-c", "job", "no_such_key=1"], ["no_such_key", "+key=value"]),
    ("train.py", ["-m", "-c", "job", "seed=0,1"], ["--multirun and --cfg", "dry_run=true"]),
    ("train.py", ["--run", "seed=0,1"], ["seed=0,1 sweeps 2 values", "replace --run with -m"]),
    # The run folder: made by the stage once the run has started, checked before.
    (
        "train.py",
        ["paths.output_dir={corrupt_ckpt}/run", "dry_run=true"],
        ["paths.output_dir=", "is not a folder", "choose a writable folder"],
    ),
    (
        "train.py",
        ["-m", "seed=0,1", "paths.output_dir={corrupt_ckpt}/${{hydra:job.num}}"],
        ["paths.output_dir=", "corrupt.ckpt/0", "is not a folder"],
    ),
    # A sweeper param of a dotted key: one key, which Hydra reads as one only in a dict (the
    # overrides are format()ted: {{ is a brace).
    (
        "train.py",
        ["-m", "+experiment=frontier_small", "hydra.sweeper.params.'dataset.val_size'=100,200"],
        ["'++hydra.sweeper.params={dataset.val_size: \"100,200\"}'"],
    ),
    (
        "train.py",
        [
            "-m",
            "+experiment=frontier_small",
            "++hydra.sweeper.params={{'dataset.val_size': '1,2'}}",
        ],
        ["'++hydra.sweeper.params={dataset.val_size: \"1,2\"}'"],
    ),
    # These build the Trainer, import the logger or run the selector: torch loads first.
    slow_case("trainer-precision", "train.py", ["trainer.precision=banana"], ["trainer", "banana"]),
    slow_case("trainer-unknown-key", "train.py", ["+trainer.bogus=1"], ["trainer", "bogus"]),
    slow_case("trainer-devices", "train.py", ["trainer.devices=0"], ["trainer", "devices"]),
    slow_case("trainer-strategy", "train.py", ["trainer.strategy=nope"], ["trainer", "nope"]),
    slow_case("select-trainer", "select.py", ["trainer.precision=banana"], ["trainer", "banana"]),
    slow_case("logger-unknown-key", "train.py", ["+logger.csv.bogus=1"], ["logger.csv", "bogus"]),
    slow_case("logger-missing", "train.py", ["logger.csv._target_=no.such.Logger"], ["logger=csv"]),
    slow_case(
        "selector-mode",
        "train.py",
        ["selector=glister", "selector.greedy=sometimes"],
        ["selector=glister", "greedy"],
    ),
    slow_case(
        "selector-unknown-key",
        "train.py",
        ["selector=glister", "+selector.bogus=1"],
        ["glister", "bogus"],
    ),
    slow_case(
        "selector-value",
        "train.py",
        ["selector=gradmatch", "selector.target=test"],
        ["gradmatch", "target"],
    ),
    slow_case(
        "data-files-missing",
        "train.py",
        ["dataset=cifar10", "dataset.data_dir={empty_dir}"],
        ["CIFAR-10 files missing"],
    ),
    slow_case(
        "shard-larger-than-data",
        "train.py",
        [
            *FAST,
            "pretrain=jigsaw",
            "selector=el2n",
            "budget=subset",
            "pretrain.num_learners=50",
            "pretrain.batches_per_learner=10",
        ],
        ["pretrain.num_learners"],
    ),
    slow_case(
        "pretrain-shard-too-large",
        "pretrain.py",
        [*FAST, "pretrain=jigsaw", "pretrain.batches_per_learner=100"],
        ["pretrain.batches_per_learner"],
    ),
    slow_case(  # a step budget's epochs, told by the pool's size: 2 of 15 at 10% here
        "optimized-metric-step-budget",
        "train.py",
        [*FAST, *STEP_BUDGET, "+trainer.check_val_every_n_epoch=5"],
        ["5 validates nothing in the 2 epochs budget=full_steps trains on this pool (500 images)"],
    ),
    slow_case(
        "optimized-metric-step-budget-dry-run",
        "train.py",
        [*FAST, *STEP_BUDGET, "+trainer.check_val_every_n_epoch=5", "dry_run=true"],
        ["5 validates nothing in the 2 epochs budget=full_steps trains on this pool (500 images)"],
    ),
    slow_case(  # InfoBatch keeps at least 250 of the 500 images: 8 batches of 32 (4 epochs: one
        # epoch prunes nothing, its scores all equal)
        "validation-interval-past-a-pruned-epoch-dry-run",
        "train.py",
        [
            *FAST,
            "budget.epochs=all",
            "trainer.max_epochs=4",
            "+trainer.val_check_interval=14",
            "dry_run=true",
        ],
        ["val_check_interval=14", "has 8 (as few as 250 of the 500 images budget=infobatch"],
    ),
    slow_case(
        "corrupt-data-dir",
        "train.py",
        ["dataset.data_dir={corrupt_dir}", "dataset.download=false"],
        ["corrupt", "restore"],
    ),
    slow_case(
        "labels-float",
        "train.py",
        ["dataset=synthetic", "dataset.train_labels={labels_float}"],
        ["float32", "integer"],
    ),
    slow_case(
        "labels-2d",
        "train.py",
        ["dataset=synthetic", "dataset.train_labels={labels_2d}"],
        ["shape (600, 2)"],
    ),
    slow_case(
        "labels-range",
        "train.py",
        ["dataset=synthetic", "dataset.train_labels={labels_range}"],
        ["outside", "0..3"],
    ),
    slow_case(
        "labels-short",
        "train.py",
        [*FAST, "dataset.train_labels={labels_short}"],
        ["599 labels", "600 items"],
    ),
    slow_case(
        "clean-folds-above-pool",
        "train.py",
        [*FAST, "dataset.pool_size=40", "clean=cleanlab", "clean.folds=50"],
        ["clean.folds=50", "pool's 40 items"],
    ),
    slow_case(
        "probe-folds-above-pool",
        "select.py",
        [*FAST, "dataset.pool_size=40", *LIPT_CLEAN, "clean.probe_folds=50"],
        ["clean.probe_folds=50", "pool's 40 items"],
    ),
    slow_case(
        "subset-other-data", "train.py", [*FAST, "subset_path={other_data}"], ["made for", "select"]
    ),
    slow_case(
        "subset-out-of-range", "train.py", [*FAST, "subset_path={out_of_range}"], ["outside"]
    ),
    slow_case("subset-duplicates", "train.py", [*FAST, "subset_path={duplicates}"], ["duplicate"]),
    slow_case(
        "corrupt-ckpt",
        "select.py",
        [*FAST, "selector=el2n", "budget=subset", "ckpt_path={corrupt_ckpt}"],
        ["not a readable checkpoint", "pretrain.py"],
    ),
    slow_case(
        "truncated-ckpt",
        "select.py",
        [*FAST, "selector=el2n", "budget=subset", "ckpt_path={truncated_ckpt}"],
        ["not a readable checkpoint"],
    ),
    slow_case(
        "ckpt-for-another-model",
        "select.py",
        [*FAST, "selector=el2n", "budget=subset", "ckpt_path={foreign_ckpt}"],
        ["does not fit"],
    ),
]


@pytest.mark.parametrize(("script", "overrides", "words"), CASES)
def test_bad_input_is_one_line_and_exit_2(tmp_path, bad_files, script, overrides, words):
    args = [a.format(**bad_files) for a in overrides]
    run_dir, sweep_dir = tmp_path / "run", tmp_path / "sweep"
    out = run_entry(
        script,
        [*args, f"hydra.run.dir={run_dir}", f"hydra.sweep.dir={sweep_dir}"],
        timeout=300,
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    assert not run_dir.exists() and not sweep_dir.exists()  # nothing written


def repo_writable(root: Path) -> set[Path]:
    """What a run started elsewhere could write into the repository by mistake: new top-level
    entries, and anything under the folders Hydra, Lightning and wandb default to. (Not the
    whole tree: other processes, e.g. an editor or a benchmark, may write elsewhere in it.)"""
    found = set(root.iterdir())
    for name in ("outputs", "multirun", "lightning_logs", "wandb"):
        found |= set((root / name).rglob("*"))
    return found


@pytest.mark.slow
def test_a_run_writes_only_inside_its_run_dir(tmp_path):
    """Started from an empty working folder with an empty HOME: afterwards both are still empty
    and everything the run wrote is under hydra.run.dir."""
    from tests.helpers import ROOT

    cwd, home, run_dir = tmp_path / "cwd", tmp_path / "home", tmp_path / "run"
    cwd.mkdir()
    home.mkdir()
    before = repo_writable(ROOT)
    out = run_entry(
        str(ROOT / "train.py"),
        [
            *[o for o in FAST if o != "logger=none"],
            "logger=wandb",
            "selector=el2n",
            "budget=subset",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=cwd,
        env={"HOME": str(home), "WANDB_SILENT": "true"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert list(cwd.iterdir()) == []
    assert list(home.rglob("*")) == []
    assert repo_writable(ROOT) == before
    assert (run_dir / "summary.json").is_file() and (run_dir / "subset.npz").is_file()


def test_same_config_and_seed_give_the_same_subset_bit_for_bit(make_cfg, tmp_path):
    from lipt.stages.build import build_datamodule, build_parts
    from lipt.stages.pretrain import ranking_models
    from lipt.stages.select import choose_subset

    results = []
    for attempt in range(2):
        cfg = make_cfg(
            [
                *FAST,
                "selector=gradmatch",
                "budget=subset",
                "pretrain=full",
                "pretrain.epochs=1",
                f"paths.output_dir={tmp_path / str(attempt)}",
            ]
        )
        dm = build_datamodule(run_of(cfg))
        models = ranking_models(run_of(cfg), build_parts(run_of(cfg), dm)).models
        results.append(choose_subset(run_of(cfg), build_parts(run_of(cfg), dm), models, seed=0))
    (i0, w0), (i1, w1) = results
    assert torch.equal(i0, i1)
    assert torch.equal(w0, w1)  # bit for bit, not allclose
    other = make_cfg(
        [
            *FAST,
            "selector=gradmatch",
            "budget=subset",
            "pretrain=full",
            "pretrain.epochs=1",
            "seed=1",
            f"paths.output_dir={tmp_path / 'other'}",
        ]
    )
    dm = build_datamodule(run_of(other))
    i2, _ = choose_subset(
        run_of(other),
        build_parts(run_of(other), dm),
        ranking_models(run_of(other), build_parts(run_of(other), dm)).models,
        seed=1,
    )
    assert not torch.equal(i0, i2)


def test_same_config_and_seed_give_the_same_soup_bit_for_bit(make_cfg, tmp_path):
    from lipt.stages.build import build_parts
    from lipt.stages.pretrain import pretrain_model

    def soup(seed: int, attempt: str) -> dict[str, torch.Tensor]:
        cfg = make_cfg(
            [
                *FAST,
                "pretrain=jigsaw",
                "pretrain.num_learners=3",
                "pretrain.local_epochs=2",
                f"paths.output_dir={tmp_path / attempt}",
            ]
        )
        result = pretrain_model(build_parts(run_of(cfg)), seed)
        return result.model.state_dict()

    first, second, other = soup(0, "a"), soup(0, "b"), soup(1, "c")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)  # bit for bit
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_same_config_and_seed_give_the_same_trained_model_bit_for_bit(make_cfg, tmp_path):
    # Main training shuffles and augments with the global RNG: without seeding it from `seed`,
    # two runs of one config train on the same subset in different orders and end apart.
    from lipt.stages.train import run

    def trained(seed: int, attempt: str) -> dict[str, torch.Tensor]:
        out = tmp_path / attempt
        run(
            validate(
                make_cfg(
                    [
                        *FAST,
                        "selector=random",
                        "budget=subset",
                        f"seed={seed}",
                        f"paths.output_dir={out}",
                    ]
                )
            )
        )
        ckpt = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        return ckpt["state_dict"]

    torch.manual_seed(123)  # whatever state the global RNG was left in must not matter
    first = trained(0, "a")
    torch.rand(7)
    second, other = trained(0, "b"), trained(1, "c")
    assert all(torch.equal(first[k], second[k]) for k in first)  # bit for bit
    assert not all(torch.equal(first[k], other[k]) for k in first)


class PreemptedError(Exception):
    """Stands for a kill: raised as epoch 2 starts, after epoch 1's checkpoint is on disk."""


@pytest.mark.parametrize(
    ("resident", "reselect_every"), [("true", 0), ("false", 0), ("true", 2), ("false", 2)]
)
def test_a_resumed_run_trains_bit_for_bit_as_an_uninterrupted_one(
    make_cfg, tmp_path, monkeypatch, resident, reselect_every
):
    """Stopped as epoch 2 starts and resumed with `ckpt_path=last`, a run must end where the
    same run never stopped ends: main training's shuffle seed is kept in the checkpoint, each
    resident loader shuffles for the trainer's epoch (a fresh one would replay epoch 0), and the
    global random states are restored (the DataLoader path shuffles with them)."""
    from lipt.models.classifier import Classifier
    from lipt.stages.train import run

    args = [
        *[o for o in FAST if not o.startswith("trainer.max_epochs")],
        "trainer.max_epochs=4",
        "selector=random",
        "budget=subset",
        "fraction=0.5",
        f"dataset.resident={resident}",
        f"reselect_every={reselect_every}",  # 2: random re-drawn, the loader reloaded at epoch 2
    ]
    clean, stopped = tmp_path / "clean", tmp_path / "stopped"
    run(validate(make_cfg([*args, f"paths.output_dir={clean}"])))

    def preempt(self: Classifier) -> None:
        if self.current_epoch == 2:
            raise PreemptedError

    with monkeypatch.context() as patch:
        patch.setattr(Classifier, "on_train_epoch_start", preempt, raising=False)
        with pytest.raises(PreemptedError):
            run(validate(make_cfg([*args, f"paths.output_dir={stopped}"])))
    torch.rand(5)  # whatever the global RNG went through in between must not matter
    run(validate(make_cfg([*args, f"paths.output_dir={stopped}", "ckpt_path=last"])))

    def model(out: Path) -> dict[str, torch.Tensor]:
        ckpt = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert ckpt["epoch"] == 3
        return ckpt["state_dict"]

    a, b = model(clean), model(stopped)
    assert all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
