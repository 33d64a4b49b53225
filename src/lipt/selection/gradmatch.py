"""GradMatch (Killamsetty et al., "GRAD-MATCH: Gradient Matching based Data Subset Selection for
Efficient Deep Model Training", ICML 2021, https://arxiv.org/abs/2103.00123).

Orthogonal matching pursuit with non-negative weights and an L2 term:

    min_{w >= 0, |supp w| <= k}  || sum_i w_i g_i - T ||^2 + lam ||w||^2

where g_i are last-layer gradients of pool rows and T is the summed gradient of the target
(the pool, or the held-out split). Everything is done on inner products (see
`lipt.selection.gradients`): OMP needs the correlations g_i . r of every row with the residual
r = T - sum_S w_j g_j, i.e. c_i - sum_S w_j K_ij with c_i = g_i . T and K_ij = g_i . g_j, so
only the K columns of picked atoms are formed, never an [N, C*D] gradient matrix or an N x N
Gram matrix. The pool is split into random partitions of at most `partition_size` rows with
the budget spread proportionally, as GradMatch's per-batch/per-class variants do, to bound time.

`granularity="batch"` is the paper's per-batch variant (GradMatchPB, CORDS' default): the pool
is cut into random mini-batches of `batch_size` rows, each atom is a mini-batch's MEAN gradient
(an explicit [C*D + C] vector: there are only N / batch_size of them), OMP picks about
budget / batch_size batches, and every row of a picked batch gets its batch's weight.

For a final layer without a bias (`SelectionInputs.head_has_bias` False) the gradients are the
weight's alone: atoms, targets and Gram matrices leave out the bias part the model does not have.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from torch import Tensor

from lipt.core.bounds import COUNT, NON_NEGATIVE
from lipt.core.errors import UserError
from lipt.selection.common import (
    check_budget,
    check_choice,
    finish,
    random_partitions,
    randperm,
    serial_loop,
    split_budget,
)
from lipt.selection.gradients import (
    DEFAULT_CHUNK,
    LastLayerGradient,
    errors_of,
    gradient_dots,
    gradient_gram,
    gradient_sum,
)
from lipt.selection.types import Selection, SelectionInputs


def nnls_from(quad: Tensor, c: Tensor, x: Tensor) -> Tensor:
    """argmin_{x >= 0} x^T quad x - 2 c^T x from a feasible start `x` >= 0 (quad positive
    definite, [m, m]): the inner loop of Lawson-Hanson. The passive set starts as all m
    coordinates, those at 0 in `x` included (OMP's new atom, which enters at weight 0). Solve on
    the passive set; if some coordinate would turn non-positive, move from x towards the
    solution until the first one hits zero, drop the coordinates that reached zero on their way
    down and solve again. A coordinate already at 0 whose optimum is <= 0 blocks at once: a
    step of 0 (not 0/0) that drops it, while one at 0 whose optimum is positive stays in.
    Coordinates, once dropped, stay out. Returns x [m] (zeros for dropped coordinates).

    Raises:
        ValueError: shapes that disagree, or a start that is not finite and >= 0.
    """
    m = x.shape[0] if x.ndim == 1 else -1
    if m < 0 or quad.shape != (m, m) or c.shape != (m,):
        raise ValueError(
            f"nnls_from needs quad [m, m], c [m] and x [m], got {tuple(quad.shape)}, "
            f"{tuple(c.shape)} and {tuple(x.shape)}"
        )
    if not (bool((x >= 0).all()) and bool(x.isfinite().all())):
        raise ValueError("nnls_from needs a feasible start: x finite and >= 0")
    passive = torch.ones(m, dtype=torch.bool, device=x.device)
    for _ in range(m):
        p = torch.nonzero(passive).flatten()
        z = torch.zeros_like(x)
        z[p] = torch.linalg.solve(quad[p][:, p], c[p])  # unconstrained optimum on the passive set
        if bool((z[p] > 0).all()):
            return z
        neg = p[z[p] <= 0]
        x_neg = x[neg]
        # Step fraction at which each reaches zero, in [0, 1]; 0 for one already at zero, where
        # x / (x - z) would be 0 / 0 when its optimum is exactly 0 too.
        ratios = torch.where(x_neg > 0, x_neg / (x_neg - z[neg]), 0.0)
        assert not bool(ratios.isnan().any()), "NNLS step fraction is NaN"
        first = torch.argmin(ratios)
        x = (x + ratios[first] * (z - x)).clamp_min(0.0)
        x[neg[first]] = 0.0  # exactly, whatever the rounding
        # Out go those on their way down that are now at 0 (neg[first] at least, so the set
        # shrinks); one at 0 on its way up stays (after a step of 0 it has not moved yet).
        # Coordinates outside the passive set stay 0 (x and z are 0 there).
        passive = passive & ((x > 0) | (z > 0))
        if not bool(passive.any()):
            return x
    return x


def omp_nonneg(
    errors: Tensor,
    embeddings: Tensor | None,
    target: LastLayerGradient,
    k: int,
    *,
    lam: float,
    eps: float,
    bias: bool = True,
) -> tuple[Tensor, Tensor]:
    """Non-negative OMP of `target` by at most k of the rows' gradients (in float64).

    errors [P, C] and embeddings [P, D] (None: bias-only gradients) describe the rows' last-layer
    gradients, the weight's alone with `bias=False` (a layer without a bias; `target`'s bias
    part is then zero). Stops early when the residual is below eps * ||target|| or no unpicked row
    correlates positively with it. A row is picked at most once (also when NNLS later sets
    its weight to zero, then it leaves the support for good; so does a row whose gradient is
    numerically a combination of the support's).
    The normal matrix K_SS + lam I of the support is kept as a Cholesky factor L, extended by
    one row per pick (O(m^2)); it is refactored only when NNLS drops atoms (rare).
    Returns (rows [m], weights [m] > 0) with m <= k.
    """
    P = errors.shape[0]
    c = gradient_dots(errors, target, embeddings)  # [P] g_i . T
    t_sq = target.sq_norm()
    rows_k = errors.new_zeros(k, P)  # [k, P] rows K[j, :] = g_j . g_i of the support's atoms
    L = errors.new_zeros(k, k)  # lower Cholesky factor of K_SS + lam I (leading [m, m] block)
    support = torch.zeros(0, dtype=torch.long, device=errors.device)  # [m] rows
    w = errors.new_zeros(0)  # [m]
    available = torch.ones(P, dtype=torch.bool, device=errors.device)
    while len(support) < k:
        m = len(support)
        fit = w @ rows_k[:m]  # [P] g_i . sum_S w_j g_j
        res_sq = t_sq - 2 * (c[support] @ w) + w @ fit[support]  # ||T - sum_S w_j g_j||^2
        if res_sq <= (eps**2) * t_sq:
            break
        corr = (c - fit).masked_fill(~available, -torch.inf)  # [P] g_i . residual
        j = int(torch.argmax(corr))
        if not corr[j] > 0:
            break
        available[j] = False
        col = gradient_gram(
            errors,
            errors[j : j + 1],
            embeddings,
            None if embeddings is None else embeddings[j : j + 1],
            bias=bias,
        )[:, 0]  # [P] g_i . g_j

        # Extend L by one row: [L 0; l^T d] with L l = K_Sj and d^2 = K_jj + lam - |l|^2.
        l_row = torch.linalg.solve_triangular(L[:m, :m], col[support, None], upper=False)[:, 0]
        d_sq = col[j] + lam - l_row @ l_row
        if not d_sq > 1e-12 * (col[j] + lam):  # g_j (numerically) in the support's span
            continue
        rows_k[m] = col
        L[m, :m], L[m, m] = l_row, d_sq.sqrt()
        support = torch.cat([support, support.new_tensor([j])])
        rhs = c[support, None]  # [m+1, 1]
        z = torch.cholesky_solve(rhs, L[: m + 1, : m + 1])[:, 0]  # unconstrained optimum
        if bool((z > 0).all()):
            w = z
            continue
        # Some weight would turn negative: non-negative least squares from the last weights.
        quad = L[: m + 1, : m + 1] @ L[: m + 1, : m + 1].T  # K_SS + lam I
        w = nnls_from(quad, c[support], torch.cat([w, w.new_zeros(1)]))
        keep = w > 0  # compact the support, its Gram rows and factor
        n_keep = int(keep.sum())
        rows_k[:n_keep] = rows_k[: m + 1][keep]
        L[:n_keep, :n_keep] = torch.linalg.cholesky(quad[keep][:, keep])
        support, w = support[keep], w[keep]
    return support, w


def select_gradmatch(
    inputs: SelectionInputs,
    budget: int,
    *,
    generator: torch.Generator,
    lam: Annotated[float, NON_NEGATIVE] = 0.5,
    eps: Annotated[float, NON_NEGATIVE] = 1e-4,
    target: Literal["train", "val"] = "train",
    bias_only: bool = False,
    partition_size: Annotated[int, COUNT] = 4096,
    granularity: Literal["class", "batch"] = "class",
    batch_size: Annotated[int, COUNT] = 256,
    chunk_size: Annotated[int, COUNT] = DEFAULT_CHUNK,
) -> Selection:
    """GradMatch-OMP subset with non-negative weights.

    granularity="class": per-sample gradients are the atoms (GradMatch per-class when run
    within each class by `select_balanced`, as the config's `balance: true` does); "batch":
    mini-batch mean gradients of `batch_size` random rows (see the module docstring).

    target="train" matches each partition's summed gradient; "val" matches the mean held-out
    gradient times the partition size (falls back to "train" without `inputs.val`). Gradients
    are weight+bias of the last layer (the weight's alone for a layer without a bias), or bias
    only with `bias_only`. When OMP stops early (residual below `eps` relative to the target,
    or no row left that helps), the partition's remaining budget is filled with random unpicked
    rows weighted by the mean OMP weight; their number is the selection's
    `diagnostics["backfill_rows"]`.
    Finally all weights are multiplied by one common factor (the selection's `weight_scale`)
    so that they sum to the pool size N; relative weights, hence the direction of the matched
    gradient, are OMP's, across classes too (`select_balanced` joins them). A weighted loss
    should normalise by the weights' sum (as GradMatch's own training loop does), so that
    the factor does not act as a learning rate.
    """
    budget = check_budget(inputs, budget)
    check_choice("gradmatch target", target, ("train", "val"))
    check_choice("gradmatch granularity", granularity, ("class", "batch"))
    if batch_size < 1:
        raise UserError(f"gradmatch batch_size must be >= 1, got {batch_size}")
    if lam < 0 or eps < 0:
        raise UserError(f"gradmatch lam and eps must be >= 0, got lam={lam}, eps={eps}")
    pool = inputs.pool
    device = pool.logits.device
    E_all = errors_of(pool)  # [N, C]
    H_all = None if bias_only else pool.embeddings
    bias = inputs.head_has_bias  # False: the weight's gradient alone
    val_mean = mean_val_gradient(inputs, target, bias_only, chunk_size)
    pool_as_target = int(target == "val" and val_mean is None)
    if granularity == "batch":
        return select_batches(
            E_all,
            H_all,
            val_mean,
            budget,
            generator,
            lam=lam,
            eps=eps,
            batch_size=batch_size,
            bias=bias,
        ).with_diagnostics(pool_as_target=pool_as_target)

    parts = random_partitions(len(pool), partition_size, generator)
    shares = split_budget([len(p) for p in parts], budget)
    picked: list[tuple[Tensor, Tensor, Tensor]] = []  # per partition: OMP rows, weights, fill
    for part, k in zip(parts, shares, strict=True):
        if k == 0:
            continue
        part = part.to(device)
        E = E_all[part].double()  # [P, C]
        H = None if H_all is None else H_all[part].double()  # [P, D]
        if val_mean is None:
            goal = gradient_sum(E, H, chunk_size=chunk_size, bias=bias)
        else:
            goal = val_mean.scaled(float(len(part)))
            goal = LastLayerGradient(
                None if goal.weight is None else goal.weight.double(), goal.bias.double()
            )
        with serial_loop(E.device):
            chosen, w = omp_nonneg(E, H, goal, k, lam=lam, eps=eps, bias=bias)

        # OMP may stop early: the rest of the partition's budget is random unpicked rows.
        free = torch.ones(len(part), dtype=torch.bool, device=device)
        free[chosen] = False
        free_rows = torch.nonzero(free).flatten()
        fill = free_rows[randperm(len(free_rows), generator, device)[: k - len(chosen)]]
        picked.append((part[chosen], w, part[fill]))
    return join_partitions(picked, len(pool), budget, pool_as_target)


def mean_val_gradient(
    inputs: SelectionInputs, target: str, bias_only: bool, chunk_size: int
) -> LastLayerGradient | None:
    """The mean last-layer gradient of `inputs.val` on the pool's device (bias part only with
    `bias_only`; a zero bias part for a layer without a bias), None unless target="val" and
    there is a held-out split."""
    if target != "val" or inputs.val is None:
        return None
    val = inputs.val
    device = inputs.pool.logits.device
    val_errors = errors_of(val).to(device)  # [Nv, C]
    val_h = None if bias_only else val.embeddings.to(device)
    total = gradient_sum(val_errors, val_h, chunk_size=chunk_size, bias=inputs.head_has_bias)
    return total.scaled(1.0 / len(val))


def join_partitions(
    picked: list[tuple[Tensor, Tensor, Tensor]], n: int, budget: int, pool_as_target: int
) -> Selection:
    """The selection of every partition's (OMP rows, OMP weights, back-filled rows), weights
    times one common factor so that they sum to the pool size `n`."""
    # Back-filled rows get the mean OMP weight of their partition (of all partitions if theirs
    # has none), so that every weight is on the scale OMP chose.
    all_omp = torch.cat([w for _, w, _ in picked])
    overall = all_omp.mean() if len(all_omp) > 0 else all_omp.new_tensor(1.0)
    rows, weights = [], []
    for omp_rows, w, fill in picked:
        fill_weight = w.mean() if len(w) > 0 else overall
        rows += [omp_rows, fill]
        weights += [w, fill_weight.expand(len(fill))]
    # One common factor, so the relative weights (the gradient match) are kept as OMP set them.
    w_all = torch.cat(weights)  # [budget]
    diagnostics = {
        "backfill_rows": sum(len(fill) for _, _, fill in picked),
        "pool_as_target": pool_as_target,
    }
    factor = n / w_all.sum()
    return finish(torch.cat(rows), w_all * factor, budget, diagnostics, float(factor))


def batch_gradients(
    errors: Tensor, embeddings: Tensor | None, batches: list[Tensor], *, bias: bool = True
) -> Tensor:
    """Mean last-layer gradient of each mini-batch, flattened as `last_layer_gradients` lays a
    row out: [M, C*D + C] (weight row-major, then bias), [M, C*D] for the weight of a layer
    without a bias (`bias=False`), or [M, C] bias only. float64."""
    atoms = []
    for rows in batches:
        e = errors[rows].double()  # [B, C]
        bias_part = e.mean(0)  # [C]
        if embeddings is None:
            atoms.append(bias_part)
        else:
            weight = e.T @ embeddings[rows].double() / len(rows)  # [C, D]
            atoms.append(torch.cat([weight.flatten(), bias_part]) if bias else weight.flatten())
    return torch.stack(atoms)  # [M, P]


def select_batches(
    errors: Tensor,
    embeddings: Tensor | None,
    val_mean: LastLayerGradient | None,
    budget: int,
    generator: torch.Generator,
    *,
    lam: float,
    eps: float,
    batch_size: int,
    bias: bool = True,
) -> Selection:
    """GradMatch per-batch: OMP over mini-batch mean gradients, picked batches expanded to their
    rows (in order of decreasing weight; the last one cut to the budget), weights per batch.
    OMP picks as many batches as it takes to cover the budget even if it picks the smallest.
    Matches the sum of all batch means (train) or M times the mean held-out gradient (val).
    If OMP stops before the budget is covered, random rows of unpicked batches fill it at the
    mean OMP weight (`diagnostics["backfill_rows"]`). `bias=False`: the atoms are the weight's
    gradients alone (a layer without a bias)."""
    n = errors.shape[0]
    device = errors.device
    batches = random_partitions(n, batch_size, generator)
    batches = [b.to(device) for b in batches]
    atoms = batch_gradients(errors, embeddings, batches, bias=bias)  # [M, P]
    if val_mean is None:
        goal = atoms.sum(0)  # [P]
    else:
        parts = [] if val_mean.weight is None else [val_mean.weight.double().flatten()]
        if bias or val_mean.weight is None:  # no bias part for the weight of a layer without one
            parts.append(val_mean.bias.double())
        goal = torch.cat(parts) * len(batches)  # [P]
    # Batches come out of the split with batch_size rows or one fewer; OMP may pick any k of
    # them, so k is what even the smallest k cover the budget with.
    covered = torch.tensor(sorted(len(b) for b in batches)).cumsum(0)  # [M]
    k = min(len(batches), int(torch.searchsorted(covered, budget)) + 1)
    # Explicit vectors as "bias-only" gradients: the Gram is then the plain inner product.
    with serial_loop(device):
        chosen, w = omp_nonneg(atoms, None, LastLayerGradient(None, goal), k, lam=lam, eps=eps)
    by_weight = torch.argsort(w, descending=True, stable=True)
    chosen, w = chosen[by_weight], w[by_weight]
    rows = torch.cat([batches[int(a)] for a in chosen]) if len(chosen) else errors.new_zeros(0)
    row_w = (
        torch.cat([w[i].expand(len(batches[int(a)])) for i, a in enumerate(chosen)])
        if len(chosen)
        else w
    )
    rows, row_w = rows.long()[:budget], row_w[:budget]
    fill_count = budget - len(rows)
    if fill_count > 0:  # OMP stopped early: random rows of the batches it left
        free = torch.ones(n, dtype=torch.bool, device=device)
        free[rows] = False
        free_rows = torch.nonzero(free).flatten()
        fill = free_rows[randperm(len(free_rows), generator, device)[:fill_count]]
        fill_w = (w.mean() if len(w) else torch.ones((), dtype=torch.float64)).expand(fill_count)
        rows, row_w = torch.cat([rows, fill]), torch.cat([row_w, fill_w.to(row_w)])
    factor = n / row_w.sum()
    return finish(rows, row_w * factor, budget, {"backfill_rows": fill_count}, float(factor))
