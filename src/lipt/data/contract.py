"""What lipt asks of a data module and of a user's data set: the protocols lipt's callbacks
(`SubsetData`) and jigsaw learners (`LearnerData`) use, which lipt's `DataModule` and
`PoolDataModule` both follow, and the checks a user's data set, split sizes and subsets meet
before anything trains on them (ValueError, in a line that says how to fix it).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from lipt.core.finite import nonfinite_rows


class SubsetData(Protocol):
    """What lipt's callbacks ask of a data module: the pool (positions in the data set,
    ascending), the subset main training trains on, the hook dynamic pruning answers each epoch,
    and the un-augmented pool in order, for selection. lipt's `DataModule` and `PoolDataModule`
    both have it."""

    pool_indices: Tensor
    subset_indices: Tensor | None
    epoch_subset: Callable[[int], tuple[Tensor, Tensor]] | None

    def set_subset(self, indices: Tensor | None, weights: Tensor | None = None) -> None: ...

    def pool_dataloader(self) -> Iterable[Any]: ...


class LearnerData(Protocol):
    """What the jigsaw learners and their soup ask of a data module: the pool and the
    validation split (positions in the data set), the minibatch size, a learner's shard
    (augmented, (x, y, idx, w)) and any positions un-augmented, in order ((x, y, idx))."""

    pool_indices: Tensor
    val_indices: Tensor
    batch_size: int

    def shard_dataloader(self, positions: Tensor, randaugment: dict | None) -> Iterable[Any]: ...

    def eval_loader(self, positions: Tensor, batch_size: int | None = None) -> Iterable[Any]: ...


def check_subset_data(data: Any, user: str) -> None:
    """ValueError unless `data` is a lipt data module (`SubsetData`): `user` needs its pool."""
    if not isinstance(getattr(data, "pool_indices", None), Tensor) or not all(
        hasattr(data, name) for name in ("set_subset", "epoch_subset", "pool_dataloader")
    ):
        raise ValueError(
            f"{user} needs a lipt data module, not a {type(data).__name__}: wrap your data set "
            "in lipt.PoolDataModule(dataset, ...) and fit with that"
        )


def is_class_index(label: Any) -> bool:
    """An int >= 0, a numpy integer (what numpy-backed data sets give, collated as int64) or an
    integer tensor of no dimensions (torch.tensor(3)); not a bool."""
    if isinstance(label, bool | np.bool_):
        return False
    if isinstance(label, numbers.Integral):
        return int(label) >= 0
    if isinstance(label, Tensor):
        return label.ndim == 0 and not label.is_floating_point() and int(label) >= 0
    return False


def check_labelled(dataset: Any, name: str = "dataset") -> None:
    """ValueError unless `dataset` is a non-empty map-style data set whose items are
    (input, class index) pairs; checked on its first item, and on all labels where the data set
    holds them as a tensor (`TensorDataset`, `.targets`)."""
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise ValueError(
            f"{name} must be a map-style Dataset (with __len__ and __getitem__), "
            f"not {type(dataset).__name__}"
        )
    if len(dataset) == 0:
        raise ValueError(f"{name} is empty; give it at least one (input, label) item")
    item = dataset[0]
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise ValueError(
            f"{name}[0] is a {type(item).__name__}, not an (input, label) pair: lipt needs "
            "labelled data; make __getitem__ return (x, y) with y the class index"
        )
    if not is_class_index(item[1]):
        raise ValueError(
            f"{name}[0] has the label {item[1]!r}, not a class index: make __getitem__ return "
            "(x, y) with y an int >= 0 (a numpy integer too) or an integer tensor of no dimensions"
        )
    held = held_labels(dataset)
    if held is not None and (held.is_floating_point() or held.ndim != 1 or int(held.min()) < 0):
        low = "" if held.is_floating_point() or held.ndim != 1 else f", smallest {int(held.min())}"
        raise ValueError(
            f"{name}'s labels are not class indices ({held.dtype}, shape {tuple(held.shape)}"
            f"{low}); give a 1-d tensor of integers >= 0"
        )
    if held is not None and int(held[0]) != int(item[1]):  # lipt reads the held ones at once
        raise ValueError(
            f"{name}.targets[0] is {int(held[0])} but {name}[0]'s label is {int(item[1])}: make "
            ".targets the items' labels (or map them with the data set's target_transform)"
        )


def check_finite_inputs(dataset: Any, name: str = "dataset") -> None:
    """ValueError where a `TensorDataset`'s float inputs hold a NaN or an infinity (one pass
    over memory; other data sets are read only when trained on): one such item turns the
    loss, and through it every weight, into NaN."""
    if not isinstance(dataset, TensorDataset) or not dataset.tensors:
        return
    rows = nonfinite_rows(dataset.tensors[0])  # [K], chunk by chunk
    if len(rows):
        first = ", ".join(str(int(i)) for i in rows[:5]) + (", ..." if len(rows) > 5 else "")
        raise ValueError(
            f"{name}: the data's inputs are not finite (NaN or inf) in {len(rows)} item(s): "
            f"{first}; fix or drop those items (positions in the data set), whose loss would "
            "turn every weight into NaN"
        )


def validation_rows(val_size: Any, n: int) -> int:
    """How many of `n` items `val_size` carves out as the validation split: a count (an integer
    >= 0) or a share of the items (a float in [0, 1)); ValueError for anything else, or for a
    split that leaves no pool."""
    wrong = (
        f"val_size={val_size!r} is neither a count of items (an integer >= 0) nor a share of "
        "them (a float in [0, 1)); give one of those"
    )
    if isinstance(val_size, bool) or not isinstance(val_size, numbers.Real):
        raise ValueError(wrong)
    if isinstance(val_size, numbers.Integral):
        rows = int(val_size)
    elif 0 <= float(val_size) < 1:
        rows = round(float(val_size) * n)
    else:
        raise ValueError(wrong)
    if rows < 0:
        raise ValueError(wrong)
    if rows >= n:
        raise ValueError(
            f"val_size={val_size} leaves no pool of the {n} items; use a smaller val_size"
        )
    return rows


def whole_number(key: str, value: Any, least: int | None) -> int:
    """`value` as Python's int (a numpy integer too), at least `least` where one is given;
    ValueError naming `key` for anything else (a float, None, a str, a bool)."""
    wrong = isinstance(value, bool) or not isinstance(value, numbers.Integral)
    if wrong or (least is not None and value < least):
        at_least = "" if least is None else f" >= {least}"
        raise ValueError(f"{key} must be an integer{at_least}, got {value!r}")
    return int(value)


def held_labels(dataset: Any) -> Tensor | None:
    """Every label at once where the data set keeps them (a TensorDataset's, `.targets`), else
    None. `.targets` go through the data set's `target_transform` as its items' labels do
    (torchvision's data sets)."""
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) >= 2:
        return dataset.tensors[1]
    targets = getattr(dataset, "targets", None)
    if not isinstance(targets, Tensor | list):
        return None
    transform = getattr(dataset, "target_transform", None)
    if transform is not None:
        targets = [transform(t) for t in targets]
    if isinstance(targets, list) and not all(is_class_index(t) for t in targets):
        # class names, say, that __getitem__ maps to indices: the items' labels are read instead
        return None
    return torch.as_tensor(targets)


def check_subset(indices: Tensor, weights: Tensor, n: int, val_indices: Tensor) -> None:
    """ValueError for a subset main training cannot train on as meant: an index outside
    0..n-1 (it would fail inside a loader, mid-epoch), one in the validation split (its
    accuracy would then be measured on trained items), or a weight that is NaN, infinite or
    negative (a loss turned into NaN, or ascended); none at all (an epoch of no batches)."""
    if len(indices) == 0:
        raise ValueError("set_subset: no indices; give at least one, or None to train on the pool")
    outside = (indices < 0) | (indices >= n)
    if bool(outside.any()):
        raise ValueError(
            f"set_subset: {int(outside.sum())} index(es) outside the data set's {n} items "
            f"(first: {int(indices[outside][0])}); give positions 0..{n - 1}"
        )
    held_out = torch.isin(indices, val_indices)
    if bool(held_out.any()):
        raise ValueError(
            f"set_subset: {int(held_out.sum())} index(es) in the validation split (first: "
            f"{int(indices[held_out][0])}); choose from the pool (pool_indices), or make the "
            "data module with val_size=0 to train on every item"
        )
    bad = ~torch.isfinite(weights) | (weights < 0)
    if bool(bad.any()):
        raise ValueError(
            f"set_subset: {int(bad.sum())} weight(s) NaN, infinite or negative (first: "
            f"{float(weights[bad][0])}); give finite loss weights >= 0"
        )
