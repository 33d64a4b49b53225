"""One small run pinned bit for bit: a jigsaw pre-training (pretrain.py) and a coverage selection
from its checkpoint (select.py), in-process, on Fashion-MNIST-format IDX files written by the
`fashion_mnist_dir` fixture.

The expected hashes were computed on commit 5c1a3de (before the architecture step, issue #11):
a refactoring must leave them as they are. A deliberate behaviour change (a new data path, a
different seed derivation, ...) must re-pin them, with the reason in the commit message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from lipt.artifacts import load_checkpoint, load_subset
from lipt.pretrain import run as pretrain_run
from lipt.seeding import torch_threads
from lipt.select import run as select_run

SOUP_SHA256 = "d0150431e5fab544bc2b58cbd1be3830ec92a420075f3cddefc31a13279e296d"
SUBSET_SHA256 = "3de7a018895e72aa4261e68dddd8b2a99badc2412c79375db12788728d5e8d6d"

PIN = [
    "dataset=fashion_mnist",
    "dataset.download=false",
    "dataset.val_size=60",
    "trainer.accelerator=cpu",
    "model.width=8",
    "batch_size=32",
    "logger=none",
    "pretrain=jigsaw",
    "pretrain.num_learners=4",
    "pretrain.batches_per_learner=1",
    "pretrain.local_epochs=2",
    "pretrain.num_threads=1",
    "merge.ratios=5",
    "selector=coverage",
    "fraction=0.2",
]


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def state_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(state_dict):
        h.update(key.encode())
        h.update(str(state_dict[key].dtype).encode())
        h.update(tensor_bytes(state_dict[key]))
    return h.hexdigest()


@pytest.fixture
def one_thread() -> Iterator[None]:
    # CPU float results depend on the intra-op thread count: the same on every machine.
    with torch_threads(1):
        yield


def test_jigsaw_soup_and_coverage_subset_are_pinned(
    make_cfg: Callable[..., DictConfig], fashion_mnist_dir: Path, tmp_path: Path, one_thread: None
) -> None:
    data = f"dataset.data_dir={fashion_mnist_dir}"
    pretrain_run(make_cfg([*PIN, data], config_name="pretrain"))
    ckpt = tmp_path / "pretrain.ckpt"
    soup = load_checkpoint(ckpt)["state_dict"]

    select_run(make_cfg([*PIN, data, f"ckpt_path={ckpt}"], config_name="select"))
    indices, weights, _ = load_subset(tmp_path / "subset.npz")
    subset = hashlib.sha256(tensor_bytes(indices) + tensor_bytes(weights)).hexdigest()

    assert len(indices) == round(0.2 * (300 - 60))
    assert (state_sha256(soup), subset) == (SOUP_SHA256, SUBSET_SHA256)

    # The same selection with the soup pre-trained in-process (train.py's path).
    (tmp_path / "subset.npz").unlink()
    select_run(make_cfg([*PIN, data], config_name="select"))
    indices, weights, _ = load_subset(tmp_path / "subset.npz")
    in_process = hashlib.sha256(tensor_bytes(indices) + tensor_bytes(weights)).hexdigest()
    assert in_process == SUBSET_SHA256
