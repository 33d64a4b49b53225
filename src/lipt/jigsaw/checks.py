"""Checks of the jigsaw keys (`pretrain=jigsaw` and groups `augment`, `prune`, `merge`), run by
lipt.run.config.validate before anything is computed, so a bad value fails before any job starts.

Kept apart from the stage so that checking a config does not import torch or Lightning. Which
prune/merge/augment option runs is the group's `_target_` (an unknown option fails when Hydra
composes); these checks look at the values of the keys an option has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig

from lipt.jigsaw import SEARCHES
from lipt.run.checks import check_number, check_optim, get_key
from lipt.run.errors import UserError


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_jigsaw(cfg: DictConfig) -> None:
    """Raise UserError naming the first bad jigsaw key and its fix."""
    for key in ("num_learners", "batches_per_learner", "local_epochs"):
        check_number(cfg, f"pretrain.{key}", int, 1, 10**7, "use a positive integer")
    n = get_key(cfg, "pretrain.num_learners")
    learners = get_key(cfg, "pretrain.learners")
    if learners is not None:
        ids = list(learners) if isinstance(learners, ListConfig | list) else [learners]
        if not ids or not all(_is_int(i) and 0 <= i < n for i in ids) or len(set(ids)) != len(ids):
            raise UserError(
                f"pretrain.learners={learners!r} is invalid: use null (all learners), an id in "
                f"0..{n - 1}, or a list of distinct ids; sweep them with "
                f"'pretrain.learners=range({n})'"
            )
    merge_from = get_key(cfg, "pretrain.merge_from")
    if merge_from is not None:
        if learners is not None:
            raise UserError(
                "pretrain.merge_from merges saved learners and pretrain.learners trains some: "
                "set only one of them"
            )
        if not Path(str(merge_from)).expanduser().is_dir():
            raise UserError(
                f"pretrain.merge_from={merge_from} is not a folder; give the folder holding "
                "learner_<i>.ckpt (e.g. <sweep dir>/learners)"
            )
    if get_key(cfg, "pretrain.num_threads") is not None:
        check_number(cfg, "pretrain.num_threads", int, 1, 4096, "use null or a positive integer")
    check_optim(cfg, "pretrain.optim")
    min_learners = get_key(cfg, "pretrain.min_learners")
    if min_learners is not None:
        check_number(cfg, "pretrain.min_learners", int, 1, n, f"use null (half) or 1..{n}")

    if "num_ops" in cfg.augment:  # augment=randaugment
        check_number(cfg, "augment.num_ops", int, 0, 14, "use 0..14 (RandAugment has 14 ops)")
        bins = get_key(cfg, "augment.num_magnitude_bins")
        check_number(cfg, "augment.num_magnitude_bins", int, 2, 10**4, "use an integer >= 2")
        check_number(cfg, "augment.magnitude", int, 0, bins - 1, f"use 0..{bins - 1}")

    low, high = get_key(cfg, "prune.density_low"), get_key(cfg, "prune.density_high")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high))
    if not numbers or not 0 < low <= high <= 1:
        raise UserError(
            f"prune.density_low={low!r}, prune.density_high={high!r} are invalid: densities are "
            "kept fractions with 0 < density_low <= density_high <= 1 (paper: 0.85, 0.95)"
        )

    if "ratios" in cfg.merge:  # merge=greedy_interp
        _check_ratios(get_key(cfg, "merge.ratios"))
    if "search" in cfg.merge and get_key(cfg, "merge.search") not in SEARCHES:
        raise UserError(
            f"merge.search={get_key(cfg, 'merge.search')!r} is invalid: use grid (every ratio) "
            "or scan (from the smallest ratio up, stopping at the first drop)"
        )
    if not isinstance(get_key(cfg, "merge.recompute_bn"), bool):
        raise UserError("merge.recompute_bn is invalid: use true or false")
    check_number(cfg, "merge.bn_batches", int, 1, 10**6, "use a positive number of minibatches")
    if get_key(cfg, "merge.eval_size") is not None:
        check_number(cfg, "merge.eval_size", int, 1, 10**9, "use null (whole split) or a count")


def _check_ratios(ratios: Any) -> None:
    hint = (
        f"merge.ratios={ratios!r} is invalid: use a number of grid steps (20: alpha in "
        "0.05..1), a list of ratios in [0, 1] with one > 0, or running_mean"
    )
    if ratios == "running_mean":
        return
    if _is_int(ratios):
        if ratios < 1:
            raise UserError(hint)
        return
    if not isinstance(ratios, ListConfig | list) or not ratios:
        raise UserError(hint)
    values = list(ratios)
    numbers = all(isinstance(r, int | float) and not isinstance(r, bool) for r in values)
    if not numbers or not all(0 <= r <= 1 for r in values) or max(values) <= 0:
        raise UserError(hint)
