"""Speed options applied to any lipt model after it is built: channels_last memory format and
`torch.compile`. Neither changes the parameters' names, so checkpoints, soups and selectors
see the same state dict either way."""

from __future__ import annotations

import torch
from torch import nn


def apply_speed_options(
    model: nn.Module, channels_last: bool = False, compile: bool = False
) -> nn.Module:
    """`channels_last`: NHWC weights, which convolutions on CUDA (cuDNN, tensor cores under
    bf16) run faster; inputs follow the weights' format. `compile`: `nn.Module.compile()`,
    in place, so the module keeps its class, `embed` and `classifier` (only `forward` through
    `__call__` is compiled)."""
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if compile:
        model.compile()
    return model
