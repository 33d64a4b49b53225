"""Closed-form per-sample gradients of the cross-entropy loss w.r.t. the last linear layer.

For logits z = W h + b (W: [C, D], b: [C]) and per-sample loss L = CE(z, y):

    dL/db = e = softmax(z) - onehot(y)          # [C]
    dL/dW = outer(e, h)                         # [C, D]

so gradients never need a per-sample autograd loop, and their inner products factorise:

    g_i . g_j = (e_i . e_j) * (h_i . h_j + 1)   # weight + bias
    g_i . G   = e_i . (G_W h_i + G_b)           # G = (G_W, G_b), e.g. a summed gradient

A final layer without a bias (z = W h) has the weight part alone: g_i . g_j = (e_i . e_j) *
(h_i . h_j), and a summed gradient's G_b is zero; the helpers' `bias=False` says so.

The helpers below use these identities so that no [N, C*D] matrix is ever built; the work is
done in row chunks of `chunk_size` so temporaries stay bounded for million-row pools.
`model_outputs` runs a model over a loader to produce the logits and embeddings they need.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from lipt.selection.types import PoolOutputs

DEFAULT_CHUNK = 65536  # rows per chunk: 65536 x 512 float32 temporaries are 128 MiB


def bias_gradients(logits: Tensor, targets: Tensor) -> Tensor:
    """Per-sample dL/db = softmax(logits) - onehot(targets), [N, C] float32."""
    z = logits.float() - logits.float().max(dim=1, keepdim=True).values  # [N, C], max 0
    # Probabilities below e^-40 (~4e-18) are kept at that floor: it changes nothing that float32
    # can resolve and keeps a saturated pre-trained model (logit gaps past ~87) out of denormal
    # floats, 10-100x slower on CPUs. GLISTER's virtual model no longer needs it (its step is
    # bounded: tests/test_selection_defaults_scale.py passes without the floor); a cheap guard.
    e = torch.softmax(z.clamp_min_(-40.0), dim=1)  # [N, C]
    e[torch.arange(e.shape[0], device=e.device), targets] -= 1.0
    return e


def last_layer_gradients(
    logits: Tensor, targets: Tensor, embeddings: Tensor | None = None
) -> Tensor:
    """Per-sample gradients of the (un-averaged) cross-entropy w.r.t. the final linear layer.

    Without `embeddings`: the bias gradient [N, C]. With `embeddings` [N, D]: rows
    `[vec(dL/dW) (row-major, W is [C, D]), dL/db]`, [N, C*D + C], the order of
    `torch.nn.Linear`'s (weight, bias) parameters. This materialises [N, C*D]; selectors use
    the structured helpers below instead, it is here for small inputs and for tests.
    """
    e = bias_gradients(logits, targets)  # [N, C]
    if embeddings is None:
        return e
    h = embeddings.float()  # [N, D]
    weight = e[:, :, None] * h[:, None, :]  # [N, C, D]
    return torch.cat([weight.flatten(1), e], dim=1)  # [N, C*D + C]


@dataclass(frozen=True)
class LastLayerGradient:
    """One last-layer gradient (e.g. a sum over samples): weight part [C, D] (None when only the
    bias part is used) and bias part [C] (zeros for a layer without a bias)."""

    weight: Tensor | None  # [C, D]
    bias: Tensor  # [C]

    def sq_norm(self) -> Tensor:
        sq = (self.bias.double() ** 2).sum()
        if self.weight is not None:
            sq = sq + (self.weight.double() ** 2).sum()
        return sq

    def scaled(self, factor: float) -> LastLayerGradient:
        weight = None if self.weight is None else self.weight * factor
        return LastLayerGradient(weight, self.bias * factor)


def gradient_sum(
    errors: Tensor,
    embeddings: Tensor | None = None,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    bias: bool = True,
) -> LastLayerGradient:
    """Sum over rows of the per-sample gradients: (sum_i e_i h_i^T, sum_i e_i); the bias part
    zeros for the weight of a layer without a bias (`bias=False`, with `embeddings`)."""
    bias_part = errors.sum(0)  # [C]
    if embeddings is None:
        return LastLayerGradient(None, bias_part)
    weight = errors.new_zeros(errors.shape[1], embeddings.shape[1])  # [C, D]
    for s in range(0, errors.shape[0], chunk_size):
        weight += errors[s : s + chunk_size].T @ embeddings[s : s + chunk_size].to(errors.dtype)
    return LastLayerGradient(weight, bias_part if bias else torch.zeros_like(bias_part))


def gradient_sq_norms(
    errors: Tensor,
    embeddings: Tensor | None = None,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    bias: bool = True,
) -> Tensor:
    """||g_i||^2 per row, [N]: |e_i|^2 (bias only) or |e_i|^2 (|h_i|^2 + 1) (weight + bias);
    |e_i|^2 |h_i|^2 for the weight of a layer without a bias (`bias=False`)."""
    sq = (errors**2).sum(1)  # [N]
    if embeddings is None:
        return sq
    h_sq = torch.cat(
        [
            (embeddings[s : s + chunk_size].to(errors.dtype) ** 2).sum(1)
            for s in range(0, embeddings.shape[0], chunk_size)
        ]
    )  # [N]
    return sq * (h_sq + 1.0) if bias else sq * h_sq


def gradient_dots(
    errors: Tensor,
    grad: LastLayerGradient,
    embeddings: Tensor | None = None,
    *,
    chunk_size: int = DEFAULT_CHUNK,
) -> Tensor:
    """g_i . G per row, [N]: e_i . G_b, plus e_i . (G_W h_i) when weights are included."""
    dots = errors @ grad.bias  # [N]
    if embeddings is None or grad.weight is None:
        assert embeddings is None and grad.weight is None, "mixed bias-only and full gradients"
        return dots
    parts = []
    for s in range(0, errors.shape[0], chunk_size):
        h = embeddings[s : s + chunk_size].to(errors.dtype)  # [chunk, D]
        parts.append((errors[s : s + chunk_size] * (h @ grad.weight.T)).sum(1))  # e_i . G_W h_i
    return dots + torch.cat(parts)


def gradient_gram(
    errors_a: Tensor,
    errors_b: Tensor,
    embeddings_a: Tensor | None = None,
    embeddings_b: Tensor | None = None,
    *,
    bias: bool = True,
) -> Tensor:
    """Inner products g_i . g_j, [Na, Nb]: (E_a E_b^T) (* (H_a H_b^T + 1) with weights, or
    * (H_a H_b^T) for the weight of a layer without a bias, `bias=False`).

    The caller bounds Na x Nb (partitions, single columns); nothing of size C*D is formed.
    """
    gram = errors_a @ errors_b.T  # [Na, Nb]
    if embeddings_a is None or embeddings_b is None:
        assert embeddings_a is None and embeddings_b is None, "mixed bias-only and full gradients"
        return gram
    dots = embeddings_a.to(gram.dtype) @ embeddings_b.to(gram.dtype).T  # [Na, Nb] h_i . h_j
    return gram * (dots + 1.0) if bias else gram * dots


def _restore_modes(model: nn.Module, modes: dict[nn.Module, bool]) -> None:
    for module in model.modules():
        module.training = modes[module]


def resolve_head(model: nn.Module, head: nn.Linear | str | None = None) -> nn.Linear:
    """The final linear layer whose input is the embedding and whose output the logits:
    `head` itself, the submodule of that name, else `model.classifier` (lipt's models) or the
    last `nn.Linear` registered in `model`.

    Raises:
        ValueError: the named submodule is missing or not an `nn.Linear`, or there is none.
    """
    if isinstance(head, nn.Linear):
        return head
    if isinstance(head, str):
        try:
            found = model.get_submodule(head)
        except AttributeError as e:
            raise ValueError(
                f"the model has no submodule {head!r}: name its final nn.Linear"
            ) from e
        if not isinstance(found, nn.Linear):
            raise ValueError(
                f"{head!r} is a {type(found).__name__}, not an nn.Linear: name the final linear "
                "layer (its input is the embedding, its output the logits)"
            )
        return found
    if head is not None:
        raise ValueError(f"head must be an nn.Linear, its name or None, not {type(head).__name__}")
    classifier = getattr(model, "classifier", None)
    if isinstance(classifier, nn.Linear):
        return classifier
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(
            f"{type(model).__name__} has no nn.Linear: lipt ranks data by the final linear "
            "layer's gradients; pass head= the layer that gives the logits"
        )
    return linears[-1]


def _default_device(model: nn.Module) -> torch.device:
    """Where `model`'s first parameter is; the CPU for a model without parameters."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


@contextlib.contextmanager
def _embeddings_and_logits(
    model: nn.Module, head: nn.Linear | str | None
) -> Iterator[Callable[[Tensor], tuple[Tensor, Tensor]]]:
    """`model`'s pass x -> (embeddings [B, D], logits [B, C]) while the context is open: a
    model of the lipt protocol (head None) as `classifier(embed(x))`, any other by its own
    forward and a hook on its final linear layer, removed on exit."""
    lipt_protocol = head is None and callable(getattr(model, "embed", None))
    lipt_protocol = lipt_protocol and isinstance(getattr(model, "classifier", None), nn.Module)
    if lipt_protocol:
        embed = cast(Callable[[Tensor], Tensor], model.embed)
        classifier = cast(nn.Module, model.classifier)

        def embed_and_classify(x: Tensor) -> tuple[Tensor, Tensor]:
            h = embed(x)  # [B, D]
            return h, classifier(h)  # [B, C]

        yield embed_and_classify
        return
    linear = resolve_head(model, head)
    seen: list[tuple[Tensor, Tensor]] = []  # the head's (input, output) in one forward

    def read_head(x: Tensor) -> tuple[Tensor, Tensor]:
        seen.clear()
        model(x)
        if len(seen) != 1:
            raise ValueError(
                f"the head {type(linear).__name__} ran {len(seen)} times in one forward; "
                "name the final nn.Linear that gives the logits with head="
            )
        return seen[0]

    hook = linear.register_forward_hook(lambda _m, inputs, output: seen.append((inputs[0], output)))
    try:
        yield read_head
    finally:
        hook.remove()


@contextlib.contextmanager
def _evaluating(model: nn.Module, channels_last: bool) -> Iterator[None]:
    """`model` in eval mode (and its convolution weights channels-last if asked) while the
    context is open; every submodule's train/eval flag and the weights' layout restored on
    exit."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    restore_layout = channels_last and all(
        p.is_contiguous() for p in model.parameters() if p.dim() == 4
    )
    if channels_last:
        model.to(memory_format=torch.channels_last)
    try:
        yield
    finally:
        if restore_layout:
            model.to(memory_format=torch.contiguous_format)
        _restore_modes(model, modes)


def index_order(idx: Tensor) -> tuple[Tensor, Tensor]:
    """The order that sorts a pool loader's dataset indices `idx` [N] (loader order ->
    ascending dataset position), and the sorted indices.

    Raises:
        ValueError: an index that comes twice (a row must not be selected twice, nor the pool
            look larger than it is).
    """
    order = torch.argsort(idx)
    idx_sorted = idx[order]
    repeated = idx_sorted[1:][idx_sorted[1:] == idx_sorted[:-1]]
    if len(repeated) > 0:
        first = int(repeated[0])
        count = int((idx == first).sum())
        kinds = len(torch.unique(repeated))
        raise ValueError(
            f"the pool loader yielded dataset index {first} "
            + ("twice" if count == 2 else f"{count} times")
            + ("" if kinds == 1 else f" ({kinds} indices repeat)")
            + "; selection needs each pool index exactly once: use a loader without a sampler "
            "that repeats (no RandomSampler(replacement=True), no DistributedSampler padding the "
            "last batch), e.g. a plain DataLoader over the pool"
        )
    return order, idx_sorted


def _in_index_order(
    logits: list[Tensor], embeddings: list[Tensor], targets: list[Tensor], indices: list[Tensor]
) -> PoolOutputs:
    """The batches' outputs concatenated, rows sorted by dataset index.

    Raises:
        ValueError: no batch, or an index that comes twice.
    """
    if not indices:
        raise ValueError("model_outputs got an empty loader")
    order, idx_sorted = index_order(torch.cat(indices))
    return PoolOutputs(
        logits=torch.cat(logits)[order],
        embeddings=torch.cat(embeddings)[order],
        targets=torch.cat(targets)[order],
        indices=idx_sorted,
    )


def model_outputs(
    model: nn.Module,
    loader: Iterable[Any],
    device: torch.device | str | None = None,
    head: nn.Linear | str | None = None,
    channels_last: bool = False,
) -> PoolOutputs:
    """Logits and penultimate embeddings of `model` on every batch of `loader`.

    A model of the lipt protocol (`model.embed(x) -> [B, D]`, `model.classifier` the final
    `nn.Linear`) runs as `classifier(embed(x))` when `head` is None; any other model runs its
    own forward, and a forward hook on its final linear layer (`resolve_head(model, head)`)
    reads the embeddings (its input) and the logits (its output), so a model whose forward
    returns more than logits works too. `loader` yields `(x, y, idx)` batches, idx being
    dataset positions, in any order. Runs in eval mode under `torch.no_grad()` and restores
    every submodule's previous train/eval flag. Rows of the result are sorted by idx (a
    shuffled loader must not map scores to the wrong samples); tensors are float32/int64 on the
    CPU.

    `channels_last`: image batches [B, C, H, W] and the model's convolution weights in the
    channels-last layout for the pass (the weights' layout is restored after): the same values,
    computed by other kernels, so the outputs differ from the default's in the last bits; a
    convnet's pass over the pool ran 1.9x faster on one CPU core.

    Raises:
        ValueError: no final linear layer, one that runs other than once per forward, or a
            loader that is empty or repeats an index.
    """
    device = _default_device(model) if device is None else torch.device(device)
    logits, embeddings, targets, indices = [], [], [], []
    copies = _HostCopies()
    with (
        _embeddings_and_logits(model, head) as forward,
        _evaluating(model, channels_last),
        torch.no_grad(),
    ):
        for batch in loader:
            x, y, idx = batch[0], batch[1], batch[2]
            if getattr(x, "device", None) != device:  # one there already (resident) stays
                x = x.to(device, non_blocking=device.type == "cuda")
            if channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            h, z = forward(x)
            embeddings.append(copies.of(h.float()))
            logits.append(copies.of(z.float()))
            targets.append(copies.of(torch.as_tensor(y).long()))
            indices.append(copies.of(torch.as_tensor(idx).long()))
    copies.wait()
    return _in_index_order(logits, embeddings, targets, indices)


class _HostCopies:
    """Copies of a pass's outputs to the host that do not wait for the device: a blocking
    copy from a GPU waits for every kernel queued before it, once per batch, where the pass
    could have queued the next batch's; a non-blocking one (into pinned memory) is queued
    behind them. `wait` before reading any: it waits once for all of them."""

    def __init__(self) -> None:
        self.devices: set[torch.device] = set()

    def of(self, t: Tensor) -> Tensor:
        if t.device.type == "cpu":
            return t
        if t.device.type != "cuda":
            return t.cpu()
        self.devices.add(t.device)
        return t.to("cpu", non_blocking=True)

    def wait(self) -> None:
        for device in self.devices:
            torch.cuda.synchronize(device)


def errors_of(pool: PoolOutputs) -> Tensor:
    """Bias gradients e = softmax - onehot of a pool, [N, C]."""
    return bias_gradients(pool.logits, pool.targets)
