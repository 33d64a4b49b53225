"""What lipt.find_label_issues checks before any work: data with labels the model's head can
score, at least one item of each class per probe fold, inputs held in memory that are finite,
and options it knows; and what the cleaning functions check of the tensors they are given
(class-index labels, finite rows). Each refusal is a ValueError of one line saying what is
wrong and how to fix it."""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Real
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from lipt.core.finite import nonfinite_rows
from lipt.data import DataModule
from lipt.data.contract import check_labelled
from lipt.data.pool import PoolDataModule

# cleanlab.filter.find_label_issues's `filter_by` rules.
FilterBy = Literal[
    "prune_by_noise_rate", "prune_by_class", "both", "confident_learning", "predicted_neq_given"
]
# The dtypes of class-index labels.
INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)

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
    if (
        isinstance(weight_decay, bool)
        or not isinstance(weight_decay, Real)
        or not weight_decay >= 0
    ):
        raise ValueError(
            f"weight_decay must be a number >= 0 (the probe's L2 penalty), got {weight_decay!r}"
        )
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
    check_class_indices(
        labels, classes, f"the model's head {head!r}", "give the head one output per class"
    )
    short = rarest_class_below(labels, folds)
    if short is not None:
        c, fewest = short
        fix = f"use folds={fewest}, or give" if fewest >= 2 else "give"
        raise ValueError(
            f"class {c} has {fewest} item(s) in the pool, fewer than folds={folds}: the probe's "
            f"cross-validation needs one per fold; {fix} the class at least {folds} items"
        )


def rarest_class_below(labels: Tensor, folds: int) -> tuple[int, int] | None:
    """The class of `labels` [N] with the fewest items, and their count, where some class
    present has fewer than `folds` (None: every class present fills the folds)."""
    counts = torch.bincount(labels.long())  # [C]
    short = torch.nonzero((counts > 0) & (counts < folds)).flatten()
    if not len(short):
        return None
    c = int(short[counts[short].argmin()])
    return c, int(counts[c])


def check_class_indices(labels: Tensor, classes: int, source: str, fix: str) -> None:
    """`labels` [N], N >= 1, an integer tensor of class indices in 0..classes-1, the classes
    `source` gives (the model's head, the columns of probabilities); `fix`: the other way out
    of a label out of range.

    Raises:
        ValueError: labels of another dtype or shape, or a label out of range.
    """
    if labels.dtype not in INTEGER_DTYPES:
        raise ValueError(
            f"labels must be class indices, an integer tensor, not {labels.dtype}: convert "
            "them with labels.long() (and map them to 0..classes-1 first if they are not)"
        )
    if labels.ndim != 1 or labels.shape[0] == 0:
        raise ValueError(f"labels must be [N] with N >= 1, one per item, got {tuple(labels.shape)}")
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= classes:
        bad = low if low < 0 else high
        raise ValueError(
            f"label {bad} is out of range: {source} gives {classes} classes, so labels must be "
            f"in 0..{classes - 1}; map the labels to class indices or {fix}"
        )


def as_cpu_tensor(values: Any, name: str) -> Tensor:
    """`values` (a tensor on any device, a numpy array, a list) as a CPU tensor out of autograd:
    what the cleaning functions hand cleanlab, which reads numpy arrays.

    Raises:
        ValueError: values that are not numbers (class names: map them to indices first).
    """
    if isinstance(values, Tensor):
        return values.detach().cpu()
    array = np.asarray(values)
    if array.dtype.kind not in "biuf":
        hint = " (class names: map them to 0..C-1 first)" if array.dtype.kind in "USO" else ""
        raise ValueError(
            f"{name} must be numbers, a tensor or an array, not {array.dtype} values{hint}"
        )
    return torch.from_numpy(np.ascontiguousarray(array))


def class_labels(labels: Tensor, probs: Tensor) -> Tensor:
    """`labels` [N], checked as class indices of `probs`' [N, C] columns, as int64 (a uint8
    tensor would index as a mask)."""
    check_class_indices(
        labels, probs.shape[1], f"probs {tuple(probs.shape)}", "give probs a column per class"
    )
    return labels.long()


def rows_summing_to_one(probs: Tensor) -> np.ndarray:
    """`probs` [N, C] in float64, each row divided by its sum, as cleanlab checks them."""
    p = probs.double()
    return (p / p.sum(1, keepdim=True)).numpy()


def check_finite(
    values: Tensor, what: str, unit: str, fix: str, names: Tensor | None = None
) -> None:
    """Refuse `values` [N, ...] with a non-finite row, naming the first few: rows of `values`,
    or `names[row]` (e.g. positions in the data set); `unit` says what a row is.

    Raises:
        ValueError: `what` is not finite in some row.
    """
    bad = nonfinite_rows(values)
    if len(bad):
        shown = bad if names is None else names.cpu()[bad]
        first = ", ".join(str(int(i)) for i in shown[:5]) + (", ..." if len(bad) > 5 else "")
        raise ValueError(
            f"{what} are not finite (NaN or inf) in {len(bad)} {unit}(s): {first}; {fix}"
        )


def held_inputs(dm: PoolDataModule | DataModule) -> list[Tensor]:
    """The input tensors the data module's data sets hold in memory (a TensorDataset's first
    tensor, rows = positions in the data set): what is checked without reading any item."""
    if not isinstance(dm, PoolDataModule):
        return []  # lipt's own data: its readers' images
    sets = [dm.train_set] if dm.eval_set is dm.train_set else [dm.train_set, dm.eval_set]
    return [ds.tensors[0] for ds in sets if isinstance(ds, TensorDataset)]


def check_held_inputs(dm: PoolDataModule | DataModule) -> None:
    """Finite inputs where the data sets hold them (`held_inputs`): a NaN or infinite item
    gives NaN embeddings, which the probe cannot fit. One pass over memory, no model run;
    other data sets are checked on the soup's embeddings, after the pool pass."""
    for inputs in held_inputs(dm):
        check_finite(
            inputs,
            "data's inputs",
            "item",
            "fix or drop those items (positions in the data set) before finding label issues",
        )
