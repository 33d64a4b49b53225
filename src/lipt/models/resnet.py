"""ResNet-18 with the CIFAR stem (3x3 conv, no max-pool; He et al. 2016), WRN-28-10
(Zagoruyko & Komodakis 2016) and WRN-50-2 (torchvision's ImageNet wide ResNet)."""

from __future__ import annotations

from typing import Annotated

import torch.nn.functional as F
from torch import Tensor, nn

from lipt.core.bounds import BELOW_ONE, COUNT, Interval


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR-stem ResNet-18; `embed` gives the [B, 512] pooled features."""

    def __init__(
        self, in_channels: Annotated[int, COUNT], num_classes: Annotated[int, COUNT]
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()
        )
        layers: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def embed(self, x: Tensor) -> Tensor:
        out = self.layers(self.stem(x))  # [B, 512, H/8, W/8]
        return F.adaptive_avg_pool2d(out, 1).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.embed(x))


class WideBasic(nn.Module):
    """Pre-activation wide block with dropout between the convolutions."""

    def __init__(self, cin: int, cout: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride, 1, bias=False)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False))

    def forward(self, x: Tensor) -> Tensor:
        out = self.dropout(self.conv1(F.relu(self.bn1(x))))
        out = self.conv2(F.relu(self.bn2(out)))
        return out + self.shortcut(x)


class WideResNet(nn.Module):
    """WRN-depth-k for 32x32 inputs; `embed` gives the [B, 64k] pooled features."""

    def __init__(
        self,
        in_channels: Annotated[int, COUNT],
        num_classes: Annotated[int, COUNT],
        depth: Annotated[int, Interval(ge=10, le=1000)] = 28,  # 6n + 4
        k: Annotated[int, Interval(ge=1, le=64)] = 10,
        dropout: Annotated[float, BELOW_ONE] = 0.0,
    ) -> None:
        super().__init__()
        if (depth - 4) % 6 != 0:
            raise ValueError(f"WRN depth must be 6n+4, got {depth}")
        n = (depth - 4) // 6
        widths = [16, 16 * k, 32 * k, 64 * k]
        self.stem = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        blocks: list[nn.Module] = []
        cin = widths[0]
        for cout, stride in zip(widths[1:], (1, 2, 2), strict=True):
            for i in range(n):
                blocks.append(WideBasic(cin, cout, stride if i == 0 else 1, dropout))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(cin)
        self.classifier = nn.Linear(cin, num_classes)

    def embed(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn(self.blocks(self.stem(x))))
        return F.adaptive_avg_pool2d(out, 1).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.embed(x))


class WideResNet50x2(nn.Module):
    """torchvision's wide_resnet50_2 (ImageNet stem), randomly initialised, split into
    `embed` ([B, 2048]) and `classifier`."""

    def __init__(
        self, in_channels: Annotated[int, COUNT], num_classes: Annotated[int, COUNT]
    ) -> None:
        super().__init__()
        from torchvision.models import wide_resnet50_2

        net = wide_resnet50_2(weights=None, num_classes=num_classes)
        if in_channels != 3:
            net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        self.classifier = net.fc
        net.fc = nn.Identity()  # type: ignore[assignment]
        self.body = net

    def embed(self, x: Tensor) -> Tensor:
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.embed(x))
