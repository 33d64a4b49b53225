"""Every model exposes penultimate features and a final linear layer that produce its logits."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate


@pytest.mark.parametrize(
    ("name", "dataset", "size"),
    [
        ("convnet", "synthetic", 12),
        ("resnet18", "synthetic", 16),
        ("wrn_28_10", "synthetic", 16),
        ("wrn_50_2", "synthetic", 32),
    ],
)
def test_embed_and_classifier_compose_to_forward(make_cfg, name, dataset, size):
    overrides = [
        f"model={name}",
        f"dataset={dataset}",
        f"dataset.image_size={size}",
        "dataset.channels=3",
    ]
    if name == "wrn_28_10":
        overrides += ["model.k=1", "model.depth=10"]  # the real width is too big for a unit test
    model = instantiate(make_cfg(overrides).model).eval()
    x = torch.randn(2, 3, size, size)
    h = model.embed(x)
    assert h.ndim == 2 and h.shape[1] == model.classifier.in_features
    assert isinstance(model.classifier, torch.nn.Linear) and model.classifier.out_features == 4
    torch.testing.assert_close(model(x), model.classifier(h))


def test_full_size_models_have_the_published_parameter_counts(make_cfg):
    resnet = instantiate(
        make_cfg(["model=resnet18", "dataset=cifar10", "dataset.data_dir=/"]).model
    )
    wrn = instantiate(make_cfg(["model=wrn_28_10", "dataset=cifar10", "dataset.data_dir=/"]).model)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert abs(count(resnet) - 11.17e6) < 0.05e6  # ResNet-18 (CIFAR): 11.17M
    assert abs(count(wrn) - 36.48e6) < 0.1e6  # WRN-28-10: 36.5M
