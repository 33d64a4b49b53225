"""Shared fixtures: compose the real configs on tmp_path, and write small data sets in the real
on-disk formats (IDX, CIFAR pickle batches, ImageFolder trees)."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from lipt.selection import (
    select_ccs,
    select_coverage,
    select_craig,
    select_el2n,
    select_glister,
    select_gradmatch,
    select_grand,
    select_random,
    select_uncertainty,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

# The selectors under test, by the name of their config in configs/selector/ (tests only:
# lipt itself finds selectors through Hydra's config group).
SELECTORS = {
    "random": select_random,
    "uncertainty": select_uncertainty,
    "el2n": select_el2n,
    "grand": select_grand,
    "glister": select_glister,
    "gradmatch": select_gradmatch,
    "craig": select_craig,
    "ccs": select_ccs,
    "coverage": select_coverage,
}

# Small, quick settings for end-to-end runs on the synthetic data set. On the CPU even where a
# GPU is present: tests that compare runs bit for bit would not hold on CUDA with
# `deterministic: false` (the `gpu` marker is for tests meant to run there).
FAST = [
    "dataset=synthetic",
    "trainer.accelerator=cpu",
    "model.width=8",
    "batch_size=32",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "logger=none",
    "pretrain=none",  # tests that exercise the jigsaw stage ask for it
]


@pytest.fixture
def make_cfg(tmp_path: Path) -> Callable[..., DictConfig]:
    def _make(overrides: Sequence[str] = (), config_name: str = "train") -> DictConfig:
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            return compose(config_name, overrides=[f"paths.output_dir={tmp_path}", *overrides])

    return _make


def run_entry(
    script: str,
    args: Sequence[str],
    cwd: Path = ROOT,
    timeout: float = 600,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run an entry script as a user would, from the repository root."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, script, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        stdin=subprocess.DEVNULL,
    )


# --- real on-disk formats --------------------------------------------------------------------


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def class_images(labels: np.ndarray, channels: int, size: int, seed: int) -> np.ndarray:
    """Images whose class is visible (a per-class brightness pattern plus noise)."""
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(0, 256, size=(int(labels.max()) + 1, channels, size, size))
    noise = rng.normal(0, 30, size=(len(labels), channels, size, size))
    return np.clip(prototypes[labels] + noise, 0, 255).astype(np.uint8)


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
