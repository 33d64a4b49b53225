"""A user's own data set as lipt reads it: ImageFolder trees with the odd cases real trees have
(empty or stray class folders, validation classes the training split lacks, symlinks, every
format torchvision's ImageFolder lists, 16-bit images), refused in one line or read as
torchvision reads them."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from lipt.core.errors import UserError
from lipt.data.image_files import IMAGE_EXTENSIONS
from lipt.report.pictures import write_subset_picture
from lipt.run.config import run_of
from lipt.stages.build import build_datamodule

CLASSES = ("cat", "dog", "fox")


def write_tree(root: Path, per_class: tuple[int, int] = (12, 3), ext: str = ".png") -> Path:
    """train/<class>/ and val/<class>/ of 40x50 RGB images, class c at brightness 60c + 40."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in zip(("train", "val"), per_class, strict=True):
        for c, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                noise = rng.normal(0, 10, (40, 50, 3))
                pixels = np.clip(60 * c + 40 + noise, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{name}_{i}{ext}")
    return root


def tree_module(make_cfg, root: Path, *extra: str):
    return build_datamodule(
        run_of(
            make_cfg(
                [
                    "dataset=imagenet",
                    f"dataset.data_dir={root}",
                    f"dataset.num_classes={len(CLASSES)}",
                    "dataset.image_size=32",
                    "dataset.resize=36",
                    "dataset.val_size=6",
                    "dataset.num_workers=0",
                    *extra,
                ]
            )
        )
    )


@pytest.mark.parametrize("folder", [".ipynb_checkpoints", "zebra"])
def test_a_class_folder_without_images_is_refused_naming_it(make_cfg, tmp_path, folder):
    """torchvision's ImageFolder refuses a class without files; lipt trained a model with a
    class no item had (dataset.num_classes counting it), or told the user to count it."""
    root = write_tree(tmp_path / "tree")
    (root / "train" / folder).mkdir()
    (root / "train" / folder / "notes.txt").write_text("no image here")
    with pytest.raises(UserError, match=rf"hold no images .*: {folder}; remove them or add"):
        tree_module(make_cfg, root, "dataset.num_classes=4")
    with pytest.raises(UserError, match=rf": {folder}; remove them"):
        tree_module(make_cfg, root)


def test_validation_class_folders_the_training_split_lacks_are_refused(make_cfg, tmp_path):
    """A class folder of val/ whose name train/ lacks (a typo, a class left out) had its images
    dropped from the test split without a word: the test accuracy was over the rest."""
    root = write_tree(tmp_path / "tree")
    extra = root / "val" / "wolf"
    extra.mkdir()
    (root / "val" / "cat" / "cat_0.png").rename(extra / "wolf_0.png")
    (root / "val" / "empty").mkdir()  # an empty folder holds no test image: no harm
    with pytest.raises(UserError, match=r"val has class folder\(s\) with images that .*: wolf;"):
        tree_module(make_cfg, root)
    (extra / "wolf_0.png").unlink()
    dm = tree_module(make_cfg, root)
    assert len(dm.splits.test) == 3 * 3 - 1


def test_a_symlink_loop_in_a_class_folder_is_refused(make_cfg, tmp_path):
    """A link inside a class folder back to a folder above it: the walk, which follows links as
    torchvision's does, read every class's images again and again under that class (thousands
    of items labelled cat from 36 files)."""
    root = write_tree(tmp_path / "tree")
    link = root / "train" / "cat" / "up"
    os.symlink("..", link)
    with pytest.raises(UserError, match=rf"^{link} links to {root / 'train'}, a folder above it"):
        tree_module(make_cfg, root)


def test_a_symlink_loop_through_a_folder_outside_the_tree_is_refused(make_cfg, tmp_path):
    """A loop that leaves the class folder: cat/x links to a folder elsewhere, which links back
    to cat. No link points above its own path, yet the walk listed cat's images again at every
    turn of the loop (21 copies of one image)."""
    root = write_tree(tmp_path / "tree")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, root / "train" / "cat" / "x")
    os.symlink(root / "train" / "cat", elsewhere / "back")
    link = root / "train" / "cat" / "x" / "back"
    with pytest.raises(UserError, match=rf"^{link} links to {root / 'train' / 'cat'}, a folder"):
        tree_module(make_cfg, root)


def test_linked_class_folders_and_files_are_read(make_cfg, tmp_path):
    """Links that make no loop are followed, as torchvision follows them: a class folder that is
    a link, an image that is a link, a subfolder linking to a folder elsewhere."""
    from torchvision.datasets import ImageFolder

    root = write_tree(tmp_path / "tree")
    elsewhere = write_tree(tmp_path / "elsewhere", per_class=(2, 0))
    (root / "train" / "dog").rename(tmp_path / "dog_store")
    os.symlink(tmp_path / "dog_store", root / "train" / "dog")
    os.symlink(elsewhere / "train" / "cat" / "cat_0.png", root / "train" / "cat" / "linked.png")
    os.symlink(elsewhere / "train" / "fox", root / "train" / "fox" / "more")
    dm = tree_module(make_cfg, root)
    samples = ImageFolder(str(root / "train")).samples
    assert [str(p) for p in dm.train_source.paths] == [path for path, _ in samples]
    assert dm.train_source.labels.tolist() == [label for _, label in samples]
    assert len(dm.train_source) == 3 * 12 + 1 + 2


def test_every_format_torchvisions_image_folder_lists_is_read(make_cfg, tmp_path):
    """.pgm, .tif and .tiff files (torchvision's ImageFolder lists them) were skipped without a
    word, and a tree of only those was refused as holding no images."""
    from PIL import Image
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import IMG_EXTENSIONS

    assert set(IMG_EXTENSIONS) <= set(IMAGE_EXTENSIONS)
    root = write_tree(tmp_path / "tree", per_class=(1, 1))
    grey = np.full((40, 50), 124, np.uint8)
    for split in ("train", "val"):
        for name in CLASSES:
            for ext in (".pgm", ".tif", ".TIFF"):
                Image.fromarray(grey).save(root / split / name / f"grey{ext}")
    dm = tree_module(make_cfg, root)
    samples = ImageFolder(str(root / "train")).samples
    assert [str(p) for p in dm.train_source.paths] == [path for path, _ in samples]
    assert len(dm.train_source) == 3 * 4
    for i, path in enumerate(dm.train_source.paths):
        if path.name.startswith("grey"):
            assert torch.equal(
                dm.train_source.image(i), torch.full((3, 32, 32), 124, dtype=torch.uint8)
            )
    only = tmp_path / "tiff-only"
    for split in ("train", "val"):
        for name in CLASSES:
            (only / split / name).mkdir(parents=True)
            Image.fromarray(grey).save(only / split / name / "a.tif")
    assert len(tree_module(make_cfg, only, "dataset.val_size=0").train_source) == 3


@pytest.mark.parametrize("ext", [".png", ".tif", ".pgm"])
def test_16_bit_images_are_read_as_8_bit_pixels(make_cfg, tmp_path, ext):
    """A 16-bit PNG decoded as uint16, which the subset picture could not put beside the 8-bit
    images (a traceback after selection, on every resume); a 16-bit TIFF was clipped to white
    by PIL's convert, as was a 16-bit PGM (PIL opens it as 32-bit integers). Each reads as its
    top 8 bits, the uint8 the readers promise."""
    from PIL import Image

    root = write_tree(tmp_path / "tree")
    deep = (np.arange(40 * 50, dtype=np.uint16).reshape(40, 50) * 30) + 1000
    Image.fromarray(deep).save(root / "train" / "cat" / f"deep{ext}")
    dm = tree_module(make_cfg, root, "dataset.resize=40", "dataset.image_size=40")
    position = [p.name for p in dm.train_source.paths].index(f"deep{ext}")
    image = dm.train_source.image(position)
    assert image.dtype == torch.uint8 and image.shape == (3, 40, 40)
    expected = torch.from_numpy((deep >> 8).astype(np.uint8))[:, 5:45]
    assert torch.equal(image[0], expected) and torch.equal(image[2], expected)
    grey = build_datamodule(
        run_of(
            make_cfg(
                [
                    "dataset=imagenet",
                    f"dataset.data_dir={root}",
                    "dataset.num_classes=3",
                    "dataset.image_size=40",
                    "dataset.resize=40",
                    "dataset.val_size=6",
                    "dataset.num_workers=0",
                    "dataset.channels=1",
                    "dataset.mean=[0.5]",
                    "dataset.std=[0.25]",
                ]
            )
        )
    )
    assert torch.equal(grey.train_source.image(position)[0], expected)
    write_subset_picture(dm, dm.pool_indices, tmp_path / "subset.png")
    assert (tmp_path / "subset.png").stat().st_size > 0


# --- your own map-style data set: PoolDataModule's validation split ----------------------------


@pytest.mark.parametrize(
    ("val_size", "rows"), [(0, 0), (120, 120), (np.int64(120), 120), (0.1, 120), (0.0, 0)]
)
def test_pool_data_module_takes_a_count_or_a_share_as_val_size(val_size, rows):
    from torch.utils.data import TensorDataset

    import lipt

    data = TensorDataset(torch.randn(1200, 8), torch.randint(0, 10, (1200,)))
    module = lipt.PoolDataModule(data, val_size=val_size)
    assert len(module.val_indices) == rows and len(module.pool_indices) == 1200 - rows


@pytest.mark.parametrize("val_size", [-0.1, -5, 1.0, 1.5, 120.0, True, "0.1"])
def test_pool_data_module_refuses_a_val_size_that_is_no_count_or_share(val_size):
    """-0.1 gave no validation split without a word, 1.5 and True a split of one item and 120.0
    one of 120 (where lipt's config refuses each), -5 was told to use a smaller val_size, and a
    string failed in a comparison of int and str."""
    from torch.utils.data import TensorDataset

    import lipt

    data = TensorDataset(torch.randn(1200, 8), torch.randint(0, 10, (1200,)))
    with pytest.raises(ValueError, match=r"is neither a count of items .* nor a share of them"):
        lipt.PoolDataModule(data, val_size=val_size)


class NumpyBacked(torch.utils.data.Dataset):
    """A data set held in numpy arrays, as many users' are: its labels are numpy integers."""

    def __init__(self, n: int = 1200, dtype: type = np.int64) -> None:
        rng = np.random.default_rng(0)
        self.labels = rng.integers(0, 4, n).astype(dtype)
        self.inputs = (rng.normal(size=(n, 16)) + self.labels[:, None]).astype(np.float32)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, np.integer]:
        return torch.from_numpy(self.inputs[i]), self.labels[i]


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
def test_numpy_integer_labels_are_class_indices(dtype):
    """np.int64(3) was refused as "not a class index", though the DataLoader collates it as
    an integer tensor: a numpy-backed data set could not be lipt's pool."""
    import lipt

    data = NumpyBacked(dtype=dtype)
    module = lipt.PoolDataModule(data, val_size=0.1, batch_size=100)
    assert torch.equal(module.labels(), torch.from_numpy(data.labels.astype(np.int64)))
    _, y, idx = next(iter(module.pool_dataloader()))
    assert not y.is_floating_point() and torch.equal(y.long(), module.labels()[idx])
    net = torch.nn.Linear(16, 4)
    subset = lipt.select(net, module, 0.1, "el2n")
    assert len(subset.indices) == round(0.1 * len(module.pool_indices))


def test_numpy_bools_and_negative_integers_are_no_class_index():
    from lipt.data.contract import check_labelled

    for label in (np.bool_(True), np.int64(-1)):
        data = [(torch.zeros(2), label)]
        with pytest.raises(ValueError, match="not a class index"):
            check_labelled(data, "train")


def test_a_32_bit_integer_tiff_keeps_its_8_bit_values(tmp_path):
    """PIL opens a 16-bit PGM and a 32-bit integer TIFF alike (mode "I"): only the PGM is read
    as 16 bits and shifted to its top 8; a TIFF of values 0..255 keeps them (it read as black
    when both were shifted)."""
    from PIL import Image

    from lipt.data.image_files import decode_file

    values = np.arange(64, dtype=np.int32).reshape(8, 8) * 4
    Image.fromarray(values, mode="I").save(tmp_path / "wide.tif")
    assert torch.equal(decode_file(tmp_path / "wide.tif", 1)[0], torch.from_numpy(values).byte())
