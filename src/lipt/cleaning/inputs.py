"""What lipt.find_label_issues checks before any work: data with labels the model's head can
score, at least one item of each class per probe fold, and options it knows. Each refusal is a
ValueError of one line saying what is wrong and how to fix it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

import torch
from torch import Tensor

from lipt.cleaning.methods import FilterBy
from lipt.data import DataModule
from lipt.data.pool import PoolDataModule, check_labelled

# lipt.jigsaw_pretrain's keywords that `jigsaw=` may set (head, seed and accelerator are
# find_label_issues's own).
JIGSAW_OPTIONS = (
    "num_learners",
    "batches_per_learner",
    "local_epochs",
    "prune",
    "merge",
    "augment",
    "optim",
    "min_learners",
)


def pool_data(data: Any) -> PoolDataModule | DataModule:
    """A lipt data module as it is (lipt's DataModule set up); a map-style data set wrapped, a
    tenth kept for validation (what the jigsaw soup is scored on).

    Raises:
        ValueError: data that is not a map-style data set of (input, class index) items.
    """
    if isinstance(data, DataModule):
        data.setup()  # reads the data once; a no-op when it has been set up
        return data
    if isinstance(data, PoolDataModule):
        return data
    check_labelled(data, "data")
    return PoolDataModule(data, val_size=0.1)


def pool_labels(dm: PoolDataModule | DataModule) -> Tensor:
    """[N] int64: the given labels of the pool, in pool order."""
    labels = dm.train_source.labels if isinstance(dm, DataModule) else dm.labels()
    return labels[dm.pool_indices].long()


def check_options(
    folds: int, weight_decay: float, filter_by: str, jigsaw: Mapping[str, Any] | None
) -> None:
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ValueError(
            f"folds must be an integer >= 2 (the probe is cross-validated), got {folds!r}"
        )
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if filter_by not in get_args(FilterBy):
        raise ValueError(f"unknown filter_by {filter_by!r}; one of {list(get_args(FilterBy))}")
    unknown = sorted(set(jigsaw or {}) - set(JIGSAW_OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown jigsaw option {unknown[0]!r}: give lipt.jigsaw_pretrain's keywords, "
            f"one of {list(JIGSAW_OPTIONS)}"
        )


def check_labels(labels: Tensor, classes: int, folds: int, head: str) -> None:
    """`labels` [N] in 0..classes-1 (the head's outputs), and at least `folds` items of each
    class present: a class missing from a fold's training rows is one the probe cannot
    suggest, so each of its items would be flagged. A class with no item is left alone (a
    head may have spare outputs)."""
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= classes:
        bad = low if low < 0 else high
        raise ValueError(
            f"label {bad} is out of range: the model's head {head!r} gives {classes} classes, "
            f"so labels must be in 0..{classes - 1}; map the labels to class indices or give "
            "the head one output per class"
        )
    counts = torch.bincount(labels, minlength=classes)
    short = torch.nonzero((counts > 0) & (counts < folds)).flatten()
    if len(short):
        c = int(short[counts[short].argmin()])
        fewest = int(counts[c])
        fix = f"use folds={fewest}, or give" if fewest >= 2 else "give"
        raise ValueError(
            f"class {c} has {fewest} item(s) in the pool, fewer than folds={folds}: the probe's "
            f"cross-validation needs one per fold; {fix} the class at least {folds} items"
        )
