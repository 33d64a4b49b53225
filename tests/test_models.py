"""Every model exposes non-negative penultimate features and a final linear layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipt.run.config import run_of
from lipt.stages.build import build_model


@pytest.mark.parametrize(
    ("name", "size"),
    [("convnet", 12), ("resnet18", 16), ("wrn_28_10", 16), ("wrn_50_2", 32)],
)
def test_models_give_relu_features_to_a_final_linear_layer(make_cfg, name, size):
    """What the selectors rely on: `embed` gives non-negative (ReLU) features of the width
    `classifier` takes, the last layer's gradient is (softmax - onehot) x features as the
    selectors compute it, and the loss's gradient reaches the first layer."""
    overrides = ["model=" + name, "dataset=synthetic", f"dataset.image_size={size}"]
    overrides += ["dataset.channels=3", "dataset.mean=[0.5,0.5,0.5]", "dataset.std=[0.5,0.5,0.5]"]
    if name == "wrn_28_10":
        overrides += ["model.k=1", "model.depth=10"]  # the real width is too big for a unit test
    model = build_model(run_of(make_cfg(overrides)), seed=0)
    assert isinstance(model.classifier, torch.nn.Linear) and model.classifier.out_features == 4
    x, y = torch.randn(16, 3, size, size), torch.arange(16) % 4
    model.eval()  # fixed batch-norm statistics: embed and forward see the same features
    h = model.embed(x)
    assert h.shape == (16, model.classifier.in_features)
    assert float(h.min()) >= 0 and float((h > 0).float().mean()) > 0.2  # ReLU, not dead
    loss = F.cross_entropy(model(x), y, reduction="sum")
    first = next(p for p in model.parameters() if p.ndim == 4)  # the stem's conv weight
    grad, stem_grad = torch.autograd.grad(loss, [model.classifier.weight, first])
    residual = F.softmax(model.classifier(h), 1) - F.one_hot(y, 4)  # [B, C]
    torch.testing.assert_close(grad, residual.T @ h, rtol=1e-4, atol=1e-5)  # [C, D]

    assert torch.isfinite(stem_grad).all() and float(stem_grad.abs().sum()) > 0


def test_full_size_models_have_the_published_parameter_counts(make_cfg):
    resnet = build_model(
        run_of(make_cfg(["model=resnet18", "dataset=cifar10", "dataset.data_dir=/"])), 0
    )
    wrn = build_model(
        run_of(make_cfg(["model=wrn_28_10", "dataset=cifar10", "dataset.data_dir=/"])), 0
    )
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert abs(count(resnet) - 11.17e6) < 0.05e6  # ResNet-18 (CIFAR): 11.17M
    assert abs(count(wrn) - 36.48e6) < 0.1e6  # WRN-28-10: 36.5M


def test_lipts_classifier_trains_on_int32_labels_as_on_int64_ones():
    """A user's TensorDataset with int32 labels (what numpy's int32 arrays become): cross-entropy
    takes int64 targets only, so the step casts them; the model trained is the int64 one's."""
    import lightning as L
    from torch import nn
    from torch.utils.data import TensorDataset

    import lipt

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(512, 32, generator=gen), torch.randint(0, 10, (512,), generator=gen)

    def fit(labels: torch.Tensor) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        module = lipt.Classifier(net, num_classes=10)
        data = lipt.PoolDataModule(TensorDataset(x, labels), batch_size=64, val_size=64)
        trainer = L.Trainer(
            max_epochs=2,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(module, datamodule=data)
        return {k: v.clone() for k, v in net.state_dict().items()}

    as_int64, as_int32 = fit(y), fit(y.int())
    assert as_int64.keys() == as_int32.keys()
    for key in as_int64:
        torch.testing.assert_close(as_int32[key], as_int64[key], rtol=0, atol=0)
