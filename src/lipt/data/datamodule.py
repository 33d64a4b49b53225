"""The Lightning DataModule: one training pool, a seeded validation split carved from the
training set, the test split, and the (indices, weights) subset main training sees.

Two data paths give the same items: data sets held in memory (TensorImages) are served from a
copy on the training device, batches sliced and augmented there (lipt.data.resident, the
default: `dataset.resident=true`); anything else, or `dataset.resident=false`, goes through
a DataLoader with per-sample torchvision transforms and workers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lipt.core.errors import UserError
from lipt.data.batch_transforms import RANDAUGMENT_CHANNELS, RandAugmentSettings
from lipt.data.noise import LabelChanges, flip_labels, read_train_labels
from lipt.data.pool import whole_on_every_rank
from lipt.data.resident import Augmentation, ResidentBatches, ResidentImages
from lipt.data.sources import ImageSource, Splits, TensorImages
from lipt.data.transforms import Transform, eval_transform, train_transform


class IndexedImages(Dataset):
    """`positions` of `source` under `transform`: items are (x, y, idx) with idx the position in
    the original split, or (x, y, idx, w) when per-sample `weights` are given."""

    def __init__(
        self,
        source: ImageSource,
        positions: Tensor,
        transform: Transform,
        weights: Tensor | None = None,
    ) -> None:
        self.source, self.positions, self.transform = source, positions.long(), transform
        self.weights = weights
        assert weights is None or weights.shape == positions.shape

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    def __getitem__(self, i: int) -> tuple:
        idx = int(self.positions[i])
        x = self.transform(self.source.image(idx))
        y = self.source.labels[idx]
        if self.weights is None:
            return x, y, idx
        return x, y, idx, self.weights[i]


class DataModule(L.LightningDataModule):
    """Pool = training split minus a seeded validation split (`val_size` items, or a fraction).

    Items of the training loader are (x, y, idx, w); every other loader gives (x, y, idx).
    """

    def __init__(
        self,
        load: Callable[[], Splits],
        num_classes: int,
        channels: int,
        image_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        val_size: float = 5000,
        split_seed: int = 0,
        batch_size: int = 256,
        eval_batch_size: int = 256,
        num_workers: int = 0,
        crop_padding: int = 4,
        flip: bool = True,
        resident: bool = True,
        device: str | None = None,
        pool_size: int | None = None,
        label_noise: dict[str, Any] | None = None,
        train_labels: str | None = None,
    ) -> None:
        """`resident`: serve in-memory data sets from the training device (see the module
        docstring). `device`: where resident batches live when no trainer is attached (None:
        CUDA when available, else the CPU). `pool_size`: keep a seeded random part of that many
        items of the pool (smoke runs, `debug=fdr`; None: the whole pool). `label_noise`
        ({rate, kind, seed, pairs}) or `train_labels` (a .npy path): the training split's
        labels, replaced when the data is read (lipt.data.noise)."""
        if pool_size is not None and pool_size < 1:
            raise ValueError(f"pool_size must be a positive count or None, not {pool_size}")
        if len(mean) != channels or len(std) != channels:
            # more values would broadcast grey images to as many channels, silently on both paths
            raise ValueError(
                f"mean {list(mean)} and std {list(std)} need one value per channel ({channels})"
            )
        super().__init__()
        self.load = load
        self.num_classes, self.channels, self.image_size = num_classes, channels, image_size
        self.mean, self.std = list(mean), list(std)
        self.val_size, self.split_seed = val_size, split_seed
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.num_workers = num_workers
        self.crop_padding, self.flip = crop_padding, flip
        self.resident, self.device = resident, device
        self.pool_size = pool_size
        self.label_noise, self.train_labels = label_noise, train_labels
        # The training split's labels as read and as trained on (None: left as read).
        self.label_changes: LabelChanges | None = None
        self.splits: Splits | None = None
        self._resident_train: ResidentImages | None = None
        self._resident_test: ResidentImages | None = None
        self.subset_indices: Tensor | None = None  # positions in the original training split
        self.subset_weights: Tensor | None = None
        # Dynamic pruning (lipt.dynamic): epoch -> (indices, weights) to train on, asked each
        # time a training loader is built, at the fitting trainer's epoch. None: the subset.
        self.epoch_subset: Callable[[int], tuple[Tensor, Tensor]] | None = None
        # Main training's shuffle seed and the trainer it was drawn for (see _shuffle_seed).
        self._fit_shuffle: tuple[int, object] | None = None

    # --- data ------------------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        if self.splits is not None:
            return
        splits = self.load()
        n = len(splits.train)
        n_val = round(self.val_size * n) if 0 < self.val_size < 1 else int(self.val_size)
        if n_val < 0 or n_val >= n:
            raise UserError(
                f"dataset.val_size={self.val_size} leaves no training pool from {n} items; "
                "use a smaller dataset.val_size"
            )
        self._check_shape(splits)
        self._replace_labels(splits.train)
        labels = splits.train.labels
        if int(labels.min()) < 0 or int(labels.max()) >= self.num_classes:
            raise UserError(
                f"labels span {int(labels.min())}..{int(labels.max())} but the data set config "
                f"says {self.num_classes} classes; set dataset.num_classes"
            )
        # The split depends on split_seed alone, so runs with different seeds share one pool.
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.split_seed))
        self.val_indices = perm[:n_val].sort().values
        pool = perm[n_val:]
        if self.pool_size is not None and self.pool_size < len(pool):
            g = torch.Generator().manual_seed(self.split_seed)
            pool = pool[torch.randperm(len(pool), generator=g)[: self.pool_size]]
        self.pool_indices = pool.sort().values
        self.splits = splits
        if isinstance(splits.train, TensorImages) and isinstance(splits.test, TensorImages):
            self._resident_train = ResidentImages(splits.train)
            self._resident_test = ResidentImages(splits.test)

    def _check_shape(self, splits: Splits) -> None:
        """The reader's classes and its images' channels are the config's: a model built for
        others fails mid-run, and label noise would flip labels into classes without items."""
        classes = splits.classes
        if classes is not None and len(classes) != self.num_classes:
            shown = ", ".join(classes if len(classes) <= 4 else [*classes[:2], "...", classes[-1]])
            raise UserError(
                f"the data has {len(classes)} classes ({shown}) but dataset.num_classes="
                f"{self.num_classes}; set dataset.num_classes={len(classes)}"
            )
        channels, height, width = (int(d) for d in splits.train.image(0).shape)
        if channels != self.channels:
            raise UserError(
                f"the data's images have {channels} channel(s) but dataset.channels="
                f"{self.channels}; set dataset.channels={channels}, with as many dataset.mean "
                "and dataset.std values"
            )
        # The DataLoader path crops training images to image_size and the resident path keeps
        # them as they are, evaluation on both: another size would train each path otherwise.
        if (height, width) != (self.image_size, self.image_size):
            fix = (
                f"set dataset.image_size={height}"
                if height == width
                else "give the data set square images"
            )
            raise UserError(
                f"the data's images are {height}x{width} but dataset.image_size="
                f"{self.image_size}; {fix}"
            )

    def _replace_labels(self, train: ImageSource) -> None:
        """`train_labels` or `label_noise`, in place of the reader's labels, before any loader
        (resident copies included) reads them."""
        original = train.labels
        if self.train_labels is not None:
            try:
                given = read_train_labels(Path(self.train_labels), self.num_classes)
            except ValueError as e:
                raise UserError(f"dataset.train_labels: {e}") from e
            if given.shape != original.shape:
                raise UserError(
                    f"dataset.train_labels has {len(given)} labels but the training split has "
                    f"{len(original)} items; save one label per item, in the reader's order"
                )
        elif self.label_noise is not None and self.label_noise["rate"] > 0:
            noise = self.label_noise
            given = flip_labels(
                original,
                self.num_classes,
                float(noise["rate"]),
                noise["kind"],
                int(noise["seed"]),
                noise.get("pairs"),
            )
        else:
            return
        train.labels = given
        self.label_changes = LabelChanges(original, given)

    def relabel(self, positions: Tensor, labels: Tensor) -> None:
        """Give the training split's items at `positions` these `labels` (label cleaning's
        relabel); resident copies are made again from the new labels."""
        assert self.splits is not None, "call setup() first"
        train = self.splits.train
        fresh = train.labels.clone()
        fresh[positions] = labels
        train.labels = fresh
        if self._resident_train is not None:
            assert isinstance(train, TensorImages)  # what resident copies are made of
            self._resident_train = ResidentImages(train)

    def drop_from_pool(self, positions: Tensor) -> None:
        """Take the training split's items at `positions` out of the pool (label cleaning's
        drop): selection and main training see the rest."""
        keep = ~torch.isin(self.pool_indices, positions)
        self.pool_indices = self.pool_indices[keep]

    @property
    def data_name(self) -> str:
        assert self.splits is not None, "call setup() first"
        return self.splits.name

    @property
    def class_names(self) -> list[str]:
        """The data set's class names in label order; the label itself for a class it does not
        name (a data set without names)."""
        assert self.splits is not None, "call setup() first"
        names = list(self.splits.classes or [])[: self.num_classes]
        return names + [str(c) for c in range(len(names), self.num_classes)]

    @property
    def train_source(self) -> ImageSource:
        assert self.splits is not None, "call setup() first"
        return self.splits.train

    def set_subset(self, indices: Tensor | None, weights: Tensor | None = None) -> None:
        """Train on `indices` (positions in the original training split) with loss `weights`;
        None trains on the whole pool."""
        if indices is not None and weights is None:
            weights = torch.ones(len(indices), dtype=torch.float32)
        self.subset_indices, self.subset_weights = indices, weights

    # --- transforms ------------------------------------------------------------------------

    def train_transform(self, randaugment: dict | None = None) -> Transform:
        return train_transform(
            self.mean, self.std, self.image_size, self.crop_padding, self.flip, randaugment
        )

    def eval_transform(self) -> Transform:
        return eval_transform(self.mean, self.std)

    # --- loaders ---------------------------------------------------------------------------

    @property
    def is_resident(self) -> bool:
        """True when batches come from the device-resident tensors."""
        return self.resident and self._resident_train is not None

    def training_device(self) -> torch.device:
        """The attached trainer's device, else `device`, else CUDA when available."""
        trainer = self.trainer
        if trainer is not None:
            return trainer.strategy.root_device
        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def _ranks(self) -> tuple[int, int]:
        trainer = self.trainer
        return (1, 0) if trainer is None else (int(trainer.world_size), int(trainer.global_rank))

    def _shuffle_seed(self, distributed: bool) -> int:
        """Drawn from the global RNG (as a DataLoader draws its base seed), so seed_everything
        fixes it; under DDP rank 0's is broadcast so all ranks share one permutation. Main
        training's (`distributed`, this data module fitting with a trainer) is drawn once per
        fit and kept: the trainer's epoch varies the permutation, a re-selection's reload
        reuses the seed, and a resumed fit gets it back from the checkpoint (`state_dict`)."""
        trainer = self.trainer
        main = distributed and trainer is not None
        if main and self._fit_shuffle is not None and self._fit_shuffle[1] is trainer:
            return self._fit_shuffle[0]
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        if main and trainer is not None:
            if trainer.world_size > 1:
                seed = int(trainer.strategy.broadcast(seed, src=0))
            self._fit_shuffle = (seed, trainer)
        return seed

    def state_dict(self) -> dict[str, Any]:
        """Saved in Lightning checkpoints: main training's shuffle seed, once drawn."""
        return {} if self._fit_shuffle is None else {"fit_shuffle_seed": self._fit_shuffle[0]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """On resume, before the first training loader is made: keep the checkpoint's seed."""
        if "fit_shuffle_seed" in state_dict:
            self._fit_shuffle = (int(state_dict["fit_shuffle_seed"]), self.trainer)

    def _resident_loader(
        self,
        images: ResidentImages | None,
        positions: Tensor,
        augmentation: Augmentation | None = None,
        weights: Tensor | None = None,
        batch_size: int | None = None,
        distributed: bool = False,
        epoch_source: Callable[[], int | None] | None = None,
    ) -> ResidentBatches:
        """`distributed`: this rank's part of the data (main training under DDP); the jigsaw
        learners, selection and evaluation see all of it."""
        assert images is not None
        world_size, rank = self._ranks() if distributed else (1, 0)
        return ResidentBatches(
            images,
            positions,
            batch_size=batch_size or self.eval_batch_size,
            device=self.training_device(),
            mean=self.mean,
            std=self.std,
            augmentation=augmentation,
            weights=weights,
            seed=self._shuffle_seed(distributed) if augmentation is not None else 0,
            world_size=world_size,
            rank=rank,
            epoch_source=epoch_source,
        )

    def trainer_epoch(self) -> int | None:
        """The epoch of the trainer fitting with this data module (main training), None when
        none is: a resumed run's training loader then shuffles for the epoch it resumes at."""
        return None if self.trainer is None else int(self.trainer.current_epoch)

    def augmentation(self, randaugment: dict | None = None) -> Augmentation:
        return Augmentation(
            self.crop_padding, self.flip, RandAugmentSettings.from_dict(randaugment)
        )

    def loader(self, dataset: Dataset, shuffle: bool, batch_size: int | None = None) -> DataLoader:
        """Training items shuffled (under DDP: Lightning's DistributedSampler), or evaluation
        items in order, all of them on every rank (as the resident path serves them)."""
        return DataLoader(
            dataset,
            batch_size=batch_size or self.eval_batch_size,
            shuffle=shuffle,
            sampler=None if shuffle else whole_on_every_rank(dataset),
            num_workers=self.num_workers,
            # started each epoch from the restored random state: a resume is bit for bit
            persistent_workers=False,
            pin_memory=self.training_device().type == "cuda",
        )

    def train_dataloader(self) -> DataLoader | ResidentBatches:
        assert self.splits is not None, "call setup() first"
        epoch = self.trainer_epoch()
        if self.epoch_subset is not None and epoch is not None:
            self.set_subset(*self.epoch_subset(epoch))
        indices = self.pool_indices if self.subset_indices is None else self.subset_indices
        weights = (
            torch.ones(len(indices), dtype=torch.float32)
            if self.subset_weights is None
            else self.subset_weights
        )
        if self.is_resident:
            return self._resident_loader(
                self._resident_train,
                indices,
                self.augmentation(),
                weights,
                self.batch_size,
                distributed=True,
                epoch_source=self.trainer_epoch,
            )
        dataset = IndexedImages(self.splits.train, indices, self.train_transform(), weights)
        return self.loader(dataset, shuffle=True, batch_size=self.batch_size)

    def unaugmented(self, indices: Tensor) -> DataLoader | ResidentBatches:
        """Rows of the original training split, un-augmented, in the order given."""
        assert self.splits is not None, "call setup() first"
        if self.is_resident:
            return self._resident_loader(self._resident_train, indices)
        return self.loader(IndexedImages(self.splits.train, indices, self.eval_transform()), False)

    def val_dataloader(self) -> DataLoader | ResidentBatches:
        return self.unaugmented(self.val_indices)

    def test_dataloader(self) -> DataLoader | ResidentBatches:
        assert self.splits is not None, "call setup() first"
        test = self.splits.test
        positions = torch.arange(len(test))
        if self.is_resident:
            return self._resident_loader(self._resident_test, positions)
        return self.loader(IndexedImages(test, positions, self.eval_transform()), False)

    def pool_dataloader(self) -> DataLoader | ResidentBatches:
        """The whole pool, un-augmented, in index order: what selectors score."""
        return self.unaugmented(self.pool_indices)

    def eval_loader(self, positions: Tensor, batch_size: int | None = None) -> DataLoader:
        """`positions` of the training split, un-augmented, in order, through a DataLoader on
        either path (the jigsaw soup's held-out and BatchNorm data, SNIP's batch)."""
        assert self.splits is not None, "call setup() first"
        dataset = IndexedImages(self.splits.train, positions, self.eval_transform())
        return self.loader(dataset, shuffle=False, batch_size=batch_size)

    def shard_dataloader(
        self, positions: Tensor, randaugment: dict | None
    ) -> DataLoader | ResidentBatches:
        """A jigsaw learner's own shard (positions in the original training split)."""
        assert self.splits is not None, "call setup() first"
        if randaugment is not None and self.channels not in RANDAUGMENT_CHANNELS:
            # a UserError: the learner loop stops at it, not each learner (NaN or TypeError)
            raise UserError(
                f"augment=randaugment takes grey (1) or RGB (3) images, but dataset.channels="
                f"{self.channels}; use augment=none"
            )
        weights = torch.ones(len(positions), dtype=torch.float32)
        if self.is_resident:
            return self._resident_loader(
                self._resident_train,
                positions,
                self.augmentation(randaugment),
                weights,
                self.batch_size,
            )
        dataset = IndexedImages(
            self.splits.train, positions, self.train_transform(randaugment), weights
        )
        return self.loader(dataset, shuffle=True, batch_size=self.batch_size)
