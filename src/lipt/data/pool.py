"""Your own data as lipt's training pool: `PoolDataModule` wraps a map-style Dataset of
(input, label) items so that lipt's selection, re-selection, dynamic pruning and jigsaw learners
train and score on it, in any LightningModule.

It serves what lipt's own `DataModule` serves: a seeded validation split carved from the data
set (`val_size`), the pool (the rest), and the training set main training sees, the pool, a
subset of it (`set_subset`) or an epoch's plan (`epoch_subset`, dynamic pruning). Items of the
training loader are (x, y, idx, w): the item's input and label, its position in the data set and
its loss weight; every other loader gives (x, y, idx). Two data paths: a DataLoader over the
data set (its own transforms augment the training items; `eval_view`, the same items without
augmentation, is what selection scores), or, with `resident=True` and a `TensorDataset`, the
tensors copied once to the training device and sliced there, batch by batch.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from lipt.core.errors import UserError
from lipt.data.resident import ResidentBatches


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


class IndexedItems(Dataset):
    """`positions` of `dataset`: items (x, y, idx), or (x, y, idx, w) with per-sample `weights`,
    idx being the position in `dataset`."""

    def __init__(self, dataset: Any, positions: Tensor, weights: Tensor | None = None) -> None:
        assert weights is None or weights.shape == positions.shape
        self.dataset, self.positions, self.weights = dataset, positions.long(), weights

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    def __getitem__(self, i: int) -> tuple:
        idx = int(self.positions[i])
        x, y = self.dataset[idx]
        if self.weights is None:
            return x, y, idx
        return x, y, idx, self.weights[i]


def whole_on_every_rank(dataset: Dataset) -> DistributedSampler:
    """An evaluation loader's sampler: every item once, in order, on every DDP rank, as the
    resident path serves them. Lightning leaves a DistributedSampler in place; the one it would
    put in a plain loader's place pads each rank's part to equal length, so that a validation
    or test split of a size the ranks do not divide counted some items twice in its accuracy."""
    return DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)


@dataclass
class ResidentTensors:
    """A TensorDataset's inputs and labels, with a copy per device made on first use."""

    inputs: Tensor
    labels: Tensor
    _copies: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict, repr=False)

    def on(self, device: torch.device) -> tuple[Tensor, Tensor]:
        key = str(device)
        if key not in self._copies:
            self._copies[key] = (self.inputs.to(device), self.labels.long().to(device))
        return self._copies[key]


class TensorBatches(ResidentBatches):
    """Batches sliced from tensors held on the device, as they are (no normalisation, no
    augmentation); `shuffle`: training batches (x, y, idx, w) in a fresh seeded order per
    epoch, each DDP rank its own part, else (x, y, idx) in order."""

    def __init__(
        self,
        tensors: ResidentTensors,
        positions: Tensor,
        batch_size: int,
        device: torch.device,
        shuffle: bool,
        **sharding: Any,  # weights, seed, world_size, rank, epoch_source: as ResidentBatches
    ) -> None:
        super().__init__(tensors, positions, batch_size, device, mean=(), std=(), **sharding)
        self.shuffle = shuffle

    @property
    def training(self) -> bool:
        return self.shuffle

    def prepare(self, x: Tensor, generator: torch.Generator) -> Tensor:
        return x


class PoolDataModule(L.LightningDataModule):
    """A map-style `train` data set of (x, y) items as lipt's pool (see the module docstring).

    `eval_view`: the same items without augmentation (default: `train` itself), what the pool
    and validation loaders read. `val_size`: items carved from `train` as the validation split
    (a share when below 1), by `split_seed`; the jigsaw soup is scored on it. `resident`: keep a
    `TensorDataset`'s tensors on the training device (`device` when no trainer is attached).
    `seed`: the resident path's shuffling (the DataLoader path draws from the global RNG).

    Raises:
        ValueError: at construction, for data without (input, class index) items, a bad
            `val_size`, a `batch_size`, `eval_batch_size`, `num_workers`, `seed` or
            `split_seed` that is not an integer in range, or `resident` without a
            TensorDataset.
    """

    def __init__(
        self,
        train: Dataset,
        *,
        eval_view: Dataset | None = None,
        val_size: float = 0,
        split_seed: int = 0,
        batch_size: int = 128,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        resident: bool = False,
        seed: int = 0,
        device: str | None = None,
    ) -> None:
        super().__init__()
        check_labelled(train, "train")
        n = len(cast(Sized, train))
        if eval_view is not None:
            check_labelled(eval_view, "eval_view")
            if len(cast(Sized, eval_view)) != n:
                raise ValueError(
                    f"eval_view has {len(cast(Sized, eval_view))} items, train {n}: it must be "
                    "the same items without augmentation"
                )
        if resident and not isinstance(train, TensorDataset):
            raise ValueError(
                "resident=True needs a TensorDataset(inputs, labels); use resident=False for "
                f"a {type(train).__name__}"
            )
        if resident and eval_view is not None:
            raise ValueError("resident=True serves the tensors as they are: drop eval_view")
        try:  # read only without a trainer: a misspelt one would fail at the first batch
            torch.device(device or "cpu")
        except RuntimeError as e:
            raise ValueError(f'device={device!r} is no torch device: give "cpu" or "cuda"') from e
        evaluating = batch_size if eval_batch_size is None else eval_batch_size
        counts = {"batch_size": batch_size, "eval_batch_size": evaluating}
        counts.update(num_workers=num_workers, seed=seed, split_seed=split_seed)
        for key, value in counts.items():
            least = 1 if key.endswith("batch_size") else 0 if key == "num_workers" else None
            counts[key] = whole_number(key, value, least)
        n_val = validation_rows(val_size, n)
        self.train_set, self.eval_set = train, train if eval_view is None else eval_view
        self.batch_size, self.eval_batch_size = counts["batch_size"], counts["eval_batch_size"]
        self.num_workers, self.resident, self.seed, self.device = (
            counts["num_workers"],
            resident,
            counts["seed"],
            device,
        )
        split = torch.Generator().manual_seed(counts["split_seed"])
        perm = torch.randperm(n, generator=split)
        self.val_indices = perm[:n_val].sort().values
        self.pool_indices = perm[n_val:].sort().values
        self.tensors: ResidentTensors | None = None
        if resident:
            inputs, labels = cast(TensorDataset, train).tensors[:2]
            self.tensors = ResidentTensors(inputs, labels)
        self.subset_indices: Tensor | None = None  # positions in `train`
        self.subset_weights: Tensor | None = None
        # Dynamic pruning: epoch -> (indices, weights), asked whenever a training loader is made.
        self.epoch_subset: Callable[[int], tuple[Tensor, Tensor]] | None = None

    def __len__(self) -> int:
        return len(cast(Sized, self.train_set))

    def set_subset(self, indices: Tensor | None, weights: Tensor | None = None) -> None:
        """Train on `indices` (positions in `train`, outside the validation split) with loss
        `weights` (finite, >= 0; default 1); tensors, numpy arrays or lists. None: the whole
        pool.

        Raises:
            ValueError: weights of another shape than the indices, or NaN, infinite or
                negative; no index, or one outside the data set or in the validation split.
        """
        if indices is not None:
            indices = torch.as_tensor(indices).long().cpu()
            weights = torch.ones(len(indices)) if weights is None else weights
            weights = torch.as_tensor(weights).float().cpu()
            if weights.shape != indices.shape:
                raise ValueError(
                    f"weights {tuple(weights.shape)} != indices {tuple(indices.shape)}"
                )
            check_subset(indices, weights, len(self), self.val_indices)
        self.subset_indices, self.subset_weights = indices, weights

    def labels(self) -> Tensor:
        """Every item's label, int64 [N] (read item by item unless the data set holds them)."""
        held = held_labels(self.train_set)
        if held is None:
            held = torch.tensor([int(self.eval_set[i][1]) for i in range(len(self))])
        return held.long()

    # --- loaders ---------------------------------------------------------------------------

    def training_device(self) -> torch.device:
        if self.trainer is not None:
            return self.trainer.strategy.root_device
        return torch.device(self.device or "cpu")

    def trainer_epoch(self) -> int | None:
        return None if self.trainer is None else int(self.trainer.current_epoch)

    def _loader(self, dataset: Dataset, shuffle: bool, batch_size: int) -> DataLoader:
        """Training items shuffled (under DDP: Lightning's DistributedSampler), or evaluation
        items in order, all of them on every rank."""
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=None if shuffle else whole_on_every_rank(dataset),
            num_workers=self.num_workers,
            # started each epoch from the restored random state: a resume is bit for bit
            persistent_workers=False,
            pin_memory=self.training_device().type == "cuda",
        )

    def _batches(
        self,
        positions: Tensor,
        train: bool,
        weights: Tensor | None = None,
        batch_size: int | None = None,
        distributed: bool = False,
    ) -> DataLoader | TensorBatches:
        """Training batches (x, y, idx, w), shuffled, from the augmented data set, or evaluation
        batches (x, y, idx) in order from the un-augmented view. `distributed`: this DDP rank's
        part (main training on the resident path; a DataLoader gets Lightning's sampler)."""
        size = batch_size or (self.batch_size if train else self.eval_batch_size)
        if self.tensors is not None:
            world_size, rank = (1, 0)
            if distributed and self.trainer is not None:
                world_size, rank = int(self.trainer.world_size), int(self.trainer.global_rank)
            if train and weights is None:
                weights = torch.ones(len(positions))
            return TensorBatches(
                self.tensors,
                positions,
                size,
                self.training_device(),
                shuffle=train,
                weights=weights if train else None,
                seed=self.seed,
                world_size=world_size,
                rank=rank,
                epoch_source=self.trainer_epoch if distributed else None,
            )
        if train:
            weights = torch.ones(len(positions)) if weights is None else weights
            return self._loader(IndexedItems(self.train_set, positions, weights), True, size)
        return self._loader(IndexedItems(self.eval_set, positions), False, size)

    def train_dataloader(self) -> DataLoader | TensorBatches:
        epoch = self.trainer_epoch()
        if self.epoch_subset is not None and epoch is not None:
            self.set_subset(*self.epoch_subset(epoch))
        indices = self.pool_indices if self.subset_indices is None else self.subset_indices
        return self._batches(indices, True, self.subset_weights, distributed=True)

    def val_dataloader(self) -> DataLoader | TensorBatches | list:
        """The validation split, un-augmented; none (an empty list) when `val_size` is 0."""
        return self._batches(self.val_indices, False) if len(self.val_indices) else []

    def pool_dataloader(self) -> DataLoader | TensorBatches:
        """The whole pool, un-augmented, in order: what selection scores."""
        return self._batches(self.pool_indices, False)

    def eval_loader(self, positions: Tensor, batch_size: int | None = None) -> Iterable[Any]:
        """`positions`, un-augmented, in order (the jigsaw soup's held-out and BatchNorm data)."""
        return self._batches(positions, False, batch_size=batch_size)

    def shard_dataloader(self, positions: Tensor, randaugment: dict | None) -> Iterable[Any]:
        """A jigsaw learner's shard, augmented by the data set's own transforms."""
        if randaugment is not None:  # a UserError: the learner loop stops at it, not each learner
            raise UserError(
                "lipt's RandAugment is for its own image data sets; augment your items in the "
                "data set's own transforms (augment=NoAugment())"
            )
        return self._batches(positions, True)
