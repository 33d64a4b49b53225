"""select.py's ckpt_path: a pretrain.ckpt brought from elsewhere, as lipt.stages.pretrain loads it
(the refusals of other data, splits and models are in test_jigsaw.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from lipt.core.errors import UserError
from lipt.run.config import run_of
from lipt.stages.build import build_parts
from lipt.stages.pretrain import load_pretrained
from lipt.stages.pretrain import run as pretrain_run


def _warm_up(make_cfg: Callable[..., DictConfig], tmp_path: Path) -> Path:
    """A one-epoch warm-up's pretrain.ckpt on the synthetic data."""
    pretrain_run(run_of(_config(make_cfg, "pretrain=full", "pretrain.epochs=1")))
    return tmp_path / "pretrain.ckpt"


def _config(make_cfg: Callable[..., DictConfig], *overrides: str) -> DictConfig:
    return make_cfg(
        [
            "trainer.accelerator=cpu",
            "trainer.enable_progress_bar=false",
            "dataset=synthetic",
            "model.width=8",
            "batch_size=32",
            "logger=none",
            *overrides,
        ],
        config_name="pretrain",
    )


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod."])
def test_a_soup_saved_from_a_wrapped_model_loads_as_its_weights(make_cfg, tmp_path, prefix):
    """DDP's `module.` and torch.compile's `_orig_mod.` before every key: the same weights,
    where it was refused as missing every key of the model."""
    ckpt = _warm_up(make_cfg, tmp_path)
    payload = torch.load(ckpt, weights_only=True)
    weights = payload["state_dict"]
    payload["state_dict"] = {prefix + key: value for key, value in weights.items()}
    wrapped = tmp_path / "wrapped.ckpt"
    torch.save(payload, wrapped)
    run = run_of(_config(make_cfg, "pretrain=full"))
    model = load_pretrained(run, build_parts(run), wrapped)
    loaded = model.state_dict()
    assert loaded.keys() == weights.keys()
    assert all(torch.equal(loaded[key], weights[key]) for key in weights)


def test_a_prefix_on_some_keys_only_is_still_refused(make_cfg, tmp_path):
    ckpt = _warm_up(make_cfg, tmp_path)
    payload = torch.load(ckpt, weights_only=True)
    first = next(iter(payload["state_dict"]))
    payload["state_dict"]["module." + first] = payload["state_dict"].pop(first)
    torch.save(payload, ckpt)
    run = run_of(_config(make_cfg, "pretrain=full"))
    with pytest.raises(UserError, match=r"does not fit model=lipt\.models\.ConvNet"):
        load_pretrained(run, build_parts(run), ckpt)


def test_weights_that_record_no_data_set_are_refused_as_no_pretrain_checkpoint(make_cfg, tmp_path):
    """{"state_dict": ...} saved by a user's own code: said so, where it was "pre-trained on
    None, this run uses 'synthetic:...'"."""
    ckpt = _warm_up(make_cfg, tmp_path)
    mine = tmp_path / "mine.pt"
    torch.save({"state_dict": torch.load(ckpt, weights_only=True)["state_dict"]}, mine)
    run = run_of(_config(make_cfg, "pretrain=full"))
    with pytest.raises(UserError) as caught:
        load_pretrained(run, build_parts(run), mine)
    message = str(caught.value)
    assert "records no data set" in message and "lipt.select" in message, message
    assert "None" not in message and "\n" not in message, message
