"""What lipt asks of a selector's output, a user's own selector's above all: a `Selection` of
exactly `budget` distinct rows of the pool it was given (positions 0..N-1) with finite loss
weights >= 0, one per row. `checked_selector` holds every call to it, per class too under
`balance`, so a wrong output is one line naming the selector, not an IndexError in the middle
of lipt or, for NaN weights, a run that trains on a NaN loss.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from lipt.core.errors import UserError
from lipt.selection.common import Selector
from lipt.selection.types import Selection, SelectionInputs


def selector_name(selector: Any) -> str:
    """The function's name behind wrappers and functools.partial."""
    while True:
        inner = getattr(selector, "__wrapped__", None) or getattr(selector, "func", None)
        if inner is None:
            return str(getattr(selector, "__name__", type(selector).__name__))
        selector = inner


def check_selection(selection: Any, budget: int, pool_rows: int, name: str) -> Selection:
    """`selection` when it is what a selector must return for `budget` rows of a pool of
    `pool_rows`; UserError naming selector `name` and what is wrong otherwise."""
    said = f"selector {name}"
    if not isinstance(selection, Selection):
        raise UserError(
            f"{said} returned a {type(selection).__name__}, not a Selection: return "
            "lipt.selection.Selection(rows, weights) (int64 rows, float32 weights)"
        )
    rows, weights = selection.rows, selection.weights
    if rows.ndim != 1 or len(rows) != budget:
        raise UserError(
            f"{said} returned {tuple(rows.shape)} rows for a budget of {budget}: return exactly "
            "`budget` rows, a 1-d tensor"
        )
    if budget and (int(rows.min()) < 0 or int(rows.max()) >= pool_rows):
        bad = rows[(rows < 0) | (rows >= pool_rows)]
        raise UserError(
            f"{said} returned row {int(bad[0])}, outside the {pool_rows} rows it was given: "
            f"rows are positions 0..{pool_rows - 1} in inputs.pool"
        )
    repeated = budget - len(torch.unique(rows))
    if repeated:
        raise UserError(f"{said} returned {repeated} row(s) more than once: return each row once")
    if not bool((torch.isfinite(weights) & (weights >= 0)).all()):
        raise UserError(
            f"{said} returned weights that are NaN, infinite or negative: return finite loss "
            "weights >= 0 (ones, if the selector does not weight its rows)"
        )
    return selection


def checked_selector(selector: Selector) -> Selector:
    """`selector` with each output held by `check_selection` against its call's budget and
    pool."""
    name = selector_name(selector)

    @functools.wraps(selector)
    def checked(inputs: SelectionInputs, budget: int, **kwargs: Any) -> Selection:
        selection = selector(inputs, budget, **kwargs)
        return check_selection(selection, budget, len(inputs.pool.targets), name)

    return checked
