"""Checks on a composed config, run before anything is computed or written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lipt.errors import UserError


def _get(cfg: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(cfg, key, throw_on_missing=True)
    except Exception as e:  # omegaconf raises MissingMandatoryValue / interpolation errors
        raise UserError(f"{key} must be set ({e.__class__.__name__}); pass {key}=...") from e


def _number(cfg: DictConfig, key: str, kind: type, low: float, high: float, hint: str) -> None:
    value = _get(cfg, key)
    ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok_type = isinstance(value, int) and not isinstance(value, bool)
    if not ok_type or not (low <= value <= high):
        raise UserError(f"{key}={value!r} is invalid: {hint}")


def needs_held_out(selector: DictConfig | None) -> bool:
    """Whether the selector's target is the validation split (GLISTER; GradMatch target=val)."""
    if selector is None:
        return False
    name = selector.get("name")
    return name == "glister" or (name == "gradmatch" and selector.get("target") == "val")


def validate(cfg: DictConfig) -> None:
    """Raise UserError naming the key and the fix for the first problem found."""
    fraction = _get(cfg, "fraction")
    if (
        not isinstance(fraction, (int, float))
        or isinstance(fraction, bool)
        or not 0 < fraction <= 1
    ):
        raise UserError(f"fraction={fraction!r} is invalid: use a number in (0, 1], e.g. 0.1")
    _number(cfg, "seed", int, 0, 2**32 - 1, "use a non-negative integer")
    _number(cfg, "reselect_every", int, 0, 10**9, "use 0 (select once) or a positive integer")
    _number(cfg, "batch_size", int, 1, 10**7, "use a positive integer")
    _number(cfg, "trainer.max_epochs", int, 1, 10**7, "use a positive integer")
    _number(cfg, "optim.lr", float, 0, 1e3, "use a positive learning rate")
    if cfg.get("init_from") not in ("init", "pretrained"):
        raise UserError(f"init_from={cfg.get('init_from')!r} is invalid: use init or pretrained")
    _number(cfg, "dataset.val_size", float, 0, 10**9, "use a count or a fraction of the data")
    data_dir = _get(cfg, "dataset.data_dir")
    if data_dir is not None and not Path(str(data_dir)).expanduser().is_dir():
        raise UserError(
            f"dataset.data_dir={data_dir} does not exist; point it at the {cfg.dataset.name} data"
        )
    subset_path = cfg.get("subset_path")
    if subset_path is not None and not Path(str(subset_path)).expanduser().is_file():
        raise UserError(f"subset_path={subset_path} does not exist; give a subset.npz path")
    ckpt_path = cfg.get("ckpt_path")
    resume_last = cfg.get("stage") == "train" and ckpt_path == "last"
    if (
        ckpt_path is not None
        and not resume_last
        and not Path(str(ckpt_path)).expanduser().is_file()
    ):
        what = "a pretrain.ckpt" if cfg.get("stage") == "select" else "a checkpoint or last"
        raise UserError(f"ckpt_path={ckpt_path} does not exist; give {what}")
    pretrain = cfg.get("pretrain")
    if pretrain is not None and pretrain.get("name") == "full":
        _number(cfg, "pretrain.epochs", int, 1, 10**6, "use a positive number of epochs")
    if pretrain is not None and pretrain.get("name") == "jigsaw":
        for key in ("num_learners", "batches_per_learner", "local_epochs"):
            _number(cfg, f"pretrain.{key}", int, 1, 10**7, "use a positive integer")
        from lipt.jigsaw_config import validate_jigsaw  # groups augment, prune, merge

        validate_jigsaw(cfg)
    selector = cfg.get("selector")
    if needs_held_out(selector) and float(_get(cfg, "dataset.val_size")) == 0:
        raise UserError(
            f"selector={selector.name} matches the validation split, but dataset.val_size=0; "
            "set dataset.val_size > 0 (or use gradmatch's selector.target=train)"
        )
    if selector is not None and "repeats" in selector:
        _number(cfg, "selector.repeats", int, 1, 1000, "use a positive integer")
