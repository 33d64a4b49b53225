"""A resume changes nothing a run computes: main training's augmentation and data path are
settings its checkpoint records, so a resume that changes them is refused in one line (the
summary would name the new ones for epochs trained under the old), while where the data, its
workers and the evaluation batches are kept may change."""

from __future__ import annotations

import re
from typing import Any

import pytest

from lipt.core.errors import UserError
from lipt.models.classifier import Classifier
from lipt.run.config import run_of, validate
from lipt.stages import train as train_stage
from lipt.stages.result_settings import DATA_KEY, settled
from lipt.stages.resume import checkpoint_path
from lipt.warmup.saved import WARMUP_DIR
from tests.helpers import FAST

# The whole pool, every epoch: the checkpoint is the only record a resume checks.
WHOLE = [
    *[o for o in FAST if not o.startswith(("trainer.max_epochs", "budget="))],
    "budget=full",
    "trainer.max_epochs=2",
]


class SimulatedCrashError(RuntimeError):
    pass


def _killed_in_epoch_1(make_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Main training raises at batch 1 of epoch 1: epoch 0 is checkpointed."""
    real_step = Classifier.training_step

    def crash(self: Classifier, batch: Any, batch_idx: int) -> Any:
        if self.current_epoch == 1 and batch_idx == 1:
            raise SimulatedCrashError("killed")
        return real_step(self, batch, batch_idx)

    monkeypatch.setattr(Classifier, "training_step", crash)
    with pytest.raises(SimulatedCrashError):
        train_stage.run(validate(make_cfg(WHOLE)))
    monkeypatch.undo()


@pytest.mark.parametrize(
    ("changed", "words"),
    [
        ("dataset.flip=false", "dataset.flip=True, this run has dataset.flip=False;"),
        ("dataset.crop_padding=3", "crop_padding=1, this run has dataset.crop_padding=3;"),
        ("dataset.resident=false", "resident=True, this run has dataset.resident=False;"),
        ("dataset.std=[0.5]", "dataset.std=[0.25], this run has dataset.std=[0.5];"),
    ],
    ids=["flip", "crop_padding", "resident", "std"],
)
def test_a_resume_that_changes_main_trainings_images_is_refused(
    make_cfg, monkeypatch, tmp_path, changed, words
):
    _killed_in_epoch_1(make_cfg, monkeypatch)
    with pytest.raises(UserError, match=re.escape(words)):
        train_stage.run(validate(make_cfg([*WHOLE, changed, "ckpt_path=last"])))
    assert not (tmp_path / "summary.json").exists()


def test_a_resume_may_change_the_data_workers_and_evaluation_batches(make_cfg, monkeypatch):
    _killed_in_epoch_1(make_cfg, monkeypatch)
    how = ["dataset.num_workers=1", "dataset.eval_batch_size=64"]
    summary = train_stage.run(validate(make_cfg([*WHOLE, *how, "ckpt_path=last"])))
    assert summary["stages"]["train"]["samples"] == 2 * summary["train_size"]


def test_a_finished_run_with_other_augmentation_does_not_stand_for_this_one(make_cfg):
    first = train_stage.run(validate(make_cfg(WHOLE)))
    assert train_stage.run(validate(make_cfg([*WHOLE, "ckpt_path=last"]))) == first
    with pytest.raises(UserError, match=re.escape("dataset.flip=True, this run has")):
        train_stage.run(validate(make_cfg([*WHOLE, "dataset.flip=false", "ckpt_path=last"])))


def test_the_data_sets_settings_never_take_the_data_names_place(make_cfg):
    """The record keeps the data set's name under DATA_KEY: no setting is filed there."""
    settings = settled(run_of(make_cfg(WHOLE)).config)
    assert DATA_KEY not in settings
    assert settings["dataset.flip"] is True and "dataset.num_workers" not in settings


def test_a_run_killed_in_its_warm_up_goes_on_from_it_as_from_saved_learners(make_cfg, tmp_path):
    """A saved warm-up (pretrain=full) is work a resume reuses, as saved learners are: not a
    folder with "nothing saved yet", and not refused where no earlier log is found."""
    warmup = tmp_path / WARMUP_DIR
    warmup.mkdir()
    (warmup / "full_0123456789abcdef.ckpt").write_bytes(b"a warm-up's epochs")
    run = run_of(make_cfg([*WHOLE, "pretrain=full", "ckpt_path=last"]))
    assert checkpoint_path(run, tmp_path) is None
