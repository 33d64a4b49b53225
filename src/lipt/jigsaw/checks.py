"""Checks across the jigsaw keys (`pretrain=jigsaw` and groups `augment`, `prune`, `merge`),
run by lipt.run.config.validate before anything is computed, so a bad combination fails before
any job starts. Each key's own type and range is declared on the option's class
(lipt.jigsaw.parts) and checked before these run (lipt.run.groups).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lipt.core.errors import UserError


def validate_jigsaw(values: Mapping[str, Any]) -> None:
    """Raise UserError naming the first bad combination of jigsaw keys and its fix. `values`:
    the config resolved to plain values, every key set (lipt.run.config.plain)."""

    def get_key(key: str) -> Any:
        group, _, name = key.partition(".")
        return values[group].get(name)

    n = get_key("pretrain.num_learners")
    learners = get_key("pretrain.learners")
    if learners is not None:
        ids = list(learners) if not isinstance(learners, int) else [learners]
        if not ids or not all(0 <= i < n for i in ids) or len(set(ids)) != len(ids):
            raise UserError(
                f"pretrain.learners={learners!r} is invalid: use null (all learners), an id in "
                f"0..{n - 1}, or a list of distinct ids; sweep them with "
                f"'pretrain.learners=range({n})'"
            )
    merge_from = get_key("pretrain.merge_from")
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
    min_learners = get_key("pretrain.min_learners")
    if min_learners is not None and min_learners > n:
        raise UserError(
            f"pretrain.min_learners={min_learners} is invalid: use null (half) or 1..{n} "
            "(pretrain.num_learners)"
        )
    if "num_ops" in values["augment"]:  # augment=randaugment
        bins = get_key("augment.num_magnitude_bins")
        magnitude = get_key("augment.magnitude")
        if magnitude >= bins:
            raise UserError(
                f"augment.magnitude={magnitude} is invalid: use 0..{bins - 1} "
                "(below augment.num_magnitude_bins)"
            )
    low, high = get_key("prune.density_low"), get_key("prune.density_high")
    if low > high:
        raise UserError(
            f"prune.density_low={low!r}, prune.density_high={high!r} are invalid: densities are "
            "kept fractions with 0 < density_low <= density_high <= 1 (paper: 0.85, 0.95)"
        )
    ratios = get_key("merge.ratios") if "ratios" in values["merge"] else None
    if ratios is not None and not isinstance(ratios, int | str) and max(ratios, default=0) <= 0:
        raise UserError(
            f"merge.ratios={list(ratios)} is invalid: a list of ratios needs one above 0 "
            "(or a number of grid steps, or running_mean)"
        )
