"""Checks on a composed config, run before anything is computed or written."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

from lipt.jigsaw.checks import validate_jigsaw
from lipt.run.checks import check_number, check_optim, get_key
from lipt.run.errors import UserError
from lipt.run.selector import SelectorSettings, selector_settings


def _selector(cfg: DictConfig) -> SelectorSettings | None:
    """The chosen selector's settings; None for a stage without a `selector` group."""
    node = cfg.get("selector")
    return None if node is None else selector_settings(node)


# The `dynamic` group's methods (lipt.dynamic.plan), by _target_; and pretrain=none's.
INFOBATCH, LIPT_BUDGET = "lipt.dynamic.InfoBatch", "lipt.dynamic.LiptBudget"
NO_PRETRAINING = "lipt.stages.pretrain.NoPretraining"


def _share(cfg: DictConfig, key: str, zero_ok: bool, one_ok: bool, hint: str) -> None:
    """`key` is a number in [0 or (0, 1] or 1), as `zero_ok` and `one_ok` say."""
    value = get_key(cfg, key)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not (
        (value >= 0 if zero_ok else value > 0) and (value <= 1 if one_ok else value < 1)
    ):
        raise UserError(f"{key}={value!r} is invalid: {hint}")


def validate_dynamic(cfg: DictConfig) -> None:
    """dynamic=infobatch / lipt: knobs in range, the whole pool (selector=full), and lipt's
    ensemble (a pre-training)."""
    node = cfg.get("dynamic")
    if node is None or "_target_" not in node:
        return
    target, name = str(node._target_), node.get("name", node._target_)
    if "ratio" in node:
        _share(cfg, "dynamic.ratio", True, False, "use a share in [0, 1), e.g. 0.5")
    _share(cfg, "dynamic.delta", False, True, "use a share of the epochs in (0, 1], e.g. 0.875")
    if "floor" in node:
        _share(cfg, "dynamic.floor", False, True, "use a share in (0, 1], e.g. 0.25")
    budget = get_key(cfg, "dynamic.budget") if "budget" in node else None
    if target == INFOBATCH and budget is not None:
        raise UserError(
            f"dynamic.budget={budget!r} is invalid: infobatch prunes by dynamic.ratio and has no "
            "budget; leave dynamic.budget=null or use dynamic=lipt"
        )
    if target == LIPT_BUDGET:
        _share(cfg, "dynamic.budget", False, True, "use a share of the full-data cost in (0, 1]")
        if str(get_key(cfg, "pretrain._target_")) == NO_PRETRAINING:
            raise UserError(
                "dynamic=lipt scores epoch 0 with the jigsaw ensemble, but pretrain=none trains "
                "none; use pretrain=jigsaw (the default) or dynamic=infobatch"
            )
    selector = _selector(cfg)
    if selector is not None and not selector.is_full:
        raise UserError(
            f"dynamic={name} prunes the whole pool every epoch, so selector={selector.label} "
            "cannot choose a subset too; use selector=full (or dynamic=none)"
        )
    if cfg.get("subset_path") is not None:
        raise UserError(f"dynamic={name} prunes the whole pool; drop subset_path")
    if selector is not None and selector.match_subset_steps:
        raise UserError(
            f"dynamic={name} sets its own cost; drop selector.match_subset_steps "
            "(approach=full_steps)"
        )


def _readable_path(key: str, path: Path, what: str, want_dir: bool) -> None:
    exists = path.is_dir() if want_dir else path.is_file()
    if not exists:
        raise UserError(f"{key}={path} does not exist; {what}")
    if not os.access(path, os.R_OK | (os.X_OK if want_dir else 0)):
        raise UserError(f"{key}={path} is not readable; fix its permissions")


def validate(cfg: DictConfig, deep: bool = True) -> None:
    """Raise UserError naming the key and the fix for the first problem found: the cheap checks
    here, then (`deep`) those that build the Trainer, the loggers and the selector and look at
    the data files (lipt.run.preflight)."""
    fraction = get_key(cfg, "fraction")
    if (
        not isinstance(fraction, (int, float))
        or isinstance(fraction, bool)
        or not 0 < fraction <= 1
    ):
        raise UserError(f"fraction={fraction!r} is invalid: use a number in (0, 1], e.g. 0.1")
    check_number(cfg, "seed", int, 0, 2**32 - 1, "use a non-negative integer")
    check_number(cfg, "reselect_every", int, 0, 10**9, "use 0 (select once) or a positive integer")
    check_number(cfg, "batch_size", int, 1, 10**7, "use a positive integer")
    check_number(cfg, "trainer.max_epochs", int, 1, 10**7, "use a positive integer")
    check_optim(cfg, "optimizer")
    if cfg.get("init_from") not in ("init", "pretrained"):
        raise UserError(f"init_from={cfg.get('init_from')!r} is invalid: use init or pretrained")
    check_number(cfg, "dataset.val_size", float, 0, 10**9, "use a count or a fraction of the data")
    if get_key(cfg, "dataset.pool_size") is not None:
        check_number(cfg, "dataset.pool_size", int, 1, 10**9, "use null (all) or a positive count")
    data_dir = get_key(cfg, "dataset.data_dir")
    if data_dir is not None:
        _readable_path(
            "dataset.data_dir",
            Path(str(data_dir)).expanduser(),
            f"point it at the {cfg.dataset.name} data",
            want_dir=True,
        )
    subset_path = cfg.get("subset_path")
    if subset_path is not None:
        path = Path(str(subset_path)).expanduser()
        _readable_path("subset_path", path, "give a subset.npz path", want_dir=False)
    ckpt_path = cfg.get("ckpt_path")
    resume_last = cfg.get("stage") == "train" and ckpt_path == "last"
    if ckpt_path is not None and not resume_last:
        what = "a pretrain.ckpt" if cfg.get("stage") == "select" else "a checkpoint or last"
        path = Path(str(ckpt_path)).expanduser()
        _readable_path("ckpt_path", path, f"give {what}", want_dir=False)
    pretrain = cfg.get("pretrain")
    if pretrain is not None and "epochs" in pretrain:  # pretrain=full
        check_number(cfg, "pretrain.epochs", int, 1, 10**6, "use a positive number of epochs")
    if pretrain is not None and "num_learners" in pretrain:  # pretrain=jigsaw
        validate_jigsaw(cfg)  # and the groups augment, prune, merge
    selector = _selector(cfg)
    if (
        selector is not None
        and selector.needs_held_out
        and float(get_key(cfg, "dataset.val_size")) == 0
    ):
        raise UserError(
            f"selector={selector.label} matches the validation split, but dataset.val_size=0; "
            "set dataset.val_size > 0 (or use gradmatch's selector.target=train)"
        )
    if cfg.get("stage") == "select" and selector is not None and selector.is_full:
        raise UserError("selector=full selects nothing; choose a selector, e.g. selector=glister")
    if selector is not None and "repeats" in cfg.selector:
        check_number(cfg, "selector.repeats", int, 1, 1000, "use a positive integer")
    validate_dynamic(cfg)
    if deep:
        from lipt.run.preflight import preflight  # imports torch, Lightning: after the cheap checks

        preflight(cfg)
