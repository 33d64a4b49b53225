"""Checks of single config keys, each raising a one-line UserError that names the key and the
fix: lipt.run.config.validate and lipt.jigsaw.checks build on them. No torch, no Lightning."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from lipt.run.errors import UserError


def get_key(cfg: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except Exception as e:  # omegaconf raises MissingMandatoryValue / interpolation errors
        raise UserError(f"{key} must be set ({e.__class__.__name__}); pass {key}=...") from e


def check_number(cfg: DictConfig, key: str, kind: type, low: float, high: float, hint: str) -> None:
    value = get_key(cfg, key)
    ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok_type = isinstance(value, int) and not isinstance(value, bool)
    if not ok_type or not (low <= value <= high):
        raise UserError(f"{key}={value!r} is invalid: {hint}")


def check_positive(cfg: DictConfig, key: str, high: float, hint: str) -> None:
    value = get_key(cfg, key)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not (0 < value <= high):
        raise UserError(f"{key}={value!r} is invalid: {hint}")


def check_optim(cfg: DictConfig, prefix: str) -> None:
    """Optimiser settings under `prefix`: the `optimizer` group, or a jigsaw learner's
    pretrain.optim; each key is checked where the node has it (preflight builds the optimiser)."""
    node = get_key(cfg, prefix)
    check_positive(cfg, f"{prefix}.lr", 1e3, "use a positive learning rate, e.g. 0.1")
    if "momentum" in node:
        check_number(cfg, f"{prefix}.momentum", float, 0, 0.999999, "use a momentum in [0, 1)")
    if "weight_decay" in node:
        check_number(cfg, f"{prefix}.weight_decay", float, 0, 1e3, "use a weight decay >= 0")
    if "nesterov" in node and not isinstance(get_key(cfg, f"{prefix}.nesterov"), bool):
        raise UserError(f"{prefix}.nesterov is invalid: use true or false")
    if "scheduler" in node:  # a learner's schedule (main training's is the group `scheduler`)
        scheduler = get_key(cfg, f"{prefix}.scheduler")
        if scheduler not in ("cosine", "constant"):
            raise UserError(f"{prefix}.scheduler={scheduler!r} is invalid: use cosine or constant")
