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

# (soup, subset) hashes per data path. The DataLoader path's are those of 5c1a3de: the
# architecture step and the resident path left it bit for bit. The resident path (the default
# for in-memory data sets since issue #14) draws its augmentation per batch, so it has its own.
PINNED = {
    "dataloader": (
        "d0150431e5fab544bc2b58cbd1be3830ec92a420075f3cddefc31a13279e296d",
        "3de7a018895e72aa4261e68dddd8b2a99badc2412c79375db12788728d5e8d6d",
    ),
    "resident": (
        "5e7286a1683a12313a32d25759d796b54253478af6496556a8548bfd99e48e11",
        "1039955742a5af11b0f97e60516db8ece168330e9c709a86e0ca969f66a6cb8b",
    ),
}
DATA_PATH = {
    "dataloader": ["dataset.resident=false", "dataset.eval_batch_size=1024"],
    "resident": ["dataset.resident=true"],
}

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


@pytest.mark.parametrize("data_path", sorted(PINNED))
def test_jigsaw_soup_and_coverage_subset_are_pinned(
    make_cfg: Callable[..., DictConfig],
    fashion_mnist_dir: Path,
    tmp_path: Path,
    one_thread: None,
    data_path: str,
) -> None:
    data = [f"dataset.data_dir={fashion_mnist_dir}", *DATA_PATH[data_path]]
    pretrain_run(make_cfg([*PIN, *data], config_name="pretrain"))
    ckpt = tmp_path / "pretrain.ckpt"
    soup = load_checkpoint(ckpt)["state_dict"]

    select_run(make_cfg([*PIN, *data, f"ckpt_path={ckpt}"], config_name="select"))
    indices, weights, _ = load_subset(tmp_path / "subset.npz")
    subset = hashlib.sha256(tensor_bytes(indices) + tensor_bytes(weights)).hexdigest()

    assert len(indices) == round(0.2 * (300 - 60))
    assert (state_sha256(soup), subset) == PINNED[data_path]

    # The same selection with the soup pre-trained in-process (train.py's path).
    (tmp_path / "subset.npz").unlink()
    select_run(make_cfg([*PIN, *data], config_name="select"))
    indices, weights, _ = load_subset(tmp_path / "subset.npz")
    in_process = hashlib.sha256(tensor_bytes(indices) + tensor_bytes(weights)).hexdigest()
    assert in_process == PINNED[data_path][1]
