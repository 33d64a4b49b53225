"""Per-sample transforms on uint8 [C, H, W] tensors (torchvision.transforms.v2).

Main training uses the mild default (random crop with padding, horizontal flip); the jigsaw
learners add RandAugment (Cubuk et al. 2020, https://arxiv.org/abs/1909.13719) on top, as the
paper does during pre-training only. Selection and evaluation see un-augmented images.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torchvision.transforms import v2

Transform = Callable[[Tensor], Tensor]


def eval_transform(mean: Sequence[float], std: Sequence[float]) -> Transform:
    return v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))])


def train_transform(
    mean: Sequence[float],
    std: Sequence[float],
    image_size: int,
    crop_padding: int = 4,
    flip: bool = True,
    randaugment: dict | None = None,
) -> Transform:
    """Mild augmentation, plus RandAugment(num_ops, magnitude) when `randaugment` is given."""
    steps: list[Transform] = []
    if crop_padding > 0:
        steps.append(v2.RandomCrop(image_size, padding=crop_padding))
    if flip:
        steps.append(v2.RandomHorizontalFlip())
    if randaugment is not None:
        steps.append(
            v2.RandAugment(
                num_ops=int(randaugment.get("num_ops", 1)),
                magnitude=int(randaugment.get("magnitude", 9)),
                num_magnitude_bins=int(randaugment.get("num_magnitude_bins", 31)),
            )
        )
    steps.append(eval_transform(mean, std))
    return v2.Compose(steps)
