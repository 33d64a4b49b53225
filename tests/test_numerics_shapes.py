"""Extreme image shapes: an image smaller than the model's pooling takes is refused in one line
before any work, instead of a traceback from max_pool2d at main training's first batch (after
pre-training and selection); the smallest image it allows trains."""

from __future__ import annotations

import pytest
import torch

from lipt.core.errors import UserError
from lipt.models import ConvNet, ResNet18
from lipt.run.config import validate

SMALL = ["dataset=synthetic", "pretrain=none", "selector=random", "budget=subset"]


@pytest.mark.parametrize("size", [1, 2, 3])
def test_images_below_the_convnets_smallest_input_are_refused_before_any_work(make_cfg, size):
    with pytest.raises(UserError) as caught:
        validate(make_cfg([*SMALL, f"dataset.image_size={size}"]), deep=True, build=False)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        f"dataset.image_size={size} is smaller than lipt.models.ConvNet's smallest input, 4x4"
    ), message
    # What the refusal stands for: the model itself cannot take such an image.
    model = ConvNet(1, 4, width=4).eval()
    with pytest.raises(RuntimeError, match="Output size is too small"):
        model(torch.zeros(2, 1, size, size))


@pytest.mark.parametrize(
    ("overrides", "side"),
    [(["dataset.image_size=4"], 4), (["dataset.image_size=1", "model=resnet18"], 1)],
    ids=["convnet-at-its-smallest", "resnet18-at-1x1"],
)
def test_the_smallest_images_a_model_takes_pass_and_give_logits(make_cfg, overrides, side):
    validate(make_cfg([*SMALL, *overrides]), deep=True, build=False)
    model = (ResNet18 if "model=resnet18" in overrides else ConvNet)(1, 4).eval()
    logits = model(torch.zeros(2, 1, side, side))
    assert logits.shape == (2, 4) and bool(torch.isfinite(logits).all())
