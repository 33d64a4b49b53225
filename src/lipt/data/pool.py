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

from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass, field
from typing import Any, cast

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from lipt.core.errors import UserError
from lipt.data.contract import (
    check_finite_inputs,
    check_labelled,
    check_subset,
    held_labels,
    validation_rows,
    whole_number,
)
from lipt.data.resident import ResidentBatches, copy_key


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
        key = copy_key(device)
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
        ValueError: at construction, for data without (input, class index) items, a
            `TensorDataset` whose inputs hold a NaN or an infinity, a bad
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
        check_finite_inputs(train, "train")
        n = len(cast(Sized, train))
        if eval_view is not None:
            check_labelled(eval_view, "eval_view")
            check_finite_inputs(eval_view, "eval_view")
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
