"""Each supported on-disk format is read by the real code, split and transformed as configured."""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from lipt.core.errors import UserError, one_line
from lipt.data import DataModule, image_files
from lipt.data.image_files import IMAGE_EXTENSIONS
from lipt.data.sources import load_image_folder, read_idx
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
    # On the CPU: compared with CPU tensors below (accelerator auto keeps them on a GPU).
    cpu = "trainer.accelerator=cpu"
    dm = build_datamodule(
        run_of(make_cfg(["dataset.val_size=50", f"dataset.data_dir={fashion_mnist_dir}", cpu]))
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


def test_a_corrupt_gzip_idx_file_is_one_line_naming_it(fashion_mnist_dir, make_cfg):
    labels = fashion_mnist_dir / "t10k-labels-idx1-ubyte.gz"
    packed = bytearray(labels.read_bytes())
    packed[20:84] = b"\xff" * 64  # the deflate stream's block header: zlib cannot inflate it
    labels.write_bytes(bytes(packed))
    cfg = make_cfg([f"dataset.data_dir={fashion_mnist_dir}", "dataset.download=false"])
    with pytest.raises(UserError, match=f"^cannot read {labels}: .*; re-download or restore"):
        build_datamodule(run_of(cfg))


@pytest.mark.parametrize("damage", ["one-label-removed", "rows-of-1000-pixels"])
def test_a_malformed_cifar_batch_is_one_line_naming_it(cifar10_dir, make_cfg, damage):
    path = cifar10_dir / "cifar-10-batches-py" / "data_batch_3"
    with open(path, "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    if damage == "one-label-removed":
        entry["labels"] = entry["labels"][:-1]
    else:
        entry["data"] = entry["data"][:, :1000]
    with open(path, "wb") as f:
        pickle.dump(entry, f)
    cfg = make_cfg(["dataset=cifar10", f"dataset.data_dir={cifar10_dir}", "dataset.val_size=20"])
    with pytest.raises(UserError, match=f"^{path} is not a CIFAR batch: .*restore the original"):
        build_datamodule(run_of(cfg))


@pytest.mark.parametrize(
    ("dataset", "fixture", "classes", "given"),
    [("imagenet", "imagefolder_dir", 3, 1000), ("fashion_mnist", "fashion_mnist_dir", 10, 12)],
)
def test_num_classes_other_than_the_readers_classes_is_refused(
    make_cfg, request, dataset, fixture, classes, given
):
    """A head of spare classes, and label noise that flips labels into them, refused when the
    data is read: the reader knows its classes (an ImageFolder tree's folders)."""
    overrides = [
        f"dataset={dataset}",
        f"dataset.data_dir={request.getfixturevalue(fixture)}",
        f"dataset.num_classes={given}",
        "dataset.val_size=20",
        "dataset.label_noise.rate=0.2",
    ]
    if dataset == "imagenet":
        overrides += ["dataset.image_size=32", "dataset.resize=36", "dataset.num_workers=0"]
    with pytest.raises(
        UserError,
        match=f"^the data has {classes} classes .* but dataset.num_classes={given}; "
        f"set dataset.num_classes={classes}$",
    ):
        build_datamodule(run_of(make_cfg(overrides)))


def test_images_of_other_channels_than_the_configs_are_refused(make_cfg, fashion_mnist_dir):
    overrides = [
        f"dataset.data_dir={fashion_mnist_dir}",
        "dataset.val_size=50",
        "dataset.channels=3",
        "dataset.mean=[0.5,0.5,0.5]",
        "dataset.std=[0.25,0.25,0.25]",
    ]
    with pytest.raises(UserError, match=r"^the data's images have 1 channel\(s\) but dataset"):
        build_datamodule(run_of(make_cfg(overrides)))


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("size", [24, 32])
def test_an_image_size_other_than_the_datas_is_refused(make_cfg, fashion_mnist_dir, resident, size):
    """Fashion-MNIST's 28x28 images under dataset.image_size=32 (or 24) were trained as 32x32
    (24x24) crops on the DataLoader path, evaluated at 28x28, and kept at 28x28 on the resident
    path: two trainings for one config. Refused once the data is read, naming the size to set."""
    overrides = [
        f"dataset.data_dir={fashion_mnist_dir}",
        "dataset.val_size=50",
        f"dataset.image_size={size}",
        f"dataset.resident={str(resident).lower()}",
    ]
    with pytest.raises(
        UserError,
        match=rf"^the data's images are 28x28 but dataset.image_size={size}; "
        r"set dataset.image_size=28$",
    ):
        build_datamodule(run_of(make_cfg(overrides)))
    dm = build_datamodule(
        run_of(make_cfg([*overrides[:2], f"dataset.resident={str(resident).lower()}"]))
    )
    dm.device = "cpu"
    x, _, _, _ = next(iter(dm.train_dataloader()))
    assert x.shape[1:] == next(iter(dm.pool_dataloader()))[0].shape[1:] == (1, 28, 28)


# --- ImageFolder trees in every listed format -------------------------------------------------

ORANGE = (200, 100, 50)  # grey 124: 0.299 R + 0.587 G + 0.114 B


def save(pixels: np.ndarray, path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(pixels)
    if path.suffix == ".webp":
        image.save(path, lossless=True)
    else:
        image.save(path)


def folder_module(root: Path, channels: int, num_workers: int = 0) -> DataModule:
    dm = DataModule(
        partial(load_image_folder, str(root), 32, 32, channels),
        num_classes=2,
        channels=channels,
        image_size=32,
        mean=[0.5] * channels,
        std=[0.25] * channels,
        val_size=0,
        num_workers=num_workers,
        device="cpu",
    )
    dm.setup()
    return dm


def test_every_listed_format_decodes_like_decode_image(tmp_path):
    """.bmp and .ppm (GTSRB's) too, which torchvision's decode_image cannot read: the same
    [3, H, W] uint8 pixels as a PNG of the same image."""
    from torchvision.io import ImageReadMode, decode_image
    from torchvision.transforms.v2 import functional as F

    pixels = (np.random.default_rng(0).random((32, 40, 3)) * 255).astype(np.uint8)
    for split in ("train", "val"):
        for c in ("a", "b"):
            for ext in IMAGE_EXTENSIONS:
                save(pixels, tmp_path / split / c / f"x{ext}")
    source = folder_module(tmp_path, 3).train_source
    expected = decode_image(str(tmp_path / "train/a/x.png"), mode=ImageReadMode.RGB)
    expected = F.center_crop(F.resize(expected, [32], antialias=True), [32, 32])
    decoded = {source.paths[i].suffix: source.image(i) for i in range(len(source))}
    assert sorted(decoded) == sorted(IMAGE_EXTENSIONS)
    for ext, image in decoded.items():
        assert image.dtype == torch.uint8 and image.shape == (3, 32, 32), ext
        if ext not in (".jpg", ".jpeg"):  # lossless formats: the same pixels
            assert torch.equal(image, expected), ext


def test_a_grey_tree_trains_as_one_channel(tmp_path):
    """dataset.channels=1 decodes every file grey (webp, which decode_image gives only in
    colour, included), as the config's one-channel model takes."""
    for split in ("train", "val"):
        for c in ("a", "b"):
            for ext in IMAGE_EXTENSIONS:
                save(np.full((36, 40, 3), ORANGE, np.uint8), tmp_path / split / c / f"rgb{ext}")
            save(np.full((36, 40), 124, np.uint8), tmp_path / split / c / "grey.png")
    dm = folder_module(tmp_path, 1)
    assert dm.data_name.endswith(":grey")  # not an RGB run's artifacts
    source = dm.train_source
    for i in range(len(source)):
        image = source.image(i)
        assert image.shape == (1, 32, 32), source.paths[i]
        assert int((image.int() - 124).abs().max()) <= 2, source.paths[i]
    x, _, _ = next(iter(dm.pool_dataloader()))
    assert x.shape == (len(source), 1, 32, 32)


def test_images_in_subfolders_of_a_class_are_read_as_torchvision_reads_them(tmp_path):
    from torchvision.datasets import ImageFolder

    pixels = np.zeros((8, 8, 3), np.uint8)
    for split in ("train", "val"):
        for name in ("b.png", "a.jpg", "sub/c.png", "sub/deeper/d.png", "a0/e.png", "z.png"):
            save(pixels, tmp_path / split / "cat" / name)
            save(pixels, tmp_path / split / "dog" / name)
        (tmp_path / split / "cat" / "notes.txt").write_text("not an image")
    source = folder_module(tmp_path, 3).train_source
    samples = ImageFolder(str(tmp_path / "train")).samples
    assert [str(p) for p in source.paths] == [path for path, _ in samples]
    assert source.labels.tolist() == [label for _, label in samples]


def test_a_user_error_in_a_dataloader_worker_prints_its_own_message(tmp_path):
    pixels = np.zeros((8, 8, 3), np.uint8)
    for split in ("train", "val"):
        for c in ("a", "b"):
            for i in range(3):
                save(pixels, tmp_path / split / c / f"{i}.png")
    broken = tmp_path / "train" / "b" / "1.png"
    broken.write_bytes(b"not a png")
    dm = folder_module(tmp_path, 3, num_workers=1)
    with pytest.raises(UserError) as caught:
        list(dm.pool_dataloader())
    assert "DataLoader worker" in str(caught.value)  # torch's wrapper around it
    assert one_line(caught.value).startswith(f"cannot decode {broken} (")
    assert one_line(caught.value).endswith("; remove or replace the file")


# --- the identity of an ImageFolder tree ------------------------------------------------------


def image_tree(root: Path, noisy: bool = False) -> Path:
    """ImageNet's layout, 2 classes of 4 training and 2 validation PNGs: flat images, or
    `noisy` ones (the same names and count, other bytes)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("val", 2)):
        for c, name in enumerate(("n01440764", "n01443537")):
            for i in range(count):
                pixels = np.full((40, 48, 3), 60 * c + 40, np.uint8)
                if noisy:
                    pixels = rng.integers(0, 256, pixels.shape, dtype=np.uint8)
                save(pixels, root / split / name / f"{name}_{i}.png")
    return root


def identity(root: Path, channels: int = 3) -> str:
    return load_image_folder(str(root), 36, 32, channels).name


def test_an_image_trees_digest_reads_the_sizes_of_an_even_spread_of_its_files(
    tmp_path, monkeypatch
):
    """Every file's path, the sizes of SIZED_FILES of them: a parallel file system answers each
    stat slowly. A resized copy (other images under the same names) is told from the sizes."""
    a = image_tree(tmp_path / "a" / "imagenet")
    b = image_tree(tmp_path / "b" / "imagenet", noisy=True)
    monkeypatch.setattr(image_files, "SIZED_FILES", 2)
    stats: list[str] = []
    stat = os.stat

    def counted(path, *args, **kwargs):
        stats.append(str(path))
        return stat(path, *args, **kwargs)

    paths = {root: sorted((root / "train").rglob("*.png")) for root in (a, b)}
    monkeypatch.setattr(image_files.os, "stat", counted)
    digest_a = image_files.files_digest(a / "train", paths[a])
    assert stats == [str(paths[a][0]), str(paths[a][4])]  # 8 files: every 4th
    assert image_files.files_digest(b / "train", paths[b]) != digest_a


def test_two_image_folder_trees_of_one_name_and_class_count_are_told_apart(tmp_path):
    """/data/a/imagenet and /data/b/imagenet: the same folder name, the same classes, the same
    file names and count, other images. And one tree, read again, after its files changed."""
    a = image_tree(tmp_path / "a" / "imagenet")
    b = image_tree(tmp_path / "b" / "imagenet", noisy=True)
    first = identity(a)
    assert first.startswith("imagefolder:imagenet:2:")
    assert identity(a) == first  # the same tree read twice
    assert identity(b) != first
    assert identity(a, channels=1) == f"{first}:grey"
    copy = tmp_path / "copy" / "imagenet"
    shutil.copytree(a, copy)  # the same files elsewhere: one data set (its subsets stay valid)
    assert identity(copy) == first
    moved = copy / "train" / "n01443537" / "n01440764_0.png"
    (copy / "train" / "n01440764" / "n01440764_0.png").rename(moved)  # another label
    assert identity(copy) != first
    moved.unlink()
    (a / "train" / "n01440764" / "n01440764_0.png").write_bytes(b"")
    save(np.zeros((40, 48, 3), np.uint8), a / "train" / "n01440764" / "n01440764_0.png")
    assert identity(a) != first  # rewritten with other pixels


def test_a_subset_made_on_another_tree_of_the_same_name_is_refused_in_one_line(tmp_path):
    from lipt.core.artifacts import save_subset
    from lipt.stages.select import load_checked_subset

    here = folder_module(image_tree(tmp_path / "a" / "imagenet"), 3)
    there = folder_module(image_tree(tmp_path / "b" / "imagenet", noisy=True), 3)
    assert len(here.train_source) == len(there.train_source)
    path = tmp_path / "subset.npz"
    for made_for in (there.data_name, "imagefolder:imagenet:2"):  # an older lipt's: no digest
        meta = {"dataset": made_for, "dataset_train_size": len(there.train_source)}
        save_subset(path, torch.arange(3), torch.ones(3), meta)
        with pytest.raises(UserError) as caught:
            load_checked_subset(here, path)
        message = one_line(caught.value)
        assert message.startswith(f"{path} was made for dataset={made_for!r}, this run has ")
        assert "another ImageFolder tree, or this one before its files changed" in message
    meta = {"dataset": here.data_name, "dataset_train_size": len(here.train_source)}
    save_subset(path, torch.arange(3), torch.ones(3), meta)
    indices, _ = load_checked_subset(here, path)  # its own tree's: reused
    assert indices.tolist() == [0, 1, 2]
