"""Closed-form last-layer gradients against autograd, the structured inner products against
explicit ones, and `model_outputs` (row order, eval mode, mode restore)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lipt.selection import (
    LastLayerGradient,
    bias_gradients,
    gradient_dots,
    gradient_gram,
    gradient_sq_norms,
    gradient_sum,
    last_layer_gradients,
    model_outputs,
)

N, C, D = 9, 4, 5


def _autograd_per_sample(linear: nn.Linear, h: Tensor, y: Tensor) -> Tensor:
    """[N, C*D + C] per-sample d CE / d (weight, bias) by autograd, one sample at a time."""
    rows = []
    for i in range(h.shape[0]):
        loss = F.cross_entropy(linear(h[i : i + 1]), y[i : i + 1], reduction="sum")
        gw, gb = torch.autograd.grad(loss, [linear.weight, linear.bias])
        rows.append(torch.cat([gw.flatten(), gb]))
    return torch.stack(rows)


@pytest.fixture
def setup() -> tuple[nn.Linear, Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    linear = nn.Linear(D, C)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(C, D, generator=g))
        linear.bias.copy_(torch.randn(C, generator=g))
    h = torch.randn(N, D, generator=g) * 2
    y = torch.randint(C, (N,), generator=g)
    with torch.no_grad():
        logits = linear(h)
    return linear, h, y, logits


def test_closed_form_matches_autograd(setup: tuple[nn.Linear, Tensor, Tensor, Tensor]) -> None:
    linear, h, y, logits = setup
    expected = _autograd_per_sample(linear, h, y)  # [N, C*D + C]
    full = last_layer_gradients(logits, y, h)
    assert full.shape == (N, C * D + C)
    torch.testing.assert_close(full, expected, atol=1e-5, rtol=1e-5)
    bias = last_layer_gradients(logits, y)
    torch.testing.assert_close(bias, expected[:, C * D :], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(bias_gradients(logits, y), bias)


@pytest.mark.parametrize("with_weights", [True, False])
def test_structured_products_match_explicit(
    setup: tuple[nn.Linear, Tensor, Tensor, Tensor], with_weights: bool
) -> None:
    _, h, y, logits = setup
    hh = h if with_weights else None
    G = last_layer_gradients(logits, y, hh).double()  # explicit [N, P]
    e = bias_gradients(logits, y)

    torch.testing.assert_close(gradient_gram(e, e, hh, hh).double(), G @ G.T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        gradient_gram(
            e[:3], e[3:], None if hh is None else hh[:3], None if hh is None else hh[3:]
        ).double(),
        G[:3] @ G[3:].T,
        rtol=1e-5,
        atol=1e-5,
    )
    torch.testing.assert_close(
        gradient_sq_norms(e, hh, chunk_size=2).double(), (G**2).sum(1), rtol=1e-5, atol=1e-5
    )

    total = gradient_sum(e, hh, chunk_size=4)
    flat = total.bias if total.weight is None else torch.cat([total.weight.flatten(), total.bias])
    torch.testing.assert_close(flat.double(), G.sum(0), rtol=1e-5, atol=1e-5)

    g = torch.Generator().manual_seed(1)
    other = LastLayerGradient(
        torch.randn(C, D, generator=g) if with_weights else None, torch.randn(C, generator=g)
    )
    vec = other.bias if other.weight is None else torch.cat([other.weight.flatten(), other.bias])
    torch.testing.assert_close(
        gradient_dots(e, other, hh, chunk_size=2).double(), G @ vec.double(), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(other.sq_norm(), (vec.double() ** 2).sum())


class _DropoutBNNet(nn.Module):
    """embed: Linear-BN-ReLU-Dropout, so train and eval mode give different outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5))
        self.classifier = nn.Linear(8, 3)

    def embed(self, x: Tensor) -> Tensor:
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.embed(x))


def _net_and_data() -> tuple[_DropoutBNNet, TensorDataset]:
    torch.manual_seed(0)
    net = _DropoutBNNet()
    with torch.no_grad():  # non-trivial running statistics
        net.body[1].running_mean.uniform_(-1, 1)
        net.body[1].running_var.uniform_(0.5, 2)
    x = torch.randn(50, 6)
    y = torch.randint(3, (50,))
    idx = 1000 + 3 * torch.arange(50)  # dataset positions, not 0..N-1
    return net, TensorDataset(x, y, idx)


def test_model_outputs_sorted_by_index_in_eval_mode() -> None:
    net, data = _net_and_data()
    x, y, idx = data.tensors
    net.train()
    bn_mean = net.body[1].running_mean.clone()

    shuffled = DataLoader(
        data, batch_size=7, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    order_seen = torch.cat([b[2] for b in shuffled])
    assert not torch.equal(order_seen, idx)  # the loader really shuffles
    out = model_outputs(net, shuffled)
    plain = model_outputs(net, DataLoader(data, batch_size=16, shuffle=False))

    assert torch.equal(out.indices, idx)
    assert torch.equal(out.targets, y)
    torch.testing.assert_close(out.logits, plain.logits)
    torch.testing.assert_close(out.embeddings, plain.embeddings)

    net.eval()
    with torch.no_grad():
        h_eval = net.embed(x)
        z_eval = net.classifier(h_eval)
    torch.testing.assert_close(out.embeddings, h_eval, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.logits, z_eval, rtol=1e-5, atol=1e-6)
    assert torch.equal(net.body[1].running_mean, bn_mean)  # eval mode: statistics untouched
    assert out.logits.dtype == torch.float32 and out.indices.dtype == torch.int64


def test_model_outputs_restores_each_module_mode() -> None:
    net, data = _net_and_data()
    net.train()
    net.body[1].eval()  # e.g. frozen BatchNorm inside a training model
    model_outputs(net, DataLoader(data, batch_size=10))
    assert net.training and net.body[0].training and net.classifier.training
    assert not net.body[1].training
    net.eval()
    model_outputs(net, DataLoader(data, batch_size=10))
    assert not any(m.training for m in net.modules())


def test_model_outputs_channels_last_gives_the_same_outputs_and_restores_the_layout() -> None:
    # convnet at its real shapes (28x28 images, 128-dim embeddings), BatchNorm statistics not
    # trivial: the channels-last pass is the same function, computed by other kernels.
    from lipt.models.convnet import ConvNet

    torch.manual_seed(0)
    net = ConvNet(1, 10)
    net.train()
    x = torch.randn(300, 1, 28, 28)
    with torch.no_grad():
        net(x)  # running statistics away from their initial 0 and 1
    data = TensorDataset(x, torch.randint(10, (300,)), torch.arange(300))
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    plain = model_outputs(net, DataLoader(data, batch_size=128))
    fast = model_outputs(net, DataLoader(data, batch_size=128), channels_last=True)
    torch.testing.assert_close(fast.embeddings, plain.embeddings, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fast.logits, plain.logits, rtol=1e-4, atol=1e-5)
    assert torch.equal(fast.indices, plain.indices)
    convs = [p for p in net.parameters() if p.dim() == 4]
    assert convs and all(p.is_contiguous() for p in convs)  # the layout it came with
    assert all(torch.equal(v, weights[k]) for k, v in net.state_dict().items())
    assert net.training  # and its mode


def test_model_outputs_rejects_repeated_indices() -> None:
    net, data = _net_and_data()
    x, y, idx = data.tensors
    doubled = TensorDataset(torch.cat([x, x[:2]]), torch.cat([y, y[:2]]), torch.cat([idx, idx[:2]]))
    with pytest.raises(ValueError, match="twice"):
        model_outputs(net, DataLoader(doubled, batch_size=8))
