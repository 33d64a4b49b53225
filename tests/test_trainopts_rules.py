"""Trainer options Lightning takes but fails on mid-fit, or runs other than they read: refused
in one line before any stage (lipt.core.settings.TrainerOptions, lipt.run.rules)."""

from __future__ import annotations

import pytest
import torch

from lipt.core.errors import UserError
from lipt.run.config import validate


def refusal(make_cfg, overrides: list[str]) -> str:
    with pytest.raises(UserError) as caught:
        validate(make_cfg(overrides), deep=True, build=False)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "override",
    [
        "+trainer.accumulate_grad_batches=0",
        "+trainer.accumulate_grad_batches=-1",
        "+trainer.check_val_every_n_epoch=0",
        "+trainer.val_check_interval=0",
        "+trainer.val_check_interval=-2",
        "+trainer.val_check_interval=-0.5",
    ],
)
def test_counts_below_one_are_refused(make_cfg, override):
    key = override.split("=")[0].lstrip("+")
    assert key in refusal(make_cfg, [override])


@pytest.mark.parametrize(
    "override",
    [
        "+trainer.accumulate_grad_batches=4",
        "+trainer.check_val_every_n_epoch=2",
        "+trainer.check_val_every_n_epoch=null",
        "+trainer.val_check_interval=3",
        "+trainer.val_check_interval=0.5",
        "+trainer.val_check_interval=0.0",  # Lightning validates after every batch
    ],
)
def test_counts_lightning_runs_pass(make_cfg, override):
    validate(make_cfg([override]), deep=True, build=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="float16 runs on a GPU")
@pytest.mark.parametrize("precision", ["16-mixed", "16"])
def test_float16_on_the_cpu_is_refused(make_cfg, precision):
    message = refusal(make_cfg, [f"trainer.precision={precision}"])
    assert f"trainer.precision={precision}" in message and "bf16-mixed" in message


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_other_precisions_pass_on_the_cpu(make_cfg, precision):
    validate(make_cfg([f"trainer.precision={precision}"]), deep=True, build=False)


def test_a_limit_share_that_leaves_a_jigsaw_learner_no_batch_is_refused(make_cfg):
    args = ["budget=lipt", "pretrain=jigsaw", "+trainer.limit_train_batches=0.2"]
    message = refusal(make_cfg, args)
    assert "pretrain.batches_per_learner=1" in message and "limit_train_batches=1" in message
    shared = refusal(make_cfg, [*args, "pretrain.batches_per_learner=3"])
    assert "0.34 or more" in shared, shared
    validate(make_cfg([*args, "pretrain.batches_per_learner=5"]), deep=True, build=False)
    # without pre-training the learners' M reads nothing
    validate(
        make_cfg(["budget=full", "pretrain=none", "+trainer.limit_train_batches=0.2"]), build=False
    )


def test_an_overfit_share_that_leaves_main_training_no_batch_is_refused(make_cfg):
    """trainer.overfit_batches takes the limit's place: a share of it is named, not divided by
    zero."""
    from lipt.stages.training_plan import check_validation_fits

    args = ["dataset=synthetic", "budget=full", "pretrain=none", "+trainer.overfit_batches=0.01"]
    run = validate(make_cfg(args), deep=True, build=False)
    with pytest.raises(UserError, match=r"trainer.overfit_batches=0.01 trains int\(0.01 x "):
        check_validation_fits(run, 500)
