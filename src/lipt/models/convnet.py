"""A small CNN sized for two CPU cores (Fashion-MNIST in minutes)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from torch import Tensor, nn

from lipt.core.bounds import COUNT, Interval


class ConvNet(nn.Module):
    """Three conv blocks (conv-BN-ReLU, max-pool after the first two), global average pooling,
    then the final linear layer. `embed` returns the [B, 4*width] penultimate features."""

    # The smallest image side its two 2x2 max-pools take (4 -> 2 -> 1; a 3x3 image's second
    # pool would have no output): lipt.run.rules refuses a smaller dataset.image_size.
    min_image_size: ClassVar[int] = 4

    def __init__(
        self,
        in_channels: Annotated[int, COUNT],
        num_classes: Annotated[int, COUNT],
        width: Annotated[int, Interval(ge=1, le=4096)] = 32,
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_block(in_channels, width),
            nn.MaxPool2d(2),
            *_block(width, 2 * width),
            nn.MaxPool2d(2),
            *_block(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(4 * width, num_classes)

    def embed(self, x: Tensor) -> Tensor:
        return self.features(x)  # [B, C, H, W] -> [B, 4*width]

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.embed(x))


def _block(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
