"""Each supported on-disk format is read by the real code, split and transformed as configured."""

from __future__ import annotations

import gzip
import pickle

import numpy as np
import pytest
import torch

from lipt.core.errors import UserError
from lipt.data.sources import read_idx
from lipt.run.config import run_of
from lipt.stages.build import build_datamodule


def test_fashion_mnist_idx_files_load_with_seeded_split(make_cfg, fashion_mnist_dir):
    cfg = make_cfg(["dataset.val_size=50", f"dataset.data_dir={fashion_mnist_dir}"])
    dm = build_datamodule(run_of(cfg))
    assert len(dm.train_source) == 300 and len(dm.splits.test) == 100
    assert len(dm.val_indices) == 50 and len(dm.pool_indices) == 250
    # pool and validation split partition the training split
    both = torch.cat([dm.val_indices, dm.pool_indices]).sort().values
    assert torch.equal(both, torch.arange(300))
    # the raw pixels equal the file's
    with gzip.open(fashion_mnist_dir / "train-images-idx3-ubyte.gz") as f:
        raw = np.frombuffer(f.read(), np.uint8, offset=16).reshape(300, 28, 28)
    assert torch.equal(dm.train_source.images[7, 0], torch.from_numpy(raw[7].copy()))
    # same split seed, same split; another seed, another split
    again = build_datamodule(run_of(cfg))
    assert torch.equal(again.val_indices, dm.val_indices)
    other = build_datamodule(
        run_of(
            make_cfg(
                [
                    "dataset.val_size=50",
                    f"dataset.data_dir={fashion_mnist_dir}",
                    "dataset.split_seed=1",
                ]
            )
        )
    )
    assert not torch.equal(other.val_indices, dm.val_indices)


def test_loaders_give_normalised_tensors_and_original_positions(make_cfg, fashion_mnist_dir):
    dm = build_datamodule(
        run_of(make_cfg(["dataset.val_size=50", f"dataset.data_dir={fashion_mnist_dir}"]))
    )
    x, y, idx = next(iter(dm.pool_dataloader()))
    assert x.dtype == torch.float32 and x.shape[1:] == (1, 28, 28)
    assert torch.equal(idx[:5], dm.pool_indices[:5])
    assert torch.equal(y, dm.train_source.labels[idx])
    # un-augmented pool images are exactly the normalised pixels
    expected = (dm.train_source.images[idx[0]].float() / 255 - 0.2860) / 0.3530
    assert torch.allclose(x[0], expected, atol=1e-5)
    dm.set_subset(dm.pool_indices[:10], torch.full((10,), 2.0))
    _, _, ib, wb = next(iter(dm.train_dataloader()))
    assert len(ib) == 10 and set(ib.tolist()) == set(dm.pool_indices[:10].tolist())
    assert torch.all(wb == 2.0)


def test_cifar10_pickle_batches(make_cfg, cifar10_dir):
    dm = build_datamodule(
        run_of(
            make_cfg(
                [
                    "dataset=cifar10",
                    f"dataset.data_dir={cifar10_dir}",
                    "dataset.val_size=20",
                    "dataset.num_workers=0",
                ]
            )
        )
    )
    assert len(dm.train_source) == 200 and len(dm.splits.test) == 60
    with open(cifar10_dir / "cifar-10-batches-py" / "data_batch_2", "rb") as f:
        batch = pickle.load(f, encoding="latin1")
    # item 3 of batch 2 is item 43 of the split, in CHW order
    assert torch.equal(
        dm.train_source.images[43], torch.from_numpy(batch["data"][3].reshape(3, 32, 32))
    )
    assert int(dm.train_source.labels[43]) == batch["labels"][3]
    x, _, _ = next(iter(dm.pool_dataloader()))
    assert x.shape[1:] == (3, 32, 32)


def test_cifar100_uses_fine_labels(make_cfg, cifar100_dir):
    dm = build_datamodule(
        run_of(
            make_cfg(
                [
                    "dataset=cifar100",
                    f"dataset.data_dir={cifar100_dir}",
                    "dataset.val_size=50",
                    "dataset.num_workers=0",
                ]
            )
        )
    )
    with open(cifar100_dir / "cifar-100-python" / "train", "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    assert dm.train_source.labels.tolist() == entry["fine_labels"]


def test_imagefolder_tree(make_cfg, imagefolder_dir):
    dm = build_datamodule(
        run_of(
            make_cfg(
                [
                    "dataset=imagenet",
                    f"dataset.data_dir={imagefolder_dir}",
                    "dataset.num_classes=3",
                    "dataset.image_size=32",
                    "dataset.resize=36",
                    "dataset.val_size=9",
                    "dataset.num_workers=0",
                    "dataset.crop_padding=4",
                ]
            )
        )
    )
    assert len(dm.train_source) == 90 and len(dm.splits.test) == 18
    assert sorted(set(dm.train_source.labels.tolist())) == [0, 1, 2]
    x, y, _ = next(iter(dm.pool_dataloader()))
    assert x.shape[1:] == (3, 32, 32)
    # class c was written with brightness 60c+40: the decoded means keep that order
    means = [float(x[y == c].mean()) for c in range(3)]
    assert means[0] < means[1] < means[2]


def test_corrupt_and_missing_files_are_user_errors(tmp_path, fashion_mnist_dir, make_cfg):
    bad = tmp_path / "bad-idx"
    bad.write_bytes(b"\x00\x00\x08\x03" + b"\x00" * 5)
    with pytest.raises(UserError, match=r"truncated|corrupt|not an IDX"):
        read_idx(bad)
    with pytest.raises(UserError, match="CIFAR-10 files missing"):
        build_datamodule(run_of(make_cfg(["dataset=cifar10", f"dataset.data_dir={tmp_path}"])))
    (fashion_mnist_dir / "train-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    with pytest.raises(UserError):
        build_datamodule(
            run_of(make_cfg([f"dataset.data_dir={fashion_mnist_dir}", "dataset.download=false"]))
        )


def test_randaugment_changes_pixels_only_in_train_transform(make_cfg):
    dm = build_datamodule(run_of(make_cfg(["dataset=synthetic"])))
    image = dm.train_source.image(0)
    torch.manual_seed(0)
    eval_x = dm.eval_transform()(image)
    strong = [dm.train_transform({"num_ops": 1, "magnitude": 9})(image) for _ in range(8)]
    assert all(s.shape == eval_x.shape for s in strong)
    assert any(not torch.allclose(s, eval_x) for s in strong)
    assert torch.allclose(dm.eval_transform()(image), eval_x)
