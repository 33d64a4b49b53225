"""What the end of a run tells its user: the closing block's and a multirun job line's numbers,
checked against a summary computed by hand, and main training's opening line."""

from __future__ import annotations

import json
import logging
import time

import pytest
import torch

from lipt.core import console
from lipt.models.classifier import Classifier
from lipt.run.config import run_of, validate
from lipt.stages import train as train_stage
from lipt.stages.train import describe_training
from tests.helpers import FAST


def summary_of(**stages: dict) -> dict:
    return {
        "test_accuracy": 0.8342,
        "train_size": 500,
        "subset_size": 50,
        "config": {"trainer": {"max_epochs": 1}},
        "stages": stages or {"train": {"seconds": 4.3, "samples": 50}},
    }


def test_one_epoch_is_said_in_the_singular(tmp_path):
    block = console.closing_block(summary_of(), tmp_path)
    assert "50 samples, 10.0% of the whole pool's 1 epoch (500)" in block, block


def test_the_closing_block_adds_up_the_seconds_end_to_end(tmp_path):
    """Each stage's seconds and the run's whole: pre-training and selection included, as the
    frontier counts a run's cost (and the multirun job line's total)."""
    stages = {
        "pretrain": {"seconds": 21.04, "samples": 1280},
        "select": {"seconds": 1.0},
        "train": {"seconds": 4.3, "samples": 50},
    }
    block = console.closing_block(summary_of(**stages), tmp_path)
    assert "seconds           pretrain 21.0 s, select 1.0 s, train 4.3 s; 26.3 s in all" in block
    assert "  26 s  " in console.job_line(summary_of(**stages), tmp_path, "#0")
    one = console.closing_block(summary_of(), tmp_path)  # one stage: its seconds are the whole
    assert one.endswith("seconds           train 4.3 s") and "in all" not in one


def test_a_small_share_is_not_rounded_to_nothing(tmp_path):
    """22 of 55,000 is 0.04%, not 0.0%; 54,990 of 55,000 is 99.98%, not 100.0%."""
    small = {
        "test_accuracy": 0.5,
        "train_size": 55000,
        "subset_size": 22,
        "config": {"trainer": {"max_epochs": 12}},
        "stages": {"train": {"seconds": 1.0, "samples": 12 * 22}},
    }
    block = console.closing_block(small, tmp_path)
    assert "subset            22 of 55,000 (0.04%)" in block, block
    assert "264 samples, 0.04% of the whole pool's 12 epochs (660,000)" in block
    assert "trained 0.04%" in console.job_line(small, tmp_path, "#0")
    almost = {**small, "subset_size": 54990}
    assert "54,990 of 55,000 (99.98%)" in console.closing_block(almost, tmp_path)
    assert console.share_text(0.1) == "10.0%" and console.share_text(0.0) == "0.0%"
    assert console.share_text(1.0) == "100.0%" and console.share_text(0.005, 0) == "0.5%"


def test_the_opening_line_says_a_small_share_and_a_step_budget(make_cfg):
    run = run_of(make_cfg([*FAST, "budget=full_schedule"]))
    line = describe_training(run, 55, 55000, 1)
    assert "55 images (0.1% of the pool)" in line, line
    line = describe_training(run, 500, 500, 1, steps=3)
    assert line.startswith("training: ConvNet, 3 optimiser steps in 1 epoch on 500 images"), line


def test_a_step_budget_run_opens_with_the_steps_it_trains(make_cfg, caplog):
    """budget=full_schedule at 10% of 2 epochs of 16 batches: 3 steps, 96 samples, in the
    first of the 2 epochs; the line said "1 epoch on 500 images" alone."""
    args = [o for o in FAST if not o.startswith(("trainer.max_epochs", "budget="))]
    cfg = make_cfg([*args, "budget=full_schedule", "fraction=0.1", "trainer.max_epochs=2"])
    with caplog.at_level(logging.INFO, logger="lipt.stages.train"):
        summary = train_stage.run(validate(cfg))
    assert summary["stages"]["train"]["samples"] == 3 * 32
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training:")]
    assert lines and "3 optimiser steps in 1 epoch on 500 images" in lines[0], lines


def test_main_trainings_seconds_include_the_fits_set_up(make_cfg, tmp_path, monkeypatch):
    """Under DDP, the other processes start (imports, data) before the module's own clock
    does: a 2-process CPU run reported 0.15 s of a 15 s main training. Here a set-up that
    takes 2 s stands in for that start."""
    monkeypatch.setattr(Classifier, "setup", lambda self, stage: time.sleep(2.0))
    cfg = make_cfg([*FAST, "selector=random", "budget=subset"])
    summary = train_stage.run(validate(cfg))
    clock = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    seconds = summary["stages"]["train"]["seconds"]
    assert seconds >= clock["seconds_trained"] + 2.0, (seconds, clock["seconds_trained"])
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["stages"]["train"]["seconds"] == seconds


def test_the_closing_block_says_where_label_cleanings_list_is(tmp_path):
    """clean=lipt writes label_issues.csv and .png, the list a user reads next."""
    for name in ("summary.json", "label_issues.csv", "label_issues.png"):
        (tmp_path / name).write_text("x")
    block = console.closing_block(summary_of(), tmp_path)
    for name in ("label_issues.csv", "label_issues.png"):
        assert f"  {name:<17} {tmp_path / name}" in block, block


class SimulatedCrashError(RuntimeError):
    pass


def test_a_resumed_fit_opens_with_the_checkpoint_it_continues_from(make_cfg, caplog, monkeypatch):
    """A resume said "from the initial model", as if main training started over."""
    args = [*FAST, "selector=random", "budget=subset", "trainer.max_epochs=2"]
    real_step = Classifier.training_step

    def crash_in_epoch_1(self, batch, batch_idx):
        if self.current_epoch == 1:
            raise SimulatedCrashError("killed")  # after epoch 0 is checkpointed
        return real_step(self, batch, batch_idx)

    monkeypatch.setattr(Classifier, "training_step", crash_in_epoch_1)
    with pytest.raises(SimulatedCrashError):
        train_stage.run(validate(make_cfg(args)))
    monkeypatch.setattr(Classifier, "training_step", real_step)
    with caplog.at_level(logging.INFO, logger="lipt.stages.train"):
        train_stage.run(validate(make_cfg([*args, "ckpt_path=last"])))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training:")]
    assert lines and "(10% of the pool), resumed from " in lines[0], lines
    assert lines[0].endswith("checkpoints/last.ckpt") and "initial model" not in lines[0]
