"""The values lipt.run.config.validate (with lipt.run.preflight) and lipt.stages.build accept and
refuse.

Configs are composed as the entry points compose them (the real configs/, the stage's config
name, then the overrides). A refused value raises UserError naming the key; an accepted one
passes every check, the Trainer, logger and selector ones included.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, WandbLogger

from lipt.core.errors import UserError
from lipt.core.job import run_dir
from lipt.core.lock import RunDirLockedError
from lipt.core.settings import SelectorSettings
from lipt.data import DataModule
from lipt.run.config import run_of, validate
from lipt.stages.build import (
    build_datamodule,
    build_loggers,
    build_model,
    build_trainer,
    quiet_trainer,
)
from tests.helpers import CONFIGS, FAST

ACCEPTED = [
    [],  # the defaults: Fashion-MNIST from the system folder, glister, jigsaw, csv
    ["fraction=1"],
    ["fraction=0.001"],
    ["optimizer.lr=1e-4", "optimizer.momentum=0", "optimizer.nesterov=false"],
    ["optimizer.weight_decay=0", "scheduler=constant"],
    ["optimizer=adamw", "scheduler=onecycle", "scheduler.anneal_strategy=linear"],
    ["trainer=cpu"],
    ["trainer=ddp", "trainer.accelerator=cpu"],
    ["callbacks=none"],
    ["logger=tensorboard"],
    ["debug=fdr"],
    ["dataset.pool_size=100"],
    ["trainer.devices=2", "trainer.strategy=ddp", "trainer.accelerator=cpu"],
    ["trainer.precision=64-true", "trainer.deterministic=true"],
    ["logger=wandb"],
    ["logger=none"],
    ["selector=random"],
    ["selector=gradmatch", "selector.target=val", "selector.lam=0"],
    ["selector=craig", "selector.greedy=stochastic"],
    ["selector=ccs", "selector.score=grand", "selector.strata=5"],
    ["selector=glister", "selector.greedy=naive", "selector.balance=false"],
    ["selector=grand", "selector.repeats=3"],
    ["pretrain.min_learners=10"],
    ["pretrain.min_learners=1", "pretrain.optim.scheduler=constant"],
    ["pretrain=full", "pretrain.epochs=1"],
    ["budget=infobatch", "pretrain=none", "budget.ratio=0", "budget.delta=1"],
    ["budget=infobatch", "pretrain=none", "budget.epochs=all"],
    ["budget=lipt", "fraction=1", "budget.floor=1"],
    ["budget=full", "pretrain=none"],
    ["budget=full_steps", "pretrain=none"],
    ["selector=random", "budget=subset"],
    ["logger=tensorboard", "+logger.tensorboard.flush_secs=30"],  # SummaryWriter's own key
    ["logger=wandb", "+logger.wandb.tags=[a,b]"],  # wandb.init's
    ["pretrain=none", "selector=random", "dataset.val_size=0"],  # no soup to score
    # a loss read the right way up; the trainer's least epochs beside an epoch budget
    ["callbacks.model_checkpoint.monitor=val/loss", "callbacks.model_checkpoint.mode=min"],
    ["budget=infobatch", "pretrain=none", "+trainer.min_epochs=1"],
    # validated within the 2 epochs InfoBatch trains at 10% of 15
    [
        "budget=infobatch",
        "pretrain=none",
        "optimized_metric=val_accuracy",
        "+trainer.check_val_every_n_epoch=2",
    ],
]

REFUSED = [
    # (overrides, words the message must hold)
    (["optimizer.lr=0"], ["optimizer.lr", "greater than 0"]),
    (["optimizer.lr=-0.1"], ["optimizer.lr"]),
    (["optimizer.momentum=1"], ["optimizer.momentum"]),
    (["optimizer.weight_decay=-1e-4"], ["optimizer.weight_decay"]),
    (["optimizer.nesterov=maybe"], ["optimizer.nesterov"]),
    (["optimizer.momentum=0"], ["optimizer settings are invalid", "Nesterov", "optimizer.*"]),
    (["optimizer=adamw", "optimizer.betas=[0.9,1.5]"], ["optimizer settings", "beta"]),
    (["+optimizer.bogus=1"], ["optimizer.bogus", "not a setting"]),
    (["scheduler=onecycle", "scheduler.pct_start=2"], ["scheduler settings", "pct_start"]),
    (["scheduler=onecycle", "scheduler.anneal_strategy=step"], ["scheduler", "anneal_strategy"]),
    (["pretrain.optim.lr=0"], ["pretrain.optim.lr"]),
    (["pretrain.optim.scheduler=step"], ["pretrain.optim.scheduler", "cosine"]),
    (["+callbacks.early_stopping.bogus=1"], ["callbacks.early_stopping", "bogus"]),
    (["callbacks.early_stopping.monitor=val/accuracy"], ["early_stopping", "val/acc, val/loss"]),
    (["dataset.pool_size=0"], ["dataset.pool_size"]),
    (["pretrain.min_learners=0"], ["pretrain.min_learners"]),
    (["pretrain.min_learners=11"], ["pretrain.min_learners", "1..10"]),
    (["trainer.precision=banana"], ["trainer", "banana"]),
    (["trainer.devices=0"], ["trainer", "devices=0"]),
    (["+trainer.bogus=1"], ["trainer", "bogus"]),
    (["trainer.strategy=nope"], ["trainer", "nope"]),
    (["+trainer.limit_train_batches=-1"], ["trainer", "limit_train_batches"]),
    (["trainer.max_epochs=0"], ["trainer.max_epochs"]),
    (["+logger.csv.bogus=1"], ["logger.csv", "bogus"]),
    (["logger.csv._target_=no.such.Logger"], ["logger=csv", "install"]),
    (["+pretrain.epochs=2"], ["pretrain=jigsaw", "pretrain.epochs", "not a setting"]),
    (["pretrain=none", "budget=full", "+pretrain.epochs=2"], ["pretrain=none", "epochs"]),
    (["+merge.bogus=1"], ["merge=", "merge.bogus", "not a setting"]),
    (["+prune.bogus=1"], ["prune=", "prune.bogus", "not a setting"]),
    (["+augment.bogus=1"], ["augment=", "augment.bogus", "not a setting"]),
    (["selector=glister", "selector.greedy=sometimes"], ["selector=glister", "greedy"]),
    (["selector=glister", "+selector.bogus=3"], ["selector=glister", "bogus"]),
    (
        ["selector=glister", "selector.eta=-0.1"],
        ["selector=glister", "selector.eta", "greater than 0"],
    ),
    (["selector=coverage", "selector.balance=maybe"], ["selector.balance"]),
    (["selector=gradmatch", "selector.target=test"], ["selector=gradmatch", "target"]),
    (["selector=ccs", "selector.hard_prune=1.5"], ["selector=ccs", "hard_prune"]),
    (["selector=ccs", "selector.score=nope"], ["selector=ccs", "nope"]),
    (["selector=grand", "selector.repeats=0"], ["selector.repeats"]),
    (["seed=-1"], ["seed"]),
    (["batch_size=0"], ["batch_size"]),
    (["reselect_every=-2"], ["reselect_every"]),
    (["init_from=soup"], ["init_from"]),
    (["dataset.val_size=-5"], ["dataset.val_size"]),
    (["dataset.data_dir=/no/such/dir"], ["dataset.data_dir", "/no/such/dir"]),
    (["dataset=cifar10", "dataset.data_dir={empty}"], ["CIFAR-10 files missing"]),
    (["dataset=imagenet", "dataset.data_dir={empty}"], ["train/ and val/"]),
    (["subset_path={empty}"], ["subset_path", "is a folder, not a file", "subset.npz"]),
    (["dataset._target_=lipt.data.Nothing"], ["dataset._target_", "cannot be imported"]),
    (["~dataset._target_"], ["dataset has no _target_", "lipt.data.DataModule"]),
    (["budget=infobatch", "budget.ratio=1"], ["budget.ratio", "less than 1"]),
    (["selector=coverage", "budget=infobatch"], ["budget=infobatch", "selector=coverage"]),
    (["+approach=coverage", "budget=full_schedule"], ["budget=full_schedule", "selector=none"]),
    (["budget=subset"], ["budget=subset", "selector=none", "subset_path"]),
    (["budget=lipt", "+budget.steps=all"], ["budget.steps", "not a setting"]),
    (["budget=full", "budget.steps=half"], ["budget.steps", "all"]),
    (["budget=lipt", "budget.delta=0"], ["budget.delta"]),
    (["pretrain=none"], ["budget=lipt", "pretrain=none", "budget=infobatch"]),
    (["budget=lipt", "+budget.bogus=1"], ["budget=lipt", "bogus"]),
    (["budget._target_=lipt.budget.Nothing"], ["budget._target_", "cannot be imported"]),
    (["selector=random", "+selector.budget_steps=true"], ["budget_steps", "selector=random"]),
    (["optimized_metric=val_accuracy", "dataset.val_size=0"], ["optimized_metric", "val_size=0"]),
    (["optimized_metric=val_accuracy", "stage=pretrain"], ["train.py's", "pretrain.py"]),
    (["optimized_metric=test_accuracy"], ["optimized_metric", "val_accuracy"]),
    (
        ["optimized_metric=val_accuracy", "+trainer.check_val_every_n_epoch=16"],
        ["trainer.check_val_every_n_epoch=16 validates nothing", "smaller"],  # 15 epochs
    ),
    (
        ["optimized_metric=val_accuracy", "+trainer.limit_val_batches=0"],
        ["optimized_metric", "trainer.limit_val_batches=0"],
    ),
    # the epochs the budget trains, not trainer.max_epochs: InfoBatch's 2 of 15 at 10%, a step
    # budget's on the pool as read (full_schedule: ceil(0.1 x 15))
    (
        [
            "optimized_metric=val_accuracy",
            "budget=infobatch",
            "pretrain=none",
            "+trainer.check_val_every_n_epoch=5",
        ],
        [
            "trainer.check_val_every_n_epoch=5 validates nothing in the 2 epochs budget=infobatch "
            "trains; set a smaller trainer.check_val_every_n_epoch (2 or less)"
        ],
    ),
    (
        [
            "optimized_metric=val_accuracy",
            "budget=full_schedule",
            "pretrain=none",
            "+trainer.check_val_every_n_epoch=3",
        ],
        ["check_val_every_n_epoch=3 validates nothing in the 2 epochs budget=full_schedule"],
    ),
    # a step budget stops the fit itself, which the trainer's least epochs or steps overrule
    (
        ["budget=full_schedule", "pretrain=none", "+trainer.min_epochs=6"],
        ["trainer.min_epochs=6", "budget=full_schedule", "drop trainer.min_epochs"],
    ),
    (
        ["budget=full_steps", "pretrain=none", "+trainer.min_steps=100"],
        ["trainer.min_steps=100", "budget=full_steps", "drop trainer.min_steps"],
    ),
    # the best checkpoint, and early stopping, by the lowest loss and the highest accuracy
    (
        ["callbacks.model_checkpoint.monitor=val/loss"],
        [
            "callbacks.model_checkpoint.monitor=val/loss with mode=max takes the highest "
            "val/loss for the best; set callbacks.model_checkpoint.mode=min"
        ],
    ),
    (
        ["callbacks.early_stopping.monitor=train/loss_epoch"],
        ["callbacks.early_stopping.monitor=train/loss_epoch", "mode=min"],
    ),
    (  # EarlyStopping's own mode, min, where the node sets none
        ["~callbacks.early_stopping.mode"],
        ["callbacks.early_stopping.monitor=val/acc with mode=min takes the lowest", "mode=max"],
    ),
    # a step budget's processes: refused before pre-training, not when main training is planned
    (
        ["budget=full_steps", "trainer.accelerator=tpu", "trainer.devices=auto"],
        ["budget=full_steps", "give trainer.devices as a number"],
    ),
    (
        ["optimized_metric=val_accuracy", "dataset=synthetic", "dataset.val_size=0.0001"],
        ["optimized_metric", "dataset.val_size=0.0001"],  # 0 of synthetic's 600 rows
    ),
    # a required key left out: named, not a constructor's TypeError
    (["~seed"], ["seed must be set"]),
    (["~dataset.mean"], ["dataset.mean must be set"]),
    (["~dataset.flip"], ["dataset.flip must be set"]),
    (["selector=glister", "~selector.name"], ["selector.name must be set"]),
    # every jigsaw merge scores its soup on the validation split
    (["dataset.val_size=0"], ["pretrain=jigsaw", "dataset.val_size=0"]),
    (["stage=pretrain", "pretrain.learners=0", "dataset.val_size=0"], ["pretrain=jigsaw"]),
    (["dataset=synthetic", "model.num_classes=3"], ["model.num_classes=3", "num_classes=4"]),
    (["dataset=synthetic", "model.in_channels=3"], ["model.in_channels=3", "channels=1"]),
    (["+logger.x=1"], ["logger.x=1 is not a logger", "_target_"]),
    (["+callbacks.x=1"], ["callbacks.x=1 is not a callback"]),
    # TensorBoard's writer takes the keys its logger class does not; wandb.init takes wandb's
    (["logger=tensorboard", "+logger.tensorboard.bogus=1"], ["logger.tensorboard", "bogus"]),
    (["logger=wandb", "+logger.wandb.bogus=1"], ["logger.wandb", "bogus"]),
]


def test_every_accepted_value_passes(tmp_path):
    """Composed as the precheck composes a sweep of them (lipt.run.composition.compose_jobs):
    the cases that choose the same groups share one composition, their plain values set by
    Hydra's own function, key for key what composing each alone gives (tests/test_dry_run.py:
    test_jobs_that_share_their_group_choices_compose_as_each_alone); ~0.3 s of CPU a case less."""
    from lipt.run.composition import compose_jobs

    jobs = [[f"paths.output_dir={tmp_path}", *overrides] for overrides in ACCEPTED]
    checked = 0
    for overrides, cfg in zip(ACCEPTED, compose_jobs("train", jobs), strict=True):
        try:
            validate(cfg)
        except UserError as e:
            raise AssertionError(f"{overrides} refused: {e}") from e
        checked += 1
    assert checked == len(ACCEPTED)


@pytest.mark.parametrize(("overrides", "words"), REFUSED, ids=lambda v: str(v)[:60])
def test_each_refused_value_names_its_key(make_cfg, tmp_path, overrides, words):
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = make_cfg([o.format(empty=empty) for o in overrides])
    with pytest.raises(UserError) as caught:
        validate(cfg)
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_an_unreadable_data_file_is_refused(make_cfg, tmp_path, monkeypatch):
    # Running as root, permissions cannot make a file unreadable: the open fails instead.
    import numpy as np

    from tests.helpers import write_idx

    data = tmp_path / "fm"
    data.mkdir()
    for stem in ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte"):
        write_idx(data / stem, np.zeros((2, 28, 28), np.uint8))
    for stem in ("train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"):
        write_idx(data / stem, np.zeros(2, np.uint8))
    cfg = make_cfg([f"dataset.data_dir={data}", "dataset.download=false"])
    validate(cfg)  # present and readable
    real_open = open

    def broken_open(path, *args, **kwargs):
        if str(path).startswith(str(data)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", broken_open)
    with pytest.raises(UserError, match="not readable"):
        validate(cfg)


def test_missing_fashion_mnist_is_refused_unless_it_can_be_downloaded(
    make_cfg, tmp_path, monkeypatch
):
    monkeypatch.setattr("lipt.data.sources.FASHION_MNIST_SYSTEM_DIR", tmp_path / "none")
    with pytest.raises(UserError, match=f"dataset.data_dir={tmp_path} holds no Fashion-MNIST"):
        validate(make_cfg(["dataset.download=false", f"dataset.data_dir={tmp_path}"]))
    with pytest.raises(UserError, match="Fashion-MNIST not found"):
        validate(make_cfg([]))  # no data_dir to download into
    validate(make_cfg([f"dataset.data_dir={tmp_path}"]))  # downloads into it: passes


def test_every_stage_config_is_checked_the_same(make_cfg):
    for name in ("train", "select", "pretrain"):
        with pytest.raises(UserError, match=r"optimizer\.lr"):
            validate(make_cfg(["optimizer.lr=0"], config_name=name))
        with pytest.raises(UserError, match="trainer"):
            validate(make_cfg(["trainer.precision=banana"], config_name=name))


# --------------------------------------------------------------------------- lipt.stages.build


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], {"max_epochs": 1, "num_devices": 1}),
        (["trainer.max_epochs=4"], {"max_epochs": 4}),
        (["trainer.devices=2", "trainer.strategy=ddp"], {"num_devices": 2}),
        (["trainer.log_every_n_steps=3"], {"log_every_n_steps": 3}),
    ],
)
def test_build_trainer_takes_the_trainer_group(make_cfg, overrides, expected):
    trainer = build_trainer(run_of(make_cfg([*FAST, *overrides])), logger=False)
    for key, value in expected.items():
        assert getattr(trainer, key) == value, key


def test_build_trainer_overrides_win_and_checkpoints_are_atomic(make_cfg, tmp_path):
    from lipt.core.artifacts import AtomicCheckpointIO

    trainer = build_trainer(
        run_of(make_cfg([*FAST, "trainer.max_epochs=9"])), max_epochs=2, logger=False
    )
    assert trainer.max_epochs == 2
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert Path(trainer.default_root_dir) == tmp_path


def test_quiet_trainer_is_single_device_without_logger_or_checkpoints(make_cfg):
    trainer = quiet_trainer(run_of(make_cfg([*FAST, "trainer.devices=2", "trainer.strategy=ddp"])))
    assert trainer.num_devices == 1 and trainer.loggers == []
    assert trainer.checkpoint_callback is None and trainer.limit_val_batches == 0


@pytest.mark.parametrize(
    ("logger", "types"),
    [("csv", [CSVLogger]), ("wandb", [WandbLogger]), ("none", [])],
)
def test_build_loggers_follows_the_logger_group(make_cfg, tmp_path, logger, types):
    loggers = build_loggers(run_of(make_cfg([*FAST, f"logger={logger}"])))
    assert [type(lg) for lg in loggers] == types
    for lg in loggers:
        assert Path(lg.save_dir) == tmp_path  # inside the run folder


def test_build_model_is_a_function_of_the_seed(make_cfg):
    cfg = make_cfg([*FAST, "model.width=16"])
    torch.manual_seed(5)
    before = torch.get_rng_state()
    a = build_model(run_of(cfg), 0).state_dict()
    assert torch.equal(torch.get_rng_state(), before)  # the global generator was left alone
    torch.rand(100)  # and its state does not matter
    b, c = build_model(run_of(cfg), 0).state_dict(), build_model(run_of(cfg), 1).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


def test_run_dir_creates_and_locks_the_folder(make_cfg, tmp_path):
    import subprocess
    import sys

    cfg = make_cfg([*FAST, f"paths.output_dir={tmp_path / 'run'}"])
    folder = run_dir(run_of(cfg).folder)
    assert (
        folder.is_dir() and run_dir(run_of(cfg).folder) == folder
    )  # this process may call it again
    probe = (
        "import sys; from pathlib import Path; from lipt.core.lock import lock_run_dir\n"
        "lock_run_dir(Path(sys.argv[1]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(folder)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0 and RunDirLockedError.__name__ in out.stderr
    assert "in use by another lipt run" in out.stderr


# What the stages ask of each selector option (SelectorSettings.of: the one place that reads
# selector.name to choose code): (budget chosen, needs_model, needs_held_out); None: selects
# nothing (selector=none).
SELECTOR_SETTINGS = [
    (["selector=none"], ("lipt", None)),
    (["selector=random"], ("subset", (False, False))),
    (["selector=random_balanced"], ("subset", (False, False))),
    (["selector=glister"], ("subset", (True, True))),
    (["selector=gradmatch"], ("subset", (True, False))),
    (["selector=gradmatch", "selector.target=val"], ("subset", (True, True))),
    (["selector=coverage"], ("subset", (True, False))),
    (["selector=craig"], ("subset", (True, False))),
    (["selector=ccs"], ("subset", (True, False))),
    (["selector=el2n"], ("subset", (True, False))),
    (["selector=uncertainty"], ("subset", (True, False))),
    (["selector=grand"], ("subset", (True, False))),
]


@pytest.mark.parametrize(("overrides", "expected"), SELECTOR_SETTINGS)
def test_selector_settings_of_each_option(make_cfg, overrides, expected):
    cfg = make_cfg(overrides)
    settings = SelectorSettings.of(cfg.selector)
    flags = None if settings is None else (settings.needs_model, settings.needs_held_out)
    assert (cfg.budget.name, flags) == expected
    assert settings is None or settings.name == cfg.selector.name


# Each budget option's arithmetic on the Fashion-MNIST pool (55,000 rows, batches of 256: 215 a
# epoch) at 10% of 12 epochs: (epochs, optimiser steps that end the fit).
BUDGET_SCHEDULES = [
    ("subset", 55_000, (12, None)),
    ("full", 55_000, (12, None)),
    ("full_steps", 55_000, (12, 12 * 22)),  # 5,500 rows: 22 batches an epoch
    ("full_schedule", 55_000, (2, 258)),  # round(0.1 * 12 * 215) steps
    ("full_schedule", 50_000, (2, 258)),  # a cleaned pool: the same steps, 196 a epoch
    ("infobatch", 55_000, (2, None)),  # round(0.1 * 12 / 0.7)
    ("infobatch_soup", 55_000, (2, None)),  # as infobatch's
    ("lipt", 55_000, (12, None)),
]


@pytest.mark.parametrize(("option", "pool", "expected"), BUDGET_SCHEDULES)
def test_each_budget_option_owns_its_arithmetic(make_cfg, option, pool, expected):
    from lipt.budget import PoolSizes
    from lipt.run.config import run_of

    args = [f"budget={option}", "fraction=0.1", "trainer.max_epochs=12", "batch_size=256"]
    run = run_of(make_cfg([*args, *(["selector=random"] if option == "subset" else [])]))
    sizes = PoolSizes(pool, 55_000, 256, 12, 0.1)
    schedule = run.budget.schedule(sizes)
    assert (schedule.epochs, schedule.steps) == expected
    assert run.budget.trains_subset == (option == "subset")
    assert run.prunes == (option in ("infobatch", "infobatch_soup", "lipt"))


def test_budget_options_are_all_tested():
    options = {p.stem for p in (CONFIGS / "budget").glob("*.yaml")}
    assert options == {option for option, _, _ in BUDGET_SCHEDULES}


def test_selector_settings_cover_every_selector_option():
    options = {p.stem for p in (CONFIGS / "selector").glob("*.yaml")}
    tested = {o.split("=")[1] for overrides, _ in SELECTOR_SETTINGS for o in overrides[:1]}
    assert options <= tested


class TaggedDataModule(DataModule):
    """A user's own data module, named by `dataset._target_`."""


def test_the_dataset_node_builds_the_data_module_its_target_names(make_cfg):
    cfg = make_cfg(
        ["dataset=synthetic", "batch_size=32", f"dataset._target_={__name__}.TaggedDataModule"]
    )
    run = validate(cfg)
    dm = build_datamodule(run)
    assert type(dm) is TaggedDataModule
    # every data-module key of the node reaches it; the top-level batch size too
    assert dm.batch_size == 32 and dm.mean == list(cfg.dataset.mean)
    assert dm.num_classes == cfg.dataset.num_classes and dm.val_size == cfg.dataset.val_size
    assert len(dm.pool_indices) == cfg.dataset.num_train - cfg.dataset.val_size


def test_a_data_dir_is_a_folder_and_one_to_download_into_is_made_first(
    make_cfg, tmp_path, fashion_mnist_dir, monkeypatch
):
    """dataset.data_dir naming a file was "does not exist"; a folder not made yet, with
    dataset.download=true (what Fashion-MNIST's message offers: "a DIR to download into"), was
    refused the same way, without saying how. A file is named a file; a missing folder is
    refused (a misspelt one is not filled with a download), saying to create it, and once made
    the download fills it (torchvision's, stood in for here: no network in tests)."""
    import shutil

    import torchvision.datasets

    a_file = tmp_path / "labels.txt"
    a_file.write_text("not a folder\n")
    with pytest.raises(UserError) as refused:
        validate(make_cfg([f"dataset.data_dir={a_file}"]), deep=False)
    assert str(refused.value) == (
        f"dataset.data_dir={a_file} is a file, not a folder; point it at the fashion_mnist data"
    )
    new = tmp_path / "data" / "fashion-mnist"
    for download, then in (("true", ""), ("false", " and set dataset.download=true")):
        with pytest.raises(UserError) as refused:
            validate(make_cfg([f"dataset.data_dir={new}", f"dataset.download={download}"]))
        assert str(refused.value) == (
            f"dataset.data_dir={new} does not exist; point it at the fashion_mnist data, or "
            f"create it (mkdir -p {new}){then} to download the data into it"
        )
    with pytest.raises(UserError, match=r"dataset.data_dir=/no/such/dir does not exist; point"):
        validate(make_cfg(["dataset=cifar10", "dataset.data_dir=/no/such/dir"]), deep=False)
    assert not new.exists()

    def download(root: str, train: bool, download: bool) -> None:  # as torchvision's lays it out
        raw = Path(root) / "FashionMNIST" / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for path in fashion_mnist_dir.glob(f"{'train' if train else 't10k'}-*"):
            shutil.copy(path, raw / path.name)

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", download)
    new.mkdir(parents=True)  # as the message says
    dm = build_datamodule(validate(make_cfg([f"dataset.data_dir={new}", "dataset.val_size=50"])))
    assert len(dm.pool_indices) == 250 and (new / "FashionMNIST" / "raw").is_dir()
