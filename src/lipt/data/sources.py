"""Readers for the on-disk formats lipt supports, returning raw uint8 images and labels.

Small data sets (Fashion-MNIST, CIFAR) are held in memory as one uint8 tensor so an epoch is not
dominated by PIL; ImageNet-style folders stay on disk and are decoded per item.
"""

from __future__ import annotations

import gzip
import os
import pickle
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from torch import Tensor

from lipt.core.bounds import COUNT, SEED, Interval
from lipt.core.errors import UserError
from lipt.data.class_names import FASHION_MNIST, cifar_names
from lipt.data.image_files import (
    FOLDER_CHANNELS,
    check_folder_classes,
    class_files,
    decode_file,
    files_digest,
)

FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")


class ImageSource:
    """Indexable images: `image(i)` is a uint8 tensor [C, H, W]; `labels` is int64 [N]."""

    labels: Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def image(self, i: int) -> Tensor:
        raise NotImplementedError


@dataclass
class TensorImages(ImageSource):
    """All images in memory."""

    images: Tensor  # [N, C, H, W] uint8
    labels: Tensor  # [N] int64

    def __post_init__(self) -> None:
        assert self.images.dtype == torch.uint8 and self.images.ndim == 4, self.images.shape
        assert self.labels.shape == (self.images.shape[0],), self.labels.shape

    def image(self, i: int) -> Tensor:
        return self.images[i]


@dataclass
class Splits:
    train: ImageSource
    test: ImageSource
    name: str  # a stable identifier of the data (for refusing artifacts made for other data)
    classes: list[str] | None = None  # the class names in label order (None: unnamed)


# --- Fashion-MNIST / MNIST IDX files ----------------------------------------------------------

_IDX_DTYPES = {0x08: np.uint8}


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped), as Yann LeCun's MNIST page specifies."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:  # zlib.error: a corrupt .gz
        raise UserError(f"cannot read {path}: {e}; re-download or restore the file") from e
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise UserError(f"{path} is not an IDX file (bad magic number); restore the original file")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(data[4 + 4 * k : 8 + 4 * k], "big") for k in range(ndim))
    expected = header + int(np.prod(shape))
    if len(data) != expected:
        raise UserError(
            f"{path} is truncated or corrupt ({len(data)} bytes, expected {expected}); "
            "restore the original file"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def _find_idx(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        for sub in ("", "raw", "FashionMNIST/raw"):
            path = directory / sub / name
            if path.is_file():
                return path
    return None


def _idx_split(directory: Path, prefix: str) -> TensorImages | None:
    images_path = _find_idx(directory, f"{prefix}-images-idx3-ubyte")
    labels_path = _find_idx(directory, f"{prefix}-labels-idx1-ubyte")
    if images_path is None or labels_path is None:
        return None
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise UserError(
            f"{images_path} and {labels_path} do not match ({images.shape} vs {labels.shape}); "
            "restore the original files"
        )
    return TensorImages(
        torch.from_numpy(images.copy()).unsqueeze(1),  # [N, 1, 28, 28]
        torch.from_numpy(labels.astype(np.int64)),
    )


FASHION_MNIST_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _fashion_mnist_dirs(data_dir: str | None) -> list[Path]:
    """Where to look: the folder the user named, and only it; the Debian package's folder when
    they named none (an explicit setting is honoured or refused, never replaced)."""
    return [Path(data_dir).expanduser()] if data_dir else [FASHION_MNIST_SYSTEM_DIR]


def fashion_mnist_files(data_dir: str | None, download: bool = True) -> list[Path]:
    """The four IDX files `load_fashion_mnist` will read ([] when it will download them)."""
    for directory in _fashion_mnist_dirs(data_dir):
        found = [_find_idx(directory, stem) for stem in FASHION_MNIST_STEMS]
        if all(path is not None for path in found):
            return [path for path in found if path is not None]
    if not download or not data_dir:
        # Downloads go to dataset.data_dir only: a run writes nowhere else but its run folder.
        problem = (
            f"dataset.data_dir={data_dir} holds no Fashion-MNIST"
            if data_dir
            else f"Fashion-MNIST not found in {FASHION_MNIST_SYSTEM_DIR}"
        )
        raise UserError(
            f"{problem}: set dataset.data_dir=DIR holding train-images-idx3-ubyte[.gz] etc. (or "
            "a DIR to download into, with dataset.download=true), or leave it unset and install "
            "the Debian package dataset-fashion-mnist"
        )
    return []


def load_fashion_mnist(data_dir: str | None, download: bool = True) -> Splits:
    """IDX files from `data_dir` (downloaded into it with `download`), or, when no folder is
    named, from the Debian package's folder."""
    for directory in _fashion_mnist_dirs(data_dir):
        train, test = _idx_split(directory, "train"), _idx_split(directory, "t10k")
        if train is not None and test is not None:
            return Splits(train, test, "fashion_mnist", list(FASHION_MNIST))
    fashion_mnist_files(data_dir, download)  # raises when there is nothing to download into
    assert data_dir  # (fashion_mnist_files raised without one)
    target = Path(data_dir).expanduser()
    try:
        download_fashion_mnist(target)
    except Exception as e:  # any network failure: say what to do instead
        raise UserError(
            f"dataset.data_dir={data_dir} holds no Fashion-MNIST and the download into it failed "
            f"({type(e).__name__}); put the IDX files there, or leave dataset.data_dir unset and "
            "install the Debian package dataset-fashion-mnist"
        ) from e
    return load_fashion_mnist(str(target), download=False)


# torchvision's folder of the files it downloads, in dataset.data_dir
FASHION_MNIST_DOWNLOADS = Path("FashionMNIST") / "raw"
_STAGING = ".lipt-download-"


def download_fashion_mnist(target: Path) -> None:
    """torchvision's download of Fashion-MNIST into `target`, one process at a time and whole
    files only. Two runs started at once on an empty dataset.data_dir both downloaded into the
    same files, each truncating what the other was writing: one failed its checksum ("the
    download failed") or read the other's half-written file. Here a process waits (flock on
    torchvision's folder) while another downloads, then reads that one's files; a download goes
    to a folder of its own and its files are renamed into place once complete."""
    import fcntl
    import shutil
    import tempfile

    from torchvision.datasets import FashionMNIST

    raw = target / FASHION_MNIST_DOWNLOADS
    raw.mkdir(parents=True, exist_ok=True)
    fd = os.open(raw.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits while another process downloads here
        if all(_find_idx(target, stem) is not None for stem in FASHION_MNIST_STEMS):
            return  # the other process's download
        for stale in raw.parent.glob(_STAGING + "*"):  # a killed download's: no one else's
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=raw.parent, prefix=_STAGING))
        try:
            FashionMNIST(str(staging), train=True, download=True)
            FashionMNIST(str(staging), train=False, download=True)
            for entry in sorted((staging / FASHION_MNIST_DOWNLOADS).iterdir()):
                os.replace(entry, raw / entry.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        os.close(fd)  # drops the lock


# --- CIFAR-10/100 python pickle batches -------------------------------------------------------


def _read_cifar_batches(files: list[Path], label_key: str) -> TensorImages:
    images: list[np.ndarray] = []
    labels: list[int] = []
    for path in files:
        try:
            with open(path, "rb") as f:
                entry = pickle.load(f, encoding="latin1")
            data = np.asarray(entry["data"], dtype=np.uint8)
            batch_labels = [int(y) for y in entry[label_key]]
        except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError) as e:
            raise UserError(f"{path} is not a readable CIFAR batch ({e}); restore it") from e
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.shape[0] != len(batch_labels):
            raise UserError(
                f"{path} is not a CIFAR batch: its data is {data.shape}, not one row of 3072 "
                f"pixels for each of its {len(batch_labels)} labels; restore the original file"
            )
        images.append(data.reshape(-1, 3, 32, 32))
        labels.extend(batch_labels)
    return TensorImages(
        torch.from_numpy(np.concatenate(images)), torch.tensor(labels, dtype=torch.int64)
    )


def cifar_files(data_dir: str | None, num_classes: int) -> tuple[list[Path], list[Path]]:
    """The train and test batch files `load_cifar` reads; UserError when any is missing."""
    if num_classes not in (10, 100):
        raise UserError(f"CIFAR has 10 or 100 classes, not {num_classes}")
    root = _existing_dir(data_dir, "cifar")
    sub = "cifar-10-batches-py" if num_classes == 10 else "cifar-100-python"
    base = root / sub if (root / sub).is_dir() else root
    if num_classes == 10:
        train_files = [base / f"data_batch_{k}" for k in range(1, 6)]
        test_files = [base / "test_batch"]
    else:
        train_files, test_files = [base / "train"], [base / "test"]
    missing = [str(p) for p in train_files + test_files if not p.is_file()]
    if missing:
        raise UserError(
            f"CIFAR-{num_classes} files missing in {base}: {', '.join(missing[:3])}; "
            f"set dataset.data_dir to the folder holding {sub}/"
        )
    return train_files, test_files


def load_cifar(data_dir: str, num_classes: Literal[10, 100]) -> Splits:
    """torchvision's layout: `cifar-10-batches-py/data_batch_{1..5}, test_batch` or
    `cifar-100-python/{train,test}`, directly in `data_dir` or one level down."""
    train_files, test_files = cifar_files(data_dir, num_classes)
    key = "labels" if num_classes == 10 else "fine_labels"
    return Splits(
        _read_cifar_batches(train_files, key),
        _read_cifar_batches(test_files, key),
        f"cifar{num_classes}",
        cifar_names(train_files[0].parent, num_classes),
    )


# --- ImageFolder trees (ImageNet layout: train/<class>/*.JPEG, val/<class>/*.JPEG) -----------


class FolderImages(ImageSource):
    """Images decoded on demand as `channels` (1: grey, 3: RGB) and resized so the short side is
    `resize`, centre-cropped to `size`: keeps every item the same shape without holding the data
    set in memory."""

    def __init__(
        self, root: Path, classes: list[str], resize: int, size: int, channels: int = 3
    ) -> None:
        assert channels in FOLDER_CHANNELS, channels
        self.paths: list[Path] = []
        labels: list[int] = []
        for label, name in enumerate(classes):
            files = class_files(root / name)
            self.paths.extend(files)
            labels.extend([label] * len(files))
        if not self.paths:
            raise UserError(f"no images under {root}; expected {root}/<class>/<image>.JPEG")
        self.labels = torch.tensor(labels, dtype=torch.int64)
        self.resize, self.size, self.channels = resize, size, channels

    def image(self, i: int) -> Tensor:
        from torchvision.transforms.v2 import functional as F

        img = decode_file(self.paths[i], self.channels)
        img = F.resize(img, [self.resize], antialias=True)
        return F.center_crop(img, [self.size, self.size])


def undigested_name(recorded: str, now: str) -> bool:
    """`recorded` is `now`, an ImageFolder tree's name (`load_image_folder`), less the digest of
    its files, which an older lipt did not write."""
    parts = now.split(":")
    old = ":".join(parts[:3] + parts[4:])
    return parts[0] == "imagefolder" and len(parts) >= 4 and recorded == old


def image_folder_dirs(data_dir: str | None) -> tuple[Path, Path]:
    """`train/` and `val/` of an ImageFolder tree; UserError when either is missing."""
    root = _existing_dir(data_dir, "imagenet")
    train_dir, val_dir = root / "train", root / "val"
    if not train_dir.is_dir() or not val_dir.is_dir():
        raise UserError(
            f"{root} must hold train/ and val/ folders of class subfolders (ImageFolder layout)"
        )
    if os.path.samefile(train_dir, val_dir):  # a link: the test split would be trained on
        raise UserError(
            f"{val_dir} is {train_dir} (a link): val/ is the test split, which must hold "
            "images the run does not train on; put held-out images in val/"
        )
    return train_dir, val_dir


def check_crop(resize: int, size: int) -> None:
    """UserError for a short side (`resize`) below the centre crop (`size`): the crop would pad
    every image with black borders."""
    if resize < size:
        raise UserError(
            f"dataset.resize={resize} is below dataset.image_size={size}: the centre crop would "
            f"pad every image with black borders; set dataset.resize={size} or more"
        )


def load_image_folder(
    data_dir: str,
    resize: Annotated[int, Interval(ge=1, le=8192)],
    size: Annotated[int, Interval(ge=1, le=8192)],
    channels: Annotated[int, Interval(ge=1, le=64)] = 3,
) -> Splits:
    """`channels`: 3 decodes every image as RGB, 1 as grey (dataset.channels)."""
    if channels not in FOLDER_CHANNELS:
        raise UserError(
            f"dataset.channels={channels}: an ImageFolder tree is read as grey (1) or RGB (3); "
            "set dataset.channels=1 or 3, with as many dataset.mean and dataset.std values"
        )
    check_crop(resize, size)
    root = _existing_dir(data_dir, "imagenet")
    train_dir, val_dir = image_folder_dirs(data_dir)
    classes = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    if not classes:
        raise UserError(f"no class folders in {train_dir}")
    train = FolderImages(train_dir, classes, resize, size, channels)
    check_folder_classes(train_dir, val_dir, classes, train.labels)
    # The folder's name and class count tell trees apart for a reader; the digest of the
    # training files (what subsets index and pre-training learns from) tells apart two trees of
    # one name and class count, or one tree before and after its files changed.
    # Its name as an absolute path's: `.` and `..` would name the tree by how it was spelt
    # (imagefolder::3:...), not which it is; links are not resolved (their name is chosen).
    folder = Path(os.path.abspath(root)).name
    name = f"imagefolder:{folder}:{len(classes)}:{files_digest(train_dir, train.paths)}"
    test = FolderImages(val_dir, classes, resize, size, channels)
    inside = Path(os.path.realpath(train_dir))
    for path in test.paths:  # a link at any depth (a folder's or a file's) into train/
        real = Path(os.path.realpath(path))
        if real.is_relative_to(inside):
            raise UserError(
                f"{path} is {real} (a link): val/ is the test split, which must hold images "
                "the run does not train on; put held-out images in val/"
            )
    return Splits(
        train,
        test,
        name + (":grey" if channels == 1 else ""),
        classes,
    )


# --- synthetic (tests) -----------------------------------------------------------------------


def make_synthetic(
    num_train: Annotated[int, COUNT],
    num_test: Annotated[int, COUNT],
    num_classes: Annotated[int, Interval(ge=2, le=10**6)],
    channels: Annotated[int, Interval(ge=1, le=64)],
    size: Annotated[int, Interval(ge=1, le=4096)],
    seed: Annotated[int, SEED],
) -> Splits:
    """Learnable toy images: each class is a fixed random pattern plus noise."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.rand(num_classes, channels, size, size, generator=g) * 255

    def draw(n: int) -> TensorImages:
        labels = torch.randint(0, num_classes, (n,), generator=g)
        noise = torch.randn(n, channels, size, size, generator=g) * 60
        images = (prototypes[labels] + noise).clamp(0, 255).to(torch.uint8)
        return TensorImages(images, labels)

    return Splits(draw(num_train), draw(num_test), f"synthetic:{seed}:{num_train}:{num_classes}")


def _existing_dir(data_dir: str | None, name: str) -> Path:
    if not data_dir:
        raise UserError(f"dataset.data_dir is not set; point it at the {name} data folder")
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise UserError(f"data directory {root} does not exist; set dataset.data_dir=...")
    return root


def expected_files(load_target: str, settings: dict[str, Any]) -> list[Path]:
    """What the reader named `load_target` (a `dataset.load._target_`) will open, checked
    before any stage starts; UserError when something it needs is missing."""
    reader = load_target.rsplit(".", 1)[-1]
    if reader == "load_fashion_mnist":
        return fashion_mnist_files(settings.get("data_dir"), bool(settings.get("download", True)))
    if reader == "load_cifar":
        train, test = cifar_files(settings.get("data_dir"), int(settings["num_classes"]))
        return train + test
    if reader == "load_image_folder":
        if settings.get("resize") is not None and settings.get("size") is not None:
            check_crop(int(settings["resize"]), int(settings["size"]))
        return list(image_folder_dirs(settings.get("data_dir")))
    return []  # synthetic data, or a reader lipt does not know: it checks its own input
