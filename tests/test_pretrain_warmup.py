"""pretrain=full (lipt.warmup.FullWarmup): what the warm-up reports and how it shows itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import lightning as L
import pytest
import torch
from omegaconf import DictConfig

from lipt.core import console
from lipt.run.config import run_of
from lipt.stages.build import build_parts


def _parts(make_cfg: Callable[..., DictConfig], *overrides: str) -> Any:
    cfg = make_cfg(
        [
            "pretrain=full",
            "pretrain.epochs=2",
            "trainer.accelerator=cpu",
            "dataset=synthetic",
            "model.width=8",
            "batch_size=32",
            "logger=none",
            *overrides,
        ],
        config_name="pretrain",
    )
    return build_parts(run_of(cfg))


def test_a_warm_up_cut_short_counts_only_the_images_it_read(make_cfg):
    """trainer.max_steps=2 (debug=fdr's): 2 batches of 32 read, where unique_samples said the
    whole pool of 500."""
    parts = _parts(make_cfg, "+trainer.max_steps=2", "trainer.enable_progress_bar=false")
    stats = parts.pretrain(parts.context, parts.dm, parts.initial_model(0), 0).stats()
    assert stats["samples"] == 64 and stats["unique_samples"] == 64, stats


def test_a_whole_warm_up_reads_the_whole_pool(make_cfg):
    parts = _parts(make_cfg, "trainer.enable_progress_bar=false")
    stats = parts.pretrain(parts.context, parts.dm, parts.initial_model(0), 0).stats()
    assert stats["samples"] == 1000 and stats["unique_samples"] == 500, stats


@pytest.mark.parametrize(("setting", "bar"), [("false", False), ("null", True), ("true", True)])
def test_the_warm_up_draws_a_bar_unless_bars_are_turned_off(make_cfg, monkeypatch, setting, bar):
    """On a terminal: trainer.enable_progress_bar=false is kept, where the warm-up drew one."""
    monkeypatch.setitem(console._state, "bars", True)  # a terminal
    parts = _parts(make_cfg, f"trainer.enable_progress_bar={setting}", "+trainer.max_steps=1")
    asked: list[Any] = []

    def trainer(**overrides: Any) -> L.Trainer:
        asked.append(overrides.get("enable_progress_bar"))
        return parts.quiet_trainer(**overrides)

    context = dataclasses.replace(parts.context, trainer=trainer)
    parts.pretrain(context, parts.dm, parts.initial_model(0), 0)
    assert asked == [bar]


def test_the_warm_up_line_says_one_epoch(make_cfg):
    parts = _parts(make_cfg, "pretrain.epochs=1")
    line = parts.pretrain.describe(parts.context, 500)
    assert line == "pre-training: full, 1 epoch on the whole pool of 500", line


class KilledError(Exception):
    """What stands in for a kill in the middle of a warm-up."""


class KillAtEpoch(L.Callback):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            raise KilledError


def _warm_up(parts: Any, kill_at: int | None = None) -> Any:
    """The warm-up from seed 0's initial model; `kill_at`: stopped as that epoch starts."""
    context = parts.context
    if kill_at is not None:

        def trainer(**overrides: Any) -> L.Trainer:
            callbacks = [*overrides.pop("callbacks", []), KillAtEpoch(kill_at)]
            return parts.quiet_trainer(callbacks=callbacks, **overrides)

        context = dataclasses.replace(context, trainer=trainer)
    return parts.pretrain(context, parts.dm, parts.initial_model(0), 0)


@pytest.mark.parametrize("resident", ["true", "false"])
def test_a_warm_up_killed_mid_way_goes_on_to_the_same_weights(make_cfg, tmp_path, resident):
    """KilledError as epoch 2 of 3 starts and run again in its folder: epochs 0-1 are not trained
    again, and the weights and counts are an uninterrupted warm-up's, bit for bit, on either
    data path. The earlier attempt's seconds are counted."""
    settings = ["pretrain.epochs=3", f"dataset.resident={resident}"]
    whole = _warm_up(_parts(make_cfg, *settings, f"paths.output_dir={tmp_path / 'whole'}"))
    killed = [*settings, f"paths.output_dir={tmp_path / 'killed'}"]
    with pytest.raises(KilledError):
        _warm_up(_parts(make_cfg, *killed), kill_at=2)
    saved = list((tmp_path / "killed" / "warmup").glob("*.ckpt"))
    assert len(saved) == 1, saved
    again = _warm_up(_parts(make_cfg, *killed), kill_at=0)  # it would stop a fresh start
    assert again.reused_seconds > 0
    assert again.stats()["samples"] == whole.stats()["samples"] == 1500
    weights, ours = whole.model.state_dict(), again.model.state_dict()
    assert all(torch.equal(weights[key], ours[key]) for key in weights)


def test_a_warm_up_of_other_settings_is_not_gone_on_from(make_cfg, tmp_path):
    """Another epoch count in the same folder: a checkpoint of its own, trained from the start
    (resuming the 3-epoch one would stop at once, its epochs done)."""
    _warm_up(_parts(make_cfg, "pretrain.epochs=3"))
    longer = _warm_up(_parts(make_cfg, "pretrain.epochs=4"))
    assert longer.reused_seconds == 0 and longer.stats()["samples"] == 2000
    assert len(list((tmp_path / "warmup").glob("*.ckpt"))) == 2
