"""Reading a config key for the checks across keys (lipt.run.config, lipt.jigsaw.checks): a key
left unset is a one-line UserError naming it. No torch, no Lightning."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from lipt.run.errors import UserError


def get_key(cfg: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except Exception as e:  # omegaconf raises MissingMandatoryValue / interpolation errors
        raise UserError(f"{key} must be set ({e.__class__.__name__}); pass {key}=...") from e
