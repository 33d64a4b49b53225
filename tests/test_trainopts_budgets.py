"""Lightning's trainer options where they meet lipt's budgets: a step budget beside
trainer.max_steps, and a trainer.limit_train_batches share that leaves main training's epoch no
batch."""

from __future__ import annotations

import math

import pytest
import torch

from lipt.budget import Schedule
from lipt.core.errors import UserError
from lipt.run.config import validate
from lipt.stages import train as train_stage
from lipt.stages.training_plan import check_validation_fits, schedule_of, validations_per_epoch
from tests.helpers import FAST

# FAST's pool: 500 rows, 16 batches of 32. budget=full_schedule at 50% of 3 epochs: 24 steps.
POOL = 500
HALF_SCHEDULE = [*FAST, "budget=full_schedule", "fraction=0.5", "trainer.max_epochs=3"]


def test_a_step_budget_ends_its_schedule_at_trainer_max_steps(make_cfg, tmp_path):
    """Lightning stops the fit at trainer.max_steps, but a step budget's cosine ran over the
    budget's 24 steps: it stopped at 5 with the learning rate at 0.09 of 0.1 (budget=full's
    own schedule, Lightning's estimate, ends at max_steps), the line announcing 24 steps."""
    run = validate(make_cfg([*HALF_SCHEDULE, "+trainer.max_steps=5"]))
    assert schedule_of(run, POOL, POOL) == Schedule(1, 5)
    assert schedule_of(validate(make_cfg(HALF_SCHEDULE)), POOL, POOL) == Schedule(2, 24)
    # A limit above the budget, or Lightning's -1 (none), leaves it as it is.
    for most in (-1, 24, 100):
        run = validate(make_cfg([*HALF_SCHEDULE, f"+trainer.max_steps={most}"]))
        assert schedule_of(run, POOL, POOL) == Schedule(2, 24)
    train_stage.run(validate(make_cfg([*HALF_SCHEDULE, "+trainer.max_steps=5"])))
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 5
    schedule = ckpt["lr_schedulers"][0]  # the cosine ends at zero on the last step
    assert schedule["T_max"] == 5 and schedule["_last_lr"][0] == pytest.approx(0)


@pytest.mark.parametrize(
    ("overrides", "whole", "least"),
    [
        (["budget=infobatch", "trainer.max_epochs=2"], 16, 0.063),  # the whole pool
        # InfoBatch's pruned epochs: as few as 250 rows of 500 (every row at or above the
        # mean, half the others), 8 batches; Lightning failed at the first of them.
        (["budget=infobatch", "budget.epochs=all", "trainer.max_epochs=15"], 8, 0.125),
    ],
)
def test_a_limit_share_that_leaves_main_training_no_batch_is_refused(
    make_cfg, overrides, whole, least
):
    """Lightning refuses a trainer.limit_train_batches share of fewer batches than make one
    (int(share x batches) = 0) with a traceback when the fit starts, after pre-training and
    selection, or mid-run at the first pruned epoch that short. Refused in one line now, with a
    share that trains one batch (Lightning's own hint, 1 / batches, may round to none)."""
    args = [*FAST, *overrides]
    short = validate(make_cfg([*args, "+trainer.limit_train_batches=0.05"]))
    with pytest.raises(UserError, match=rf"int\(0.05 x {whole}\) = 0 of main training's"):
        check_validation_fits(short, POOL)
    assert math.floor(whole * least) >= 1
    check_validation_fits(
        validate(make_cfg([*args, f"+trainer.limit_train_batches={least}"])), POOL
    )
    for limit in ("1", "0.0"):  # a number of batches; no training, as Lightning allows it
        check_validation_fits(
            validate(make_cfg([*args, f"+trainer.limit_train_batches={limit}"])), POOL
        )


def test_a_subset_too_small_for_a_limit_share_is_refused_before_main_training(make_cfg, tmp_path):
    """A 10% subset of 50 rows is 2 batches: a 0.05 share of them trains none. Refused once it
    is selected, before main training, with the way to keep the subset."""
    cfg = make_cfg([*FAST, "selector=random", "budget=subset", "+trainer.limit_train_batches=0.05"])
    with pytest.raises(UserError, match=r"int\(0.05 x 2\) = 0 .*keeps its subset"):
        train_stage.run(validate(cfg))
    assert (tmp_path / "subset.npz").is_file()
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(
    ("every", "batches", "validations"),
    [
        (None, 16, 1),
        (1.0, 16, 1),
        (1, 16, 16),
        (5, 16, 3),  # after batches 5, 10 and 15
        (20, 16, 1),  # across epochs (check_val_every_n_epoch=null): fewer than one
        (0.25, 16, 4),
        (0.3, 17, 3),  # every int(17 x 0.3) = 5 batches
        (0.0, 16, 16),  # every batch
        ("00:00:10:00", 16, 1),  # by the clock
    ],
)
def test_the_validations_of_an_epoch_are_counted_as_lightning_runs_them(
    every, batches, validations
):
    node = {} if every is None else {"val_check_interval": every}
    assert validations_per_epoch(node, batches) == validations


def test_validations_within_epochs_leave_the_default_early_stop_that_never_stops(
    make_cfg, tmp_path
):
    """The `callbacks` group's early stop waits `patience` epochs, by default the run's own, so
    it never stops a run; Lightning counts patience in validations, so a validation every batch
    (+trainer.val_check_interval=1) stopped a 2-epoch run after 3 of its 32 batches. An
    explicit patience is in epochs too."""
    args = [*FAST, "budget=full", "trainer.max_epochs=2", "+trainer.val_check_interval=1"]
    summary = train_stage.run(validate(make_cfg(args)))
    assert summary["stages"]["train"]["samples"] == 2 * POOL
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 32
    stop = [c for c in ckpt["callbacks"].values() if "patience" in c]
    assert [c["patience"] for c in stop] == [2 * 16]


def test_an_epoch_of_one_batch_is_told_to_give_a_number_of_batches(make_cfg):
    """lipt's pruning at 10% of 2 epochs keeps as few as 21 rows an epoch, one batch: no share
    below 1 trains it, so the fix offered is a number of batches (not "1.0 or more", which
    Lightning refuses above 1)."""
    args = [*FAST, "budget=lipt", "pretrain=jigsaw", "trainer.max_epochs=2"]
    args += ["pretrain.batches_per_learner=10"]  # the learners' epochs are trained under it too
    run = validate(make_cfg([*args, "+trainer.limit_train_batches=0.1"]))
    with pytest.raises(UserError, match=r"1 batch an epoch .*; give a number of batches \("):
        check_validation_fits(run, POOL)
