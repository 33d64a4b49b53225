"""What `ckpt_path` checks before a resumed run does any work, and what a resumed run reports:
a damaged or foreign checkpoint, changed selection settings and a checkpoint of a run with other
settings or data are refused in one line; a run stopped before it saved anything starts over;
summary.json says what the uninterrupted run says (the selecting attempt's stages, validation
accuracy, the first subset's class counts)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lipt.core.artifacts import check_lightning_checkpoint, save_checkpoint
from lipt.core.errors import UserError
from lipt.run.config import run_of, validate
from lipt.stages import train as train_stage
from lipt.stages.build import build_datamodule
from lipt.stages.result_settings import settled
from lipt.stages.resume import refuse_other_settings
from tests.helpers import FAST, SimulatedCrashError, crash_at, run_entry, start_entry

SUBSET = [*FAST, "selector=random", "budget=subset", "fraction=0.5"]
# The whole pool, every epoch: no subset file whose settings a resume would check.
WHOLE = [
    *[o for o in FAST if not o.startswith(("trainer.max_epochs", "budget="))],
    "budget=full",
    "trainer.max_epochs=2",
    "optimizer.lr=0.1",
]


def _killed(make_cfg: Any, monkeypatch: pytest.MonkeyPatch, args: list[str], epoch: int) -> None:
    crash_at(monkeypatch, epoch)
    with pytest.raises(SimulatedCrashError):
        train_stage.run(validate(make_cfg(args)))
    monkeypatch.undo()


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def _record(out: Path) -> dict[str, Any]:
    """What main training's last checkpoint records of its run (lipt.stages.resume.RunRecord)."""
    from lipt.stages.resume import RunRecord

    return torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"][
        RunRecord.KEY
    ]


def _stamp(path: Path) -> tuple[int, int, bytes]:
    return path.stat().st_ino, path.stat().st_mtime_ns, path.read_bytes()


def _no_work(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("the resume started the stages (cleaning first) before refusing")


# --- a checkpoint main training cannot resume from ------------------------------------------


def test_a_truncated_last_ckpt_is_refused_in_one_line_before_pre_training(make_cfg, tmp_path):
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    save_checkpoint(last, {"pytorch-lightning_version": "2.6.6", "state_dict": {}, "epoch": 0})
    last.write_bytes(last.read_bytes()[:100])  # a copy cut short
    args = [*SUBSET, "selector=el2n", "pretrain=jigsaw", "pretrain.num_learners=2"]
    with pytest.raises(UserError, match=r"^ckpt_path=last: .*last.ckpt is not a readable") as e:
        train_stage.run(validate(make_cfg([*args, "ckpt_path=last"])))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "learners").exists()  # nothing pre-trained


def test_a_pretrain_or_learner_checkpoint_is_refused_as_ckpt_path(make_cfg, tmp_path):
    foreign = tmp_path / "pretrain.ckpt"  # what pretrain.py and the jigsaw learners write
    save_checkpoint(foreign, {"state_dict": {"w": torch.zeros(2)}, "pretrain": "jigsaw"})
    args = [*SUBSET, "selector=el2n", "pretrain=jigsaw", "pretrain.num_learners=2"]
    with pytest.raises(UserError, match=r"not a Lightning checkpoint .*pytorch-lightning_version"):
        train_stage.run(validate(make_cfg([*args, f"ckpt_path={foreign}"])))
    assert not (tmp_path / "learners").exists() and not (tmp_path / "subset.npz").exists()
    with pytest.raises(UserError, match=f"^{re.escape(f'ckpt_path={foreign} is not a ')}"):
        check_lightning_checkpoint(foreign, f"ckpt_path={foreign}")


# --- a run stopped before it saved anything -------------------------------------------------


def _logging_to(log_file: Path) -> logging.FileHandler:
    handler = logging.FileHandler(log_file)  # as Hydra's job log: appended to by each attempt
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logging.getLogger().addHandler(handler)
    return handler


def test_ckpt_path_last_starts_over_after_an_attempt_that_saved_nothing(make_cfg, tmp_path, caplog):
    log_file = tmp_path / "train.log"
    log_file.write_text("[2020-01-01 00:00:00,000][lipt.stages.train][INFO] - training: ...\n")
    handler = _logging_to(log_file)
    try:
        with caplog.at_level(logging.INFO, logger="lipt.stages.resume"):
            summary = train_stage.run(validate(make_cfg([*FAST, "ckpt_path=last"])))
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert "nothing saved yet: starting over" in caplog.text
    assert summary["stages"]["train"]["samples"] > 0


def test_ckpt_path_last_in_a_folder_made_for_this_run_is_still_refused(make_cfg, tmp_path):
    handler = _logging_to(tmp_path / "train.log")
    try:
        logging.getLogger("lipt").warning("a record of this process")
        with pytest.raises(UserError, match=r"pass hydra\.run\.dir=<the run to resume>"):
            train_stage.run(validate(make_cfg([*FAST, "ckpt_path=last"])))
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def test_a_finished_run_stands_for_a_resume_only_with_its_own_settings(make_cfg, tmp_path):
    first = train_stage.run(validate(make_cfg(FAST)))
    # What may change between attempts (bars, loggers) leaves the finished run standing.
    again = [*FAST, "ckpt_path=last", "trainer.enable_progress_bar=true"]
    assert train_stage.run(validate(make_cfg(again))) == first
    # Another seed or selector setting would report the old run as this one.
    for changed, words in (
        ("seed=1", "seed=0, this run has seed=1"),
        ("budget.ratio=0.3", "budget.ratio=0.5, this run has budget.ratio=0.3"),
        # where the fit would end: returned the run that early stopping never cut short
        (
            "callbacks.early_stopping.patience=0",
            "callbacks.early_stopping.patience=1, this run has callbacks.early_stopping.patience=0",
        ),
    ):
        with pytest.raises(UserError, match=re.escape(words)):
            train_stage.run(validate(make_cfg([*FAST, "ckpt_path=last", changed])))


def test_early_stopping_a_run_without_validation_leaves_out_is_not_compared(make_cfg, tmp_path):
    """dataset.val_size=0: main training has no validation to stop on and leaves early stopping
    out, so another patience on a resume changes nothing; it was refused."""
    unvalidated = [*FAST, "dataset.val_size=0"]
    first = train_stage.run(validate(make_cfg(unvalidated)))
    again = [*unvalidated, "ckpt_path=last", "callbacks.early_stopping.patience=0"]
    assert train_stage.run(validate(make_cfg(again))) == first


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_resumes_by_starting_over(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *[o for o in FAST if not o.startswith(("trainer.max_epochs", "budget="))],
        "budget=full",
        "dataset.num_train=3000",
        # one epoch: the kill lands before the first epoch's checkpoint however many follow it,
        # and the resume, starting over, trains them all
        "trainer.max_epochs=1",
        f"hydra.run.dir={run_dir}",
    ]
    proc = start_entry("train.py", args)
    log_file = run_dir / "train.log"
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if log_file.is_file() and "training: " in log_file.read_text():
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before main training started"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()

    time.sleep(0.1)  # a resume starts later than the kill: the log's time stamps tell them apart
    out = run_entry("train.py", [*args, "ckpt_path=last"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "nothing saved yet: starting over" in out.stdout + out.stderr
    assert (run_dir / "summary.json").is_file()

    fresh = run_entry(
        "train.py", [*args[:-1], f"hydra.run.dir={tmp_path / 'new'}", "ckpt_path=last"]
    )
    assert fresh.returncode == 2 and "pass hydra.run.dir=<the run to resume>" in fresh.stderr


# --- a checkpoint of a run with other settings or data --------------------------------------


def test_a_whole_pool_run_resumed_with_another_lr_is_refused_before_any_work(
    make_cfg, monkeypatch, tmp_path
):
    _killed(make_cfg, monkeypatch, WHOLE, epoch=1)  # epoch 0 checkpointed, no subset.npz
    last = tmp_path / "checkpoints" / "last.ckpt"
    before = _stamp(last)
    monkeypatch.setattr(train_stage, "clean_pool", _no_work)  # the first stage after the checks
    with pytest.raises(UserError) as e:
        train_stage.run(validate(make_cfg([*WHOLE, "optimizer.lr=0.5", "ckpt_path=last"])))
    assert str(e.value) == (
        f"ckpt_path=last: {last} is of a run with optimizer.lr=0.1, this run has "
        "optimizer.lr=0.5; resume with the original settings, or pass a new hydra.run.dir to "
        "start a new run"
    )
    # Up to 3 keys named, old and new values, in one line: the epochs too (lipt's budgets and
    # schedules count main training's epochs; early stopping's patience follows them), the
    # seed, the validation split.
    others = ["seed=1", "trainer.max_epochs=3", "dataset.val_size=50", "optimizer.lr=0.5"]
    with pytest.raises(UserError, match=r"^ckpt_path=last: .* is of a run with ") as e:
        train_stage.run(validate(make_cfg([*WHOLE, *others, "ckpt_path=last"])))
    message = str(e.value)
    assert "\n" not in message and "(2 more differ); resume with the original settings" in message
    was = {"seed=0", "trainer.max_epochs=2", "dataset.val_size=100", "optimizer.lr=0.1"}
    assert sum(f"{key}," in message or f"{key} " in message for key in was) == 3
    assert sum(f"{key}," in message or f"{key} " in message for key in others) == 3
    # Another run's checkpoint, named: the same check; the remedy is to leave ckpt_path out.
    elsewhere = [*WHOLE, "optimizer.lr=0.5", f"paths.output_dir={tmp_path / 'other'}"]
    with pytest.raises(UserError, match=r"optimizer\.lr=0\.5; .* leave out ckpt_path"):
        train_stage.run(validate(make_cfg([*elsewhere, f"ckpt_path={last}"])))
    assert _stamp(last) == before and not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(
    "changed",
    [[], ["trainer.enable_progress_bar=true", "logger=csv", "model.channels_last=true"]],
    ids=["same", "how_it_runs"],
)
def test_a_whole_pool_run_resumes_with_its_settings_whatever_its_bars_and_loggers(
    make_cfg, monkeypatch, tmp_path, changed
):
    _killed(make_cfg, monkeypatch, WHOLE, epoch=1)
    record = _record(tmp_path)  # what a resume checks
    assert record["settings"]["optimizer.lr"] == 0.1 and record["settings"]["seed"] == 0
    assert record["data"] == build_datamodule(run_of(make_cfg(WHOLE))).data_name
    summary = train_stage.run(validate(make_cfg([*WHOLE, *changed, "ckpt_path=last"])))
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 1
    assert summary["stages"]["train"]["samples"] == 2 * summary["train_size"]
    if not changed:  # the record changes no training: the uninterrupted run's weights
        clean = tmp_path / "clean"
        train_stage.run(validate(make_cfg([*WHOLE, f"paths.output_dir={clean}"])))
        a, b = _weights(tmp_path), _weights(clean)
        assert all(torch.equal(a[k], b[k]) for k in a)  # bit for bit


def test_a_resume_that_changes_how_main_training_steps_is_refused_before_any_work(
    make_cfg, monkeypatch, tmp_path
):
    """The whole pool on half of a 4-epoch schedule (full_schedule: 32 steps of 32 images),
    killed in its second epoch. Resumed with +trainer.accumulate_grad_batches=2, it counted
    its budget in steps of 2 batches (round(0.5 x 4 x 8) = 16), which the checkpoint's 16
    steps of one batch had reached: it stopped at once, a quarter of the run trained, and
    summary.json reported it under the original settings. Accumulation, clipping and the
    precision are refused like any result setting, whether the first attempt set them or left
    them to Lightning; spelling out Lightning's own value is no change."""
    args = [o for o in WHOLE if not o.startswith(("budget=", "trainer.max_epochs"))]
    args += ["budget=full_schedule", "fraction=0.5", "trainer.max_epochs=4"]
    _killed(make_cfg, monkeypatch, args, epoch=1)
    last = tmp_path / "checkpoints" / "last.ckpt"
    before = _stamp(last)
    monkeypatch.setattr(train_stage, "clean_pool", _no_work)
    for changed, was in (
        ("+trainer.accumulate_grad_batches=2", "trainer.accumulate_grad_batches=1"),
        ("+trainer.gradient_clip_val=1.0", "trainer.gradient_clip_val=None"),
        ("trainer.precision=bf16-mixed", "trainer.precision=32-true"),
        # an int is a count of batches: 1 is one batch an epoch, not 1.0 (all of them)
        ("+trainer.limit_train_batches=1", "trainer.limit_train_batches=None"),
        # two processes share a step's batches: the budget's steps were counted on one
        ("trainer.devices=2", "trainer.processes=1"),
    ):
        with pytest.raises(UserError) as refused:
            train_stage.run(validate(make_cfg([*args, changed, "ckpt_path=last"])))
        message = str(refused.value)
        assert message.startswith(f"ckpt_path=last: {last} is of a run with {was}, this run has ")
        now = "trainer.processes=2" if changed == "trainer.devices=2" else changed.lstrip("+")
        assert now in message and "\n" not in message
    assert _stamp(last) == before
    monkeypatch.undo()
    # Lightning's own values, spelt out or in another of its spellings, are no change.
    same = [*args, "+trainer.accumulate_grad_batches=1", "ckpt_path=last"]
    same += ["trainer.precision=32", "+trainer.gradient_clip_val=0", "+trainer.max_steps=-1"]
    same += ["trainer.devices=auto", "+trainer.num_nodes=1"]  # one process on a CPU, as before
    summary = train_stage.run(validate(make_cfg(same)))
    assert torch.load(last, weights_only=True)["global_step"] == 32  # the budget's steps
    assert summary["stages"]["train"]["samples"] == 2 * 500  # two whole epochs of 16 steps
    # The finished run's summary.json stands only for a resume with its settings too.
    with pytest.raises(UserError, match=r"summary\.json is of a run with trainer\.accumulate"):
        train_stage.run(
            validate(make_cfg([*args, "+trainer.accumulate_grad_batches=2", "ckpt_path=last"]))
        )


def test_a_checkpoint_that_records_no_settings_resumes_as_before(make_cfg, monkeypatch, tmp_path):
    _killed(make_cfg, monkeypatch, WHOLE, epoch=1)
    last = tmp_path / "checkpoints" / "last.ckpt"
    older = torch.load(last, weights_only=True)  # as an older lipt wrote it: no record
    recorded = [key for key, state in older["callbacks"].items() if "settings" in state]
    assert recorded == ["lipt.RunRecord"]
    del older["callbacks"]["lipt.RunRecord"]
    torch.save(older, last)
    summary = train_stage.run(validate(make_cfg([*WHOLE, "optimizer.lr=0.5", "ckpt_path=last"])))
    assert torch.load(last, weights_only=True)["epoch"] == 1  # resumed, trained to the end
    assert summary["stages"]["train"]["samples"] == 2 * summary["train_size"]
    assert _record(tmp_path)["settings"]["optimizer.lr"] == 0.5  # recorded from now on


def test_a_whole_pool_resume_on_changed_image_files_is_refused(
    make_cfg, monkeypatch, tmp_path, imagefolder_dir
):
    tree = [
        "dataset=imagenet",
        f"dataset.data_dir={imagefolder_dir}",
        "dataset.num_classes=3",
        "dataset.image_size=16",
        "dataset.resize=18",
        "dataset.val_size=9",
        "dataset.num_workers=0",
        "dataset.crop_padding=2",
    ]
    args = [*WHOLE, *tree]
    _killed(make_cfg, monkeypatch, args, epoch=1)
    named = _record(tmp_path)["data"]
    folder = imagefolder_dir / "train" / "n01440764"
    shutil.copy(folder / "n01440764_0.JPEG", folder / "n01440764_extra.JPEG")  # one image more
    monkeypatch.setattr(train_stage, "clean_pool", _no_work)
    with pytest.raises(UserError, match=r"^ckpt_path=last: .* is of a run with ") as e:
        train_stage.run(validate(make_cfg([*args, "ckpt_path=last"])))
    assert f"with dataset={named}, this run has dataset=imagefolder:" in str(e.value)
    assert "; resume with the data set as it was, or pass a new hydra.run.dir" in str(e.value)


# --- what a resumed run trains on and reports -----------------------------------------------


def test_a_resume_with_other_selection_settings_is_refused(make_cfg, monkeypatch, tmp_path):
    _killed(make_cfg, monkeypatch, SUBSET, epoch=0)  # after subset.npz, before last.ckpt
    changed = [*SUBSET, "fraction=0.3", "seed=5", "ckpt_path=last"]
    with pytest.raises(
        UserError, match=r"fraction=0\.5, seed=0, this run has fraction=0\.3, seed=5"
    ):
        train_stage.run(validate(make_cfg(changed)))
    summary = train_stage.run(validate(make_cfg([*SUBSET, "ckpt_path=last"])))  # the same: runs
    assert summary["subset_size"] == 250


def test_a_lipt_resume_keeps_the_stages_the_first_attempt_recorded(make_cfg, monkeypatch, tmp_path):
    jigsaw = ["pretrain=jigsaw", "pretrain.num_learners=3", "pretrain.local_epochs=2"]
    args = [*FAST, *jigsaw, "merge.ratios=3", "budget=lipt", "trainer.max_epochs=2"]
    _killed(make_cfg, monkeypatch, args, epoch=0)  # scored, no epoch saved: re-merged on resume
    stages = tmp_path / "stages.json"
    first_attempt, before = (
        json.loads(stages.read_text()),
        (stages.stat().st_ino, stages.stat().st_mtime_ns),
    )
    resumed = train_stage.run(validate(make_cfg([*args, "ckpt_path=last"])))
    assert (stages.stat().st_ino, stages.stat().st_mtime_ns) == before  # not rewritten
    assert resumed["stages"]["pretrain"] == first_attempt["pretrain"]
    assert resumed["stages"]["score"] == first_attempt["score"]


def test_a_resume_with_nothing_left_to_train_reports_the_validation_accuracy(make_cfg, tmp_path):
    finished = train_stage.run(validate(make_cfg(FAST)))
    weights = _weights(tmp_path)
    (tmp_path / "summary.json").unlink()  # killed between the fit's end and summary.json
    resumed = train_stage.run(validate(make_cfg([*FAST, "ckpt_path=last"])))
    assert finished["val_accuracy"] is not None
    assert resumed["val_accuracy"] == finished["val_accuracy"]
    assert resumed["test_accuracy"] == finished["test_accuracy"]
    again = _weights(tmp_path)
    assert all(torch.equal(weights[k], again[k]) for k in weights)


def test_a_resumed_reselecting_run_counts_the_classes_of_its_first_subset(
    make_cfg, monkeypatch, tmp_path
):
    args = [*SUBSET, "reselect_every=1", "trainer.max_epochs=3"]
    _killed(make_cfg, monkeypatch, args, epoch=2)  # epochs 0-1 saved, re-selected after each
    resumed = train_stage.run(validate(make_cfg([*args, "ckpt_path=last"])))
    labels = build_datamodule(run_of(make_cfg(args))).train_source.labels

    def counts(path: Path) -> list[int]:
        with np.load(path) as subset:
            return torch.bincount(labels[subset["indices"]], minlength=4).tolist()

    later = counts(sorted((tmp_path / "subsets").glob("*.npz"))[-1])  # what the resume trained on
    assert later != counts(tmp_path / "subset.npz")  # else the test could not tell them apart
    assert resumed["subset_class_counts"] == counts(tmp_path / "subset.npz")


def test_unique_samples_never_exceed_the_samples_trained(make_cfg):
    # A step budget under one epoch of the whole pool: 10% of 3 epochs' steps.
    args = [o for o in FAST if not o.startswith(("trainer.max_epochs", "budget="))]
    summary = train_stage.run(
        validate(make_cfg([*args, "budget=full_steps", "fraction=0.1", "trainer.max_epochs=3"]))
    )
    train = summary["stages"]["train"]
    assert 0 < train["samples"] < summary["train_size"]
    assert train["unique_samples"] == train["samples"]


def test_where_learners_are_kept_and_how_the_model_runs_are_no_result_settings(make_cfg):
    """A resume may move the learner folder or compile the model: saved learners are checked
    by their recipe, and neither changes what the run computes."""
    cfg = make_cfg(WHOLE)
    moved = make_cfg(
        [
            *WHOLE,
            "pretrain=jigsaw",
            "pretrain.learner_dir=/elsewhere",
            "pretrain.num_threads=1",
            "model.compile=true",
        ]
    )
    jigsaw = make_cfg([*WHOLE, "pretrain=jigsaw"])
    assert settled(run_of(moved).config) == settled(run_of(jigsaw).config)
    assert settled(run_of(jigsaw).config) != settled(run_of(cfg).config)  # another pretrain


def test_a_groups_option_is_a_result_setting_where_its_other_keys_are_equal(
    make_cfg, monkeypatch, tmp_path
):
    """scheduler=linear and cosine differ only by `_target_` (and sgd and adamw at the same lr
    and weight decay): a resume with another is refused before any work, not left to fail in
    Lightning's restore or to train on under the old schedule; the target's module is not
    compared (a new lipt may move it)."""
    cfg = settled(run_of(make_cfg(WHOLE)).config)
    assert cfg["scheduler"] == "cosine" and cfg["optimizer"] == "SGD"
    for option in ("scheduler=linear", "scheduler=constant", "optimizer=adamw"):
        assert settled(run_of(make_cfg([*WHOLE, option])).config) != cfg, option
    moved = {**make_cfg(WHOLE).scheduler, "_target_": "elsewhere.schedules.cosine"}
    assert settled({**run_of(make_cfg(WHOLE)).config, "scheduler": moved}) == cfg
    _killed(make_cfg, monkeypatch, WHOLE, epoch=1)
    monkeypatch.setattr(train_stage, "clean_pool", _no_work)
    with pytest.raises(UserError, match=r"with scheduler=cosine, this run has scheduler=linear;"):
        train_stage.run(validate(make_cfg([*WHOLE, "scheduler=linear", "ckpt_path=last"])))


def test_an_older_lipts_image_folder_name_is_told_from_another_tree():
    """A subset or checkpoint of an older lipt names an ImageFolder tree without the digest of
    its files: the refusal says so, where another tree's says to resume with the data as it was."""
    now = {"dataset": "imagefolder:imagenet:2:0123456789ab:grey"}
    with pytest.raises(UserError, match=r"an older lipt's name of this ImageFolder tree, which"):
        refuse_other_settings("x is of a run with", {"dataset": "imagefolder:imagenet:2:grey"}, now)
    other = {"dataset": "imagefolder:imagenet:2:ba9876543210:grey"}
    with pytest.raises(UserError, match=r"resume with the data set as it was"):
        refuse_other_settings("x is of a run with", other, now)
