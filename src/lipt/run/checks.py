"""Reading a composed config for the checks (lipt.run.config, lipt.run.preflight): a key left
unset is a one-line UserError naming it; a node to build is resolved to plain values first.
No torch, no Lightning."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from lipt.core.errors import UserError


def get_key(cfg: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except Exception as e:  # omegaconf raises MissingMandatoryValue / interpolation errors
        raise UserError(f"{key} must be set ({e.__class__.__name__}); pass {key}=...") from e


def resolved(node: Any) -> Any:
    """A composed node as plain values, its interpolations resolved against the whole config
    (gradmatch's batch_size: ${batch_size}): what lipt.stages.build.build_part takes."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def innermost(e: BaseException) -> str:
    """The innermost message of a library's refusal, on one line: Hydra wraps the library's own
    error (a TypeError of a key it does not take, a ValueError of a value it refuses)."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
