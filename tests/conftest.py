"""Shared fixtures: compose the real configs on tmp_path, and write small data sets in the real
on-disk formats (IDX, CIFAR pickle batches, ImageFolder trees). Helpers that are not fixtures
live in tests/helpers.py."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import DictConfig

from tests.helpers import class_images, compose_train, write_idx
from tests.parsed_configs import keep_parsed_configs

# `make test` runs the suite as one pytest worker per core (pytest-xdist), each on one torch
# thread: workers of several OpenMP threads each on the same cores spin-wait for one another
# (a test 10x slower, measured). Entry scripts the tests start inherit it from the environment.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
keep_parsed_configs()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`first`-marked tests start first (a long test started last holds one core of an
    otherwise finished suite); `slurm`-marked tests live in test_slurm.py; `gpu`-marked tests
    are skipped where no CUDA device is present (the marker's contract)."""
    import torch

    items.sort(key=lambda item: item.get_closest_marker("first") is None)  # stable
    for item in items:  # `make test-slurm` collects only this file
        assert item.get_closest_marker("slurm") is None or item.path.name == "test_slurm.py", item
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def make_cfg(tmp_path: Path) -> Callable[..., DictConfig]:
    def _make(overrides: Sequence[str] = (), config_name: str = "train") -> DictConfig:
        composed: DictConfig = compose_train(tmp_path, overrides, config_name)
        return composed

    return _make


@pytest.fixture
def fashion_mnist_dir(tmp_path: Path) -> Path:
    """Fashion-MNIST's four gzipped IDX files with 300 train and 100 test images."""
    root = tmp_path / "fmnist"
    root.mkdir()
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 300), ("t10k", 100)):
        labels = rng.integers(0, 10, n)
        images = class_images(labels, 1, 28, seed=n)[:, 0]
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return root


@pytest.fixture
def cifar10_dir(tmp_path: Path) -> Path:
    root = tmp_path / "cifar10"
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for name, n in [(f"data_batch_{k}", 40) for k in range(1, 6)] + [("test_batch", 60)]:
        labels = rng.integers(0, 10, n)
        data = class_images(labels, 3, 32, seed=n).reshape(n, -1)
        entry = {"batch_label": name, "labels": labels.tolist(), "data": data, "filenames": []}
        with open(base / name, "wb") as f:
            pickle.dump(entry, f)
    return root


@pytest.fixture
def cifar100_dir(tmp_path: Path) -> Path:
    root = tmp_path / "cifar100"
    base = root / "cifar-100-python"
    base.mkdir(parents=True)
    rng = np.random.default_rng(2)
    for name, n in (("train", 400), ("test", 100)):
        labels = rng.integers(0, 100, n)
        data = class_images(labels, 3, 32, seed=n).reshape(n, -1)
        entry = {
            "fine_labels": labels.tolist(),
            "coarse_labels": (labels // 5).tolist(),
            "data": data,
        }
        with open(base / name, "wb") as f:
            pickle.dump(entry, f)
    return root


@pytest.fixture
def imagefolder_dir(tmp_path: Path) -> Path:
    """ImageNet layout: train/<class>/*.JPEG and val/<class>/*.JPEG, of mixed sizes."""
    from PIL import Image

    root = tmp_path / "imagenet"
    rng = np.random.default_rng(3)
    for split, per_class in (("train", 30), ("val", 6)):
        for c, name in enumerate(("n01440764", "n01443537", "n01484850")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                h, w = int(rng.integers(40, 60)), int(rng.integers(40, 60))
                pixels = np.full((h, w, 3), 60 * c + 40, np.uint8)
                pixels = np.clip(pixels + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{name}_{i}.JPEG", format="JPEG")
    return root
