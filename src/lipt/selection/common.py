"""Shared plumbing of the selectors: argument checks, integer budget splits, random partitions,
and the per-class wrapper `select_balanced`.

Every selector has the signature of `Selector`; hyper-parameters are keyword arguments with
defaults so that Hydra can build one with `_partial_: true` and the stage calls
`fn(inputs, budget, generator=g)`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

import torch
from torch import Tensor

from lipt.core.errors import UserError
from lipt.core.finite import nonfinite_rows
from lipt.core.seeding import torch_threads
from lipt.selection.types import PoolOutputs, Selection, SelectionInputs


class Selector(Protocol):
    """`fn(inputs, budget, generator=g) -> Selection` (hyper-parameters already bound)."""

    def __call__(
        self, inputs: SelectionInputs, budget: int, *, generator: torch.Generator
    ) -> Selection: ...


def check_budget(inputs: SelectionInputs, budget: int) -> int:
    """Validate `0 < budget <= len(pool)` and that the extra pools line up with the pool."""
    n = len(inputs.pool)
    if isinstance(budget, bool) or int(budget) != budget:
        raise UserError(f"selection budget must be an integer, got {budget!r}")
    if not 0 < budget <= n:
        raise UserError(
            f"selection budget must be in [1, {n}] (the pool size), got {budget}; "
            "check `fraction` and the size of the training pool"
        )
    for i, extra in enumerate(inputs.extra_pools):
        if len(extra) != n or extra.num_classes != inputs.pool.num_classes:
            raise ValueError(
                f"extra_pools[{i}] has {len(extra)} rows x {extra.num_classes} classes, "
                f"the pool has {n} x {inputs.pool.num_classes}"
            )
    if not inputs.outputs_checked:
        check_finite_outputs(inputs)
    return int(budget)


def check_finite_outputs(inputs: SelectionInputs) -> None:
    """UserError for a NaN or infinite logit or embedding: CRAIG's lazy greedy would never
    finish on one, the score selectors would rank it silently. Inputs of rank_pool were
    checked as it scored them (`outputs_checked`); a selector called on others checks here."""
    named = [("the pool", inputs.pool), ("the validation split", inputs.val)]
    named += [(f"extra_pools[{i}]", extra) for i, extra in enumerate(inputs.extra_pools)]
    for where, outputs in named:
        if outputs is None:
            continue
        rows = torch.cat([nonfinite_rows(outputs.logits), nonfinite_rows(outputs.embeddings)])
        if len(rows):
            rows = rows.unique()
            raise UserError(
                f"the logits or embeddings of {where} are NaN or infinite in {len(rows)} row(s) "
                f"(dataset index {int(outputs.indices[rows[0]])} first): no selector can rank "
                "them; check those inputs and the model (a diverged training, an overflow in "
                "low precision)"
            )


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise UserError(f"{name} must be one of {list(choices)}, got {value!r}")


def finish(
    rows: Tensor,
    weights: Tensor | None,
    budget: int,
    diagnostics: dict[str, int] | None = None,
    weight_scale: float = 1.0,
) -> Selection:
    """Sort rows ascending (weights follow), cast, and check the invariants every selector
    promises: exactly `budget` unique rows, finite positive float32 weights (`weight_scale`:
    see `Selection`)."""
    rows = rows.to(torch.int64)
    weights = torch.ones(rows.shape[0]) if weights is None else weights
    weights = weights.to(device=rows.device, dtype=torch.float32)
    order = torch.argsort(rows)
    rows, weights = rows[order], weights[order]
    assert rows.shape[0] == budget, (rows.shape, budget)
    assert rows.shape[0] < 2 or bool((rows[1:] != rows[:-1]).all()), "duplicate rows"
    assert bool(torch.isfinite(weights).all()) and bool((weights > 0).all()), "bad weights"
    return Selection(
        rows=rows.cpu(),
        weights=weights.cpu(),
        diagnostics=dict(diagnostics or {}),
        weight_scale=float(weight_scale),
    )


def serial_loop(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """One intra-op thread on the CPU while a greedy loop runs: its many tiny ops gain nothing
    from threads but pay their synchronisation, which stalls badly on a busy machine."""
    return torch_threads(1 if device.type == "cpu" else None)


def randperm(n: int, generator: torch.Generator, device: torch.device | None = None) -> Tensor:
    """`torch.randperm` drawn on the generator's device (CPU), then moved to `device`."""
    perm = torch.randperm(n, generator=generator, device=generator.device)
    return perm.to(device) if device is not None else perm


def within_group_percentiles(values: Tensor, groups: Tensor) -> Tensor:
    """Each row's rank of `values` [N] among the rows of its group (`groups` [N], int >= 0),
    as a share of the group's size - 1, in [0, 1], [N] float32 (ties: the earlier row first)."""
    n = values.shape[0]
    by_value = torch.argsort(values, stable=True)
    grouped = by_value[torch.argsort(groups[by_value], stable=True)]  # by group, then value
    sizes = torch.bincount(groups)  # [G]
    starts = torch.cumsum(sizes, 0) - sizes  # [G], each group's first slot in `grouped`
    rank = torch.empty(n, dtype=torch.float32)
    rank[grouped] = (torch.arange(n) - starts[groups[grouped]]).float()
    return rank / (sizes[groups] - 1).clamp_min(1).float()


def split_budget(counts: Sequence[int], budget: int) -> list[int]:
    """Split `budget` over groups proportionally to `counts` by largest-remainder rounding.

    The shares sum to `budget` exactly and never exceed a group's count (ties in the remainder
    go to the larger group, then to the earlier one).
    """
    total = sum(counts)
    assert 0 <= budget <= total, (budget, total)
    if total == 0:
        return [0 for _ in counts]
    exact = [budget * c / total for c in counts]
    shares = [min(math.floor(x), c) for x, c in zip(exact, counts, strict=True)]
    by_remainder = sorted(
        range(len(counts)), key=lambda i: (-(exact[i] - shares[i]), -counts[i], i)
    )
    left = budget - sum(shares)
    while left > 0:  # more than one round only when rounding met a full group (float noise)
        for i in by_remainder:
            if left > 0 and shares[i] < counts[i]:
                shares[i] += 1
                left -= 1
    assert sum(shares) == budget and all(s <= c for s, c in zip(shares, counts, strict=True))
    return shares


def random_partitions(n: int, partition_size: int, generator: torch.Generator) -> list[Tensor]:
    """Split rows 0..n-1 into ceil(n / partition_size) random, near-equal partitions."""
    if partition_size < 1:
        raise UserError(f"partition_size must be >= 1, got {partition_size}")
    num = max(1, math.ceil(n / partition_size))
    perm = randperm(n, generator)
    return [part.sort().values for part in torch.tensor_split(perm, num)]


def bin_members(bins: Tensor, rows: Tensor) -> list[Tensor]:
    """The `rows` of each non-empty bin (`bins[i]`: the bin of `rows[i]`), bins ascending,
    each bin's rows in their order in `rows`: `[rows[bins == b] for b in range(...)]` less the
    empty ones, by one stable sort rather than a pass over the rows per bin (CCS's strata go
    up to a million)."""
    order = torch.sort(bins, stable=True).indices
    sizes = torch.unique_consecutive(bins[order], return_counts=True)[1]
    return list(torch.split(rows[order], sizes.tolist()))


def select_balanced(
    fn: Selector, inputs: SelectionInputs, budget: int, *, generator: torch.Generator
) -> Selection:
    """Run selector `fn` within each class of the pool.

    The budget is split over classes proportionally to their pool counts (largest remainder,
    exact total). `fn` sees only one class's rows of `pool` and `extra_pools` and, when there is
    a held-out split, only that class's rows of `val` (None when the class is absent from val,
    so GLISTER/GradMatch fall back to the class's pool rows and count it in their
    diagnostics, which are summed over classes here). Rows are mapped back to pool
    positions. Weights that are counts (CRAIG's cluster sizes: a class's sum to its pool
    count) or ones are kept as `fn` returned them; weights that `fn` scaled to sum to the
    class's size (`Selection.weight_scale`, GradMatch's) are un-scaled first and joined by one
    common factor, so the classes keep the weights relative to one another that matched their
    gradients (per class, as CORDS' GradMatch concatenates OMP's weights). Either way they sum
    to the pool size less the classes whose share of the budget rounds to 0, which are skipped.
    """
    budget = check_budget(inputs, budget)
    targets = inputs.pool.targets
    classes = torch.unique(targets).tolist()
    members = [torch.nonzero(targets == c).flatten() for c in classes]  # pool positions
    shares = split_budget([len(m) for m in members], budget)

    rows: list[Tensor] = []
    weights: list[Tensor] = []
    scales: list[float] = []  # each class's Selection.weight_scale
    diagnostics: dict[str, int] = {}
    for c, pos, share in zip(classes, members, shares, strict=True):
        if share == 0:
            continue
        val = inputs.val
        if val is not None:
            val_rows = torch.nonzero(val.targets == c).flatten()
            val = val.take(val_rows) if len(val_rows) > 0 else None
        sub = replace(
            inputs,
            pool=inputs.pool.take(pos),
            val=val,
            extra_pools=tuple(p.take(pos) for p in inputs.extra_pools),
            outputs_checked=True,  # check_budget above checked every class's rows
        )
        chosen = fn(sub, share, generator=generator)
        rows.append(pos.cpu()[chosen.rows])
        weights.append(chosen.weights)
        scales.append(chosen.weight_scale)
        for key, count in chosen.diagnostics.items():
            diagnostics[key] = diagnostics.get(key, 0) + count
    if all(scale == 1.0 for scale in scales):
        return finish(torch.cat(rows), torch.cat(weights), budget, diagnostics)
    # Each class's own (un-scaled) weights, then one factor for all: the same total as above.
    own = torch.cat([w.double() / scale for w, scale in zip(weights, scales, strict=True)])
    factor = sum(float(w.double().sum()) for w in weights) / float(own.sum())
    # A class whose gradients are negligible beside the others' keeps weights > 0 in float32.
    joined = (own * factor).clamp_min(torch.finfo(torch.float32).tiny)
    return finish(torch.cat(rows), joined, budget, diagnostics, weight_scale=factor)


def all_pools(inputs: SelectionInputs) -> tuple[PoolOutputs, ...]:
    """`pool` followed by every extra pool (the repeats some scores average over)."""
    return (inputs.pool, *inputs.extra_pools)
