"""Augmentation, normalisation and image reading on inputs a researcher may give: RandAugment on
images that are neither grey nor RGB, an ImageFolder tree's centre crop larger than its short
side, a mean and std of another number of channels than the data's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from lipt.core.errors import UserError
from lipt.data import DataModule
from lipt.data.batch_transforms import RandAugmentSettings, rand_augment
from lipt.data.sources import expected_files, load_image_folder, make_synthetic
from lipt.run.config import run_of
from lipt.stages.build import build_datamodule

RANDAUGMENT = {"num_ops": 1, "magnitude": 9, "num_magnitude_bins": 31}


@pytest.mark.parametrize("channels", [2, 4])
def test_randaugment_refuses_images_neither_grey_nor_rgb(channels):
    """Contrast averaged a missing blue channel into NaN images (2 channels); colour took the
    first three of four as RGB."""
    x = torch.rand(8, channels, 12, 12) * 255
    with pytest.raises(ValueError, match=f"grey \\(1\\) or RGB \\(3\\) images, not {channels}"):
        rand_augment(x, RandAugmentSettings(), torch.Generator().manual_seed(0))


@pytest.mark.parametrize("resident", [True, False])
def test_a_learners_randaugment_on_two_channel_data_is_a_user_error(make_cfg, resident):
    """Before any learner trains: the resident path's NaN losses read as 'diverged, lower the
    learning rate', the DataLoader path's TypeError as each learner failing."""
    overrides = [
        "dataset=synthetic",
        "dataset.channels=2",
        "dataset.mean=[0.5,0.5]",
        "dataset.std=[0.25,0.25]",
        f"dataset.resident={str(resident).lower()}",
    ]
    dm = build_datamodule(run_of(make_cfg(overrides)))
    dm.device = "cpu"
    dm.setup()
    shard = dm.pool_indices[:32]
    with pytest.raises(UserError, match=r"dataset.channels=2; use augment=none"):
        dm.shard_dataloader(shard, RANDAUGMENT)
    batch = next(iter(dm.shard_dataloader(shard, None)))  # augment=none: crop and flip only
    assert batch[0].shape[1] == 2 and bool(torch.isfinite(batch[0]).all())


def test_randaugment_on_two_channel_data_is_refused_by_the_config_checks(make_cfg):
    """`dry_run=true` and every job of a sweep see it: the checks composing the config refuse
    what the data module would refuse once pre-training starts."""
    from lipt.run.config import validate

    two = ["dataset=synthetic", "dataset.channels=2", "dataset.mean=[0.5,0.5]"]
    two += ["dataset.std=[0.25,0.25]", "pretrain=jigsaw"]
    with pytest.raises(UserError, match=r"dataset.channels=2; use augment=none"):
        validate(make_cfg([*two, "augment=randaugment"]))
    validate(make_cfg([*two, "augment=none"]))
    # where no jigsaw learner trains, no image is augmented
    validate(make_cfg([*two, "augment=randaugment", "pretrain=none", "budget=infobatch"]))


def _tree(root) -> None:
    for split in ("train", "val"):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            pixels = np.full((40, 50, 3), 200, np.uint8)
            Image.fromarray(pixels).save(root / split / c / "0.png")


def test_a_centre_crop_larger_than_the_short_side_is_refused(tmp_path):
    """It padded every image with black (44% of a 48x48 crop of a 32-pixel short side)."""
    _tree(tmp_path)
    settings = {"data_dir": str(tmp_path), "resize": 32, "size": 48, "channels": 3}
    message = r"dataset.resize=32 is below dataset.image_size=48.*set dataset.resize=48 or more"
    with pytest.raises(UserError, match=message):
        load_image_folder(**settings)
    with pytest.raises(UserError, match=message):  # the check before any stage starts
        expected_files("lipt.data.sources.load_image_folder", settings)
    image = load_image_folder(**{**settings, "resize": 48}).train.image(0)
    assert image.shape == (3, 48, 48) and int(image.min()) == 200  # no black border


@pytest.mark.parametrize("resident", [True, False])
def test_a_data_module_refuses_a_mean_or_std_per_channel_of_other_data(resident):
    """ImageNet's three values on grey images broadcast every batch, on both paths, to three
    channels, which the one-channel model then failed on."""

    def load():
        return make_synthetic(60, 20, 4, 1, 8, 0)

    with pytest.raises(ValueError, match=r"one value per channel \(1\)"):
        DataModule(load, 4, 1, 8, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], resident=resident)
    dm = DataModule(load, 4, 1, 8, [0.5], [0.25], val_size=10, resident=resident, device="cpu")
    dm.setup()
    assert next(iter(dm.val_dataloader()))[0].shape == (10, 1, 8, 8)
