"""GLISTER (Killamsetty et al., "GLISTER: Generalization based Data Subset Selection for
Efficient and Robust Learning", AAAI 2021, https://arxiv.org/abs/2012.10630).

Greedily pick the pool rows whose gradient step most increases the held-out log-likelihood,
with the first-order Taylor model of the last linear layer theta = (W, b):

    LL_val(theta - eta g_i) ~ LL_val(theta) + eta g_i . G_val,   G_val = d(sum_val CE)/d theta

so the gain of candidate i is g_i . G_val (both at the current theta). After each batch of
picks theta moves by -eta * sum of their gradients, and both the val gradient G_val and the
pool gradients g_i are recomputed at the new theta (logits = h @ W^T + b in closed form).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lipt.errors import UserError
from lipt.selection.common import check_budget, check_choice, finish, serial_loop
from lipt.selection.gradients import DEFAULT_CHUNK, LastLayerGradient, bias_gradients
from lipt.selection.types import Selection, SelectionInputs


def glister_pick_order(
    inputs: SelectionInputs,
    budget: int,
    *,
    generator: torch.Generator,
    eta: float = 0.1,
    greedy: str = "stochastic",
    epsilon: float = 0.01,
    batch: int | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> Tensor:
    """Pool rows in the order GLISTER's greedy picks them, [budget] int64.

    greedy="naive" evaluates every remaining row at each pick; "stochastic" (Mirzasoleiman et
    al., "Lazier Than Lazy Greedy", AAAI 2015, https://arxiv.org/abs/1409.7938) evaluates
    ceil(N / budget * ln(1 / epsilon)) remaining rows drawn at random (with replacement).
    `batch` rows are picked per Taylor update; None means max(1, budget // 100), i.e. about
    100 updates whatever the budget (batch=1 is the exact one-pick-per-update greedy).
    Without `inputs.val` the pool itself is the held-out target.
    """
    budget = check_budget(inputs, budget)
    check_choice("glister greedy", greedy, ("stochastic", "naive"))
    if inputs.classifier_weight is None:
        raise ValueError("GLISTER needs inputs.classifier_weight (and classifier_bias)")
    if not 0.0 < epsilon < 1.0:
        raise UserError(f"glister epsilon must be in (0, 1), got {epsilon}")
    batch = max(1, budget // 100) if batch is None else batch
    if batch < 1:
        raise UserError(f"glister batch must be >= 1, got {batch}")

    pool = inputs.pool
    val = inputs.val if inputs.val is not None else pool
    device = pool.embeddings.device
    H, y = pool.embeddings.float(), pool.targets  # [N, D], [N]
    Hv, yv = val.embeddings.float().to(device), val.targets.to(device)  # [Nv, D], [Nv]
    W = inputs.classifier_weight.detach().float().to(device).clone()  # [C, D]
    if W.shape != (pool.num_classes, H.shape[1]):
        raise ValueError(
            f"classifier_weight is {tuple(W.shape)}, the pool has {pool.num_classes} classes "
            f"and {H.shape[1]}-dim embeddings"
        )
    has_bias = inputs.classifier_bias is not None
    b = (
        inputs.classifier_bias.detach().float().to(device).clone()  # type: ignore[union-attr]
        if has_bias
        else W.new_zeros(W.shape[0])
    )  # [C]
    n = len(pool)
    sample_size = min(n, math.ceil(n / budget * math.log(1.0 / epsilon)))

    def val_gradient() -> LastLayerGradient:
        """G_val at the current (W, b): the summed val gradient, (sum e h^T [C, D], sum e [C])."""
        e_v = torch.cat(
            [
                bias_gradients(Hv[s : s + chunk_size] @ W.T + b, yv[s : s + chunk_size])
                for s in range(0, len(yv), chunk_size)
            ]
        )  # [Nv, C]
        weight = W.new_zeros(W.shape)  # [C, D]
        for s in range(0, len(yv), chunk_size):
            weight += e_v[s : s + chunk_size].T @ Hv[s : s + chunk_size]
        return LastLayerGradient(weight, e_v.sum(0) if has_bias else torch.zeros_like(b))

    def gains(h: Tensor, targets: Tensor, grad: LastLayerGradient) -> Tensor:
        """g_i . G_val for rows with embeddings h [n, D], at the current (W, b), [n]."""
        e = bias_gradients(h @ W.T + b, targets)  # [n, C] per-sample dL/db at theta
        assert grad.weight is not None
        return (e * (h @ grad.weight.T + grad.bias)).sum(1)  # e_i . (G_W h_i + G_b)

    available = torch.ones(n, dtype=torch.bool, device=device)
    order: list[int] = []
    with serial_loop(device):
        while len(order) < budget:
            grad = val_gradient()
            step = min(batch, budget - len(order))
            if greedy == "naive":
                all_gains = torch.cat(
                    [
                        gains(H[s : s + chunk_size], y[s : s + chunk_size], grad)
                        for s in range(0, n, chunk_size)
                    ]
                ).masked_fill(~available, -math.inf)  # [N]
                rows = torch.sort(all_gains, descending=True, stable=True).indices[:step]
                available[rows] = False
            else:
                remaining = torch.nonzero(available).flatten()  # [n_left]
                chosen = []
                for _ in range(step):
                    draw = torch.randint(len(remaining), (sample_size,), generator=generator)
                    cand = remaining[draw.to(device)]
                    cand = cand[available[cand]]  # drop rows already picked in this batch
                    if len(cand) == 0:
                        cand = torch.nonzero(available).flatten()
                    best = cand[torch.argmax(gains(H[cand], y[cand], grad))]
                    available[best] = False
                    chosen.append(best)
                rows = torch.stack(chosen)
            order += rows.tolist()

            # Taylor step on the last layer: theta <- theta - eta * sum_{i in batch} g_i(theta).
            e = bias_gradients(H[rows] @ W.T + b, y[rows])  # [step, C]
            W -= eta * (e.T @ H[rows])  # [C, D]
            if has_bias:
                b -= eta * e.sum(0)  # [C]
    return torch.tensor(order, dtype=torch.long)


def select_glister(
    inputs: SelectionInputs,
    budget: int,
    *,
    generator: torch.Generator,
    eta: float = 0.1,
    greedy: str = "stochastic",
    epsilon: float = 0.01,
    batch: int | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> Selection:
    """GLISTER-ONLINE's greedy subset (see `glister_pick_order`), weights 1.

    Needs `inputs.classifier_weight` / `classifier_bias` (the last layer that produced the
    pool logits); uses `inputs.val` as the held-out split, else the pool itself.
    """
    order = glister_pick_order(
        inputs,
        budget,
        generator=generator,
        eta=eta,
        greedy=greedy,
        epsilon=epsilon,
        batch=batch,
        chunk_size=chunk_size,
    )
    return finish(order, None, budget)
