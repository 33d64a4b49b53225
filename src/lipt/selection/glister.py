"""GLISTER (Killamsetty et al., "GLISTER: Generalization based Data Subset Selection for
Efficient and Robust Learning", AAAI 2021, https://arxiv.org/abs/2012.10630).

Greedily pick the pool rows whose gradient step most increases the held-out log-likelihood,
with the first-order Taylor model of the last linear layer theta = (W, b):

    LL_val(theta - eta g_i) ~ LL_val(theta) + eta g_i . G_val,   G_val = d(sum_val CE)/d theta

so the gain of candidate i is g_i . G_val. As in DeepCore, the base of the authors' code
(https://github.com/PatrickZH/DeepCore, deepcore/methods/glister.py, `update_val_gradients`),
the pool gradients g_i are taken once at the pre-trained theta_0, and after each batch of picks
the virtual model the held-out gradient is recomputed at is (`step="mean"`, the default)

    theta_S = theta_0 - eta * mean_{j in S} g_j(theta_0)      (logits = h @ W^T + b, closed form)

i.e. one step of size eta along the MEAN gradient of the picks so far (DeepCore itself never
applies it: its `select` passes `upadate_state=`, a misspelt keyword the greedy ignores, so its
GLISTER ranks by the gains at theta_0 alone). A summed step (eta times the sum, as CORDS'
`_update_grads_val` takes it, or `step="sgd"`: one SGD step of eta per batch of picks,
theta <- theta - eta * mean_{j in batch} g_j(theta_0), as training on them would) moves it by
tens to hundreds of learning-rate steps: with 128-dim ReLU features and eta 0.1 the held-out
errors of a class fall to ~1e-7 within a few updates, and every later pick is decided by
rounding, close to a random draw among the stochastic greedy's candidates.

The gain is linear in the embedding h_i, so the greedy favours rows with large ||h||: on the
jigsaw soup of Fashion-MNIST the picks sit at the 86th percentile of their class's embedding
norms and leave the embedding space 4.5x further from the nearest pick than a random subset
does (`stages.select.profile`; docs/results/quality/glister.md). That, not the step, is why
GLISTER's subset trains to about 19 points below a random one there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import Tensor

from lipt.core.bounds import COUNT, OPEN_UNIT, POSITIVE
from lipt.core.errors import UserError
from lipt.selection.common import check_budget, check_choice, finish, serial_loop
from lipt.selection.gradients import DEFAULT_CHUNK, LastLayerGradient, bias_gradients
from lipt.selection.types import Selection, SelectionInputs


@dataclass(frozen=True)
class GlisterRun:
    """What GLISTER's greedy did: the picks and the state of the held-out target per update."""

    order: Tensor  # [budget] int64, pool rows in the order they were picked
    gains: Tensor  # [budget] float32, each pick's gain g_i . G_val when it was picked
    val_gradient_norms: Tensor  # [updates] ||G_val|| before each Taylor update
    val_class_errors: Tensor  # [updates, C] mean ||softmax - onehot|| of each class's val rows


def glister_pick_order(
    inputs: SelectionInputs, budget: int, *, generator: torch.Generator, **hyper: Any
) -> Tensor:
    """Pool rows in the order GLISTER's greedy picks them, [budget] int64 (`glister_greedy`'s
    order; `hyper` are its keyword arguments)."""
    return glister_greedy(inputs, budget, generator=generator, **hyper).order


def _checked_budget_and_batch(
    inputs: SelectionInputs,
    budget: int,
    *,
    eta: float,
    greedy: str,
    epsilon: float,
    batch: int | None,
    step: str,
) -> tuple[int, int]:
    """GLISTER's arguments checked: the budget, and the picks per Taylor update (None:
    max(1, budget // 100))."""
    budget = check_budget(inputs, budget)
    check_choice("glister greedy", greedy, ("stochastic", "naive"))
    check_choice("glister step", step, ("mean", "sgd"))
    if not eta > 0.0:
        raise UserError(f"glister eta must be > 0 (the virtual model's step size), got {eta}")
    if inputs.classifier_weight is None:
        raise ValueError("GLISTER needs inputs.classifier_weight (and classifier_bias)")
    if not 0.0 < epsilon < 1.0:
        raise UserError(f"glister epsilon must be in (0, 1), got {epsilon}")
    batch = max(1, budget // 100) if batch is None else batch
    if batch < 1:
        raise UserError(f"glister batch must be >= 1, got {batch}")
    return budget, batch


def _initial_layer(inputs: SelectionInputs, device: torch.device) -> tuple[Tensor, Tensor]:
    """theta_0, the last layer that gave the pool logits, as float32 copies on `device`:
    W [C, D] and b [C] (zeros for a layer without a bias)."""
    pool = inputs.pool
    assert inputs.classifier_weight is not None  # _checked_budget_and_batch raises otherwise
    W = inputs.classifier_weight.detach().float().to(device).clone()  # [C, D]
    if W.shape != (pool.num_classes, pool.embeddings.shape[1]):
        raise ValueError(
            f"classifier_weight is {tuple(W.shape)}, the pool has {pool.num_classes} classes "
            f"and {pool.embeddings.shape[1]}-dim embeddings"
        )
    if inputs.classifier_bias is None:
        return W, W.new_zeros(W.shape[0])  # [C]
    return W, inputs.classifier_bias.detach().float().to(device).clone()  # [C]


def _errors_at(
    embeddings: Tensor, targets: Tensor, weight: Tensor, bias: Tensor, chunk_size: int
) -> Tensor:
    """dL/db rows e [N, C] of rows (embeddings [N, D], targets [N]) under the last layer
    (weight [C, D], bias [C]), computed in row chunks."""
    return torch.cat(
        [
            bias_gradients(
                embeddings[s : s + chunk_size] @ weight.T + bias, targets[s : s + chunk_size]
            )
            for s in range(0, len(targets), chunk_size)
        ]
    )  # [N, C]


def _val_gradient(
    val_embeddings: Tensor,
    val_targets: Tensor,
    weight: Tensor,
    bias: Tensor,
    has_bias: bool,
    chunk_size: int,
) -> tuple[LastLayerGradient, Tensor]:
    """G_val at the virtual model (weight [C, D], bias [C]): the summed gradient of the val
    rows (embeddings [Nv, D], targets [Nv]), (sum e h^T [C, D], sum e [C]), and their per-sample
    errors e [Nv, C]."""
    e_v = _errors_at(val_embeddings, val_targets, weight, bias, chunk_size)  # [Nv, C]
    sum_weight = weight.new_zeros(weight.shape)  # [C, D]
    for s in range(0, len(val_targets), chunk_size):
        sum_weight += e_v[s : s + chunk_size].T @ val_embeddings[s : s + chunk_size]
    sum_bias = e_v.sum(0) if has_bias else torch.zeros_like(bias)  # [C]
    return LastLayerGradient(sum_weight, sum_bias), e_v


def _val_class_errors(val_errors: Tensor, val_targets: Tensor, val_counts: Tensor) -> Tensor:
    """Mean ||softmax - onehot|| of each class's val rows, [C] (`val_errors` [Nv, C],
    `val_targets` [Nv], `val_counts` [C] each >= 1)."""
    per_row = val_errors.norm(dim=1)  # [Nv]
    return torch.zeros_like(val_counts).index_add_(0, val_targets, per_row) / val_counts  # [C]


def _gains(errors: Tensor, embeddings: Tensor, rows: Tensor, grad: LastLayerGradient) -> Tensor:
    """g_i(theta_0) . G_val for pool rows `rows` [n], [n] (`errors` [N, C]: the pool's dL/db
    rows e at theta_0, `embeddings` [N, D]: its rows h)."""
    assert grad.weight is not None
    # e_i . (G_W h_i + G_b)
    return (errors[rows] * (embeddings[rows] @ grad.weight.T + grad.bias)).sum(1)  # [n]


def _naive_picks(
    errors: Tensor,
    embeddings: Tensor,
    grad: LastLayerGradient,
    available: Tensor,
    take: int,
    chunk_size: int,
) -> tuple[Tensor, Tensor]:
    """The naive greedy's `take` picks: the available rows of highest gain, every row
    evaluated. Their rows [take] and gains [take]; marks them taken in `available` [N] bool."""
    n = len(available)
    all_gains = torch.cat(
        [
            _gains(errors, embeddings, torch.arange(s, min(s + chunk_size, n)), grad)
            for s in range(0, n, chunk_size)
        ]
    ).masked_fill(~available, -math.inf)  # [N]
    rows = torch.sort(all_gains, descending=True, stable=True).indices[:take]
    available[rows] = False
    return rows, all_gains[rows]


def _stochastic_picks(
    errors: Tensor,
    embeddings: Tensor,
    grad: LastLayerGradient,
    available: Tensor,
    take: int,
    sample_size: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """The stochastic greedy's `take` picks, one at a time: the highest gain among
    `sample_size` draws from `generator` (with replacement) of the rows available when the
    batch began, less those picked since. Their rows [take] and gains [take]; marks them taken
    in `available` [N] bool."""
    remaining = torch.nonzero(available).flatten()  # [n_left]
    chosen: list[Tensor] = []
    chosen_gains: list[Tensor] = []
    for _ in range(take):
        draw = torch.randint(len(remaining), (sample_size,), generator=generator)
        cand = remaining[draw.to(available.device)]
        cand = cand[available[cand]]  # drop rows already picked in this batch
        if len(cand) == 0:
            cand = torch.nonzero(available).flatten()
        cand_gains = _gains(errors, embeddings, cand, grad)
        top = torch.argmax(cand_gains)
        best = cand[top]
        available[best] = False
        chosen.append(best)
        chosen_gains.append(cand_gains[top : top + 1])
    return torch.stack(chosen), torch.cat(chosen_gains)


def _summed_gradient(errors: Tensor, embeddings: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """sum_j g_j(theta_0) over pool rows `rows`: (sum e h^T [C, D], sum e [C])."""
    return errors[rows].T @ embeddings[rows], errors[rows].sum(0)


def _moved_layer(
    weight: Tensor,
    bias: Tensor,
    scale: float,
    step_weight: Tensor,
    step_bias: Tensor,
    has_bias: bool,
) -> tuple[Tensor, Tensor]:
    """The virtual model (weight, bias) - scale * (step_weight, step_bias), [C, D] and [C];
    the bias as it is (zeros) for a layer without one."""
    moved_weight = weight - scale * step_weight  # [C, D]
    moved_bias = bias - scale * step_bias if has_bias else bias  # [C]
    return moved_weight, moved_bias


def glister_greedy(
    inputs: SelectionInputs,
    budget: int,
    *,
    generator: torch.Generator,
    eta: Annotated[float, POSITIVE] = 0.1,
    greedy: Literal["stochastic", "naive"] = "stochastic",
    epsilon: Annotated[float, OPEN_UNIT] = 0.01,
    batch: Annotated[int, COUNT] | None = None,
    step: Literal["mean", "sgd"] = "mean",
    chunk_size: Annotated[int, COUNT] = DEFAULT_CHUNK,
) -> GlisterRun:
    """GLISTER's greedy picks, with the held-out target's state at every Taylor update.

    greedy="naive" evaluates every remaining row at each pick; "stochastic" (Mirzasoleiman et
    al., "Lazier Than Lazy Greedy", AAAI 2015, https://arxiv.org/abs/1409.7938) evaluates
    ceil(N / budget * ln(1 / epsilon)) remaining rows drawn at random (with replacement).
    `batch` rows are picked per update of the virtual model; None means max(1, budget // 100),
    i.e. about 100 updates whatever the budget (batch=1: an update after every pick); `step`
    ("mean" or "sgd", see the module docstring) is how the virtual model moves after each.
    Without `inputs.val` the pool itself is the held-out target.
    """
    budget, batch = _checked_budget_and_batch(
        inputs, budget, eta=eta, greedy=greedy, epsilon=epsilon, batch=batch, step=step
    )
    pool = inputs.pool
    val = inputs.val if inputs.val is not None else pool
    device = pool.embeddings.device
    H, y = pool.embeddings.float(), pool.targets  # [N, D], [N]
    Hv, yv = val.embeddings.float().to(device), val.targets.to(device)  # [Nv, D], [Nv]
    W, b = _initial_layer(inputs, device)  # [C, D], [C]
    has_bias = inputs.classifier_bias is not None
    n = len(pool)
    sample_size = min(n, math.ceil(n / budget * math.log(1.0 / epsilon)))

    W0, b0 = W.clone(), b.clone()
    # Pool gradients at theta_0 (fixed, as DeepCore's train_grads): dL/db rows e [N, C].
    E = _errors_at(H, y, W0, b0, chunk_size)  # [N, C]

    available = torch.ones(n, dtype=torch.bool, device=device)
    order: list[int] = []
    picked_gains: list[Tensor] = []
    norms: list[Tensor] = []
    class_errors: list[Tensor] = []
    val_counts = torch.bincount(yv, minlength=W.shape[0]).clamp_min(1).float()  # [C]
    sum_weight, sum_bias = torch.zeros_like(W0), torch.zeros_like(b0)  # sum_S g_j(theta_0)
    with serial_loop(device):
        while len(order) < budget:
            grad, e_v = _val_gradient(Hv, yv, W, b, has_bias, chunk_size)
            norms.append(grad.sq_norm().sqrt())
            class_errors.append(_val_class_errors(e_v, yv, val_counts))  # [C]
            take = min(batch, budget - len(order))
            if greedy == "naive":
                rows, gains = _naive_picks(E, H, grad, available, take, chunk_size)
            else:
                rows, gains = _stochastic_picks(E, H, grad, available, take, sample_size, generator)
            picked_gains.append(gains)
            order += rows.tolist()

            batch_weight, batch_bias = _summed_gradient(E, H, rows)  # [C, D], [C]
            if step == "mean":  # theta_S = theta_0 - eta * mean_{j in S} g_j(theta_0)
                sum_weight += batch_weight
                sum_bias += batch_bias
                W, b = _moved_layer(W0, b0, eta / len(order), sum_weight, sum_bias, has_bias)
            else:  # theta <- theta - eta * mean_{j in batch} g_j(theta_0)
                W, b = _moved_layer(W, b, eta / len(rows), batch_weight, batch_bias, has_bias)
    return GlisterRun(
        order=torch.tensor(order, dtype=torch.long),
        gains=torch.cat(picked_gains).float().cpu(),
        val_gradient_norms=torch.stack(norms).float().cpu(),
        val_class_errors=torch.stack(class_errors).float().cpu(),
    )


def select_glister(
    inputs: SelectionInputs,
    budget: int,
    *,
    generator: torch.Generator,
    eta: Annotated[float, POSITIVE] = 0.1,
    greedy: Literal["stochastic", "naive"] = "stochastic",
    epsilon: Annotated[float, OPEN_UNIT] = 0.01,
    batch: Annotated[int, COUNT] | None = None,
    step: Literal["mean", "sgd"] = "mean",
    chunk_size: Annotated[int, COUNT] = DEFAULT_CHUNK,
) -> Selection:
    """GLISTER-ONLINE's greedy subset (see `glister_pick_order`), weights 1.

    Needs `inputs.classifier_weight` / `classifier_bias` (the last layer that produced the
    pool logits); uses `inputs.val` as the held-out split, else the pool itself (counted as
    `diagnostics["pool_as_target"]`).
    """
    order = glister_pick_order(
        inputs,
        budget,
        generator=generator,
        eta=eta,
        greedy=greedy,
        epsilon=epsilon,
        batch=batch,
        step=step,
        chunk_size=chunk_size,
    )
    return finish(order, None, budget, {"pool_as_target": int(inputs.val is None)})
