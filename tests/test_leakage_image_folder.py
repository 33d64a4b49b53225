"""An ImageFolder tree's `val/` is the test split. One that is `train/` (a link, as a quick
way to "have a val folder") tested the run on its own training images without a word."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lipt.core.errors import UserError
from lipt.data.sources import load_image_folder
from tests.test_data import image_tree


def test_a_val_folder_that_is_the_train_folder_is_refused(tmp_path):
    root = image_tree(tmp_path / "tree")
    load_image_folder(str(root), 36, 32)  # its own val/: read
    shutil.rmtree(root / "val")
    (root / "val").symlink_to(root / "train", target_is_directory=True)
    with pytest.raises(UserError, match=r"val is .*train \(a link\): val/ is the test split"):
        load_image_folder(str(root), 36, 32)


def test_a_val_class_folder_that_is_a_train_class_folder_is_refused(tmp_path):
    """The same link one level down: val/<class> -> train/<class> (or another class's)."""
    root = image_tree(tmp_path / "tree")
    first, second = sorted(p.name for p in (root / "val").iterdir())[:2]
    shutil.rmtree(root / "val" / second)
    (root / "val" / second).symlink_to(root / "train" / first, target_is_directory=True)
    with pytest.raises(UserError, match=rf"val/{second}/\S+ is \S+/train/{first}/\S+ \(a link\)"):
        load_image_folder(str(root), 36, 32)


@pytest.mark.parametrize("shape", ["class_to_train", "subfolder_to_class"])
def test_a_val_folder_linked_into_train_at_any_depth_is_refused(tmp_path: Path, shape: str) -> None:
    """val/ and val/<class> linked to train/ folders are refused, but a link one level further
    (val/<class>/more -> train/<class>), or val/<class> -> train/ itself, was read: the test
    split then held training files (8 of 10 and 4 of 8 in this tree), which the run trained on."""
    root = image_tree(tmp_path / "tree")
    second = sorted(p.name for p in (root / "val").iterdir())[1]
    if shape == "class_to_train":
        shutil.rmtree(root / "val" / second)
        (root / "val" / second).symlink_to(root / "train", target_is_directory=True)
    else:
        (root / "val" / second / "more").symlink_to(
            root / "train" / second, target_is_directory=True
        )
    with pytest.raises(UserError, match="val/ is the test split"):
        load_image_folder(str(root), 36, 32)
