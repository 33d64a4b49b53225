"""Models. Every model exposes `embed(x) -> [B, D]` (penultimate features) and `classifier`,
its final `nn.Linear`, so selectors can form last-layer gradients in closed form."""

from lipt.models.convnet import ConvNet
from lipt.models.resnet import ResNet18, WideResNet, WideResNet50x2

__all__ = ["ConvNet", "ResNet18", "WideResNet", "WideResNet50x2"]
