"""One NaN/inf scan for every layer (lipt.core.finite), chunk by chunk, and one pass of it per
selection: the data's check of held inputs, label cleaning's and the selectors' all go
through it, and a selection scans the model's outputs once, not once more per selector call
and once more per class under `balance`."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import TensorDataset

from lipt.cleaning.inputs import check_finite
from lipt.core.errors import UserError
from lipt.data.contract import check_finite_inputs
from lipt.selection.api import select
from lipt.selection.common import select_balanced
from lipt.selection.scores import select_el2n
from lipt.selection.types import PoolOutputs, SelectionInputs
from tests.helpers import LargestTensor

N, C, D = 3000, 10, 32


class ScannedElements(TorchDispatchMode):
    """Counts the elements every `isfinite` reads: the NaN scan's work, whoever calls it
    (torch runs a float's isfinite as `x == x` and `abs(x) != inf`: the latter is counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.ne.Scalar and args[1] == float("inf"):
            self.elements += args[0].numel()
        return func(*args, **(kwargs or {}))


def test_every_caller_scans_chunk_by_chunk_with_the_one_chunk_size(monkeypatch):
    """Data's own chunk size (4,096 items, 32x32x3 floats each: 50 MB of bools) ignored the
    one the tests set for the selectors' scan; now every caller's chunk is CHUNK_ROWS."""
    monkeypatch.setattr("lipt.core.finite.CHUNK_ROWS", 100)
    images = torch.randn(N, 3, 8, 8)
    images[2718, 1, 2, 3] = float("nan")
    images[2999, 0, 0, 0] = float("inf")
    calls = [
        lambda: check_finite_inputs(TensorDataset(images, torch.zeros(N)), "train"),
        lambda: check_finite(images, "the inputs", "item", "fix them"),
    ]
    for call in calls:
        with LargestTensor() as watch, pytest.raises(ValueError, match="2 item") as refusal:
            call()
        assert "2718, 2999" in str(refusal.value)
        assert watch.largest <= 100 * 3 * 8 * 8, watch.largest  # one chunk, not 4,096 items
    pool = PoolOutputs(
        torch.randn(N, C), images.reshape(N, -1), torch.arange(N) % C, torch.arange(N)
    )
    with LargestTensor() as watch, pytest.raises(UserError, match="in 2 row"):
        select_el2n(SelectionInputs(pool), 100, generator=torch.Generator())
    assert watch.largest <= N * C, watch.largest  # the [N] mask, never [N, D]


def test_the_scan_finds_no_row_in_what_cannot_hold_a_nan():
    from lipt.core.finite import nonfinite_rows

    assert nonfinite_rows(torch.arange(10)).tolist() == []  # integers
    assert nonfinite_rows(torch.tensor(float("nan"))).tolist() == []  # a scalar has no rows
    assert nonfinite_rows(torch.empty(0, 4)).tolist() == []
    values = torch.zeros(5, 2, dtype=torch.complex64)
    values[3, 1] = complex(float("inf"), 0)
    assert nonfinite_rows(values).tolist() == [3]


def _data() -> tuple[nn.Module, list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    x, y, idx = torch.randn(N, 16), torch.arange(N) % C, torch.arange(N)
    model = nn.Sequential(nn.Linear(16, D), nn.ReLU(), nn.Linear(D, C))
    return model, [(x[i : i + 500], y[i : i + 500], idx[i : i + 500]) for i in range(0, N, 500)]


@pytest.mark.parametrize("balance", [False, True])
def test_a_selection_scans_the_models_outputs_once(balance):
    """Before: the pass in rank_pool, again in the selector's check_budget, and under
    balance again in select_balanced and in each class's call: 2 and 3 passes over [N, C + D]."""
    model, batches = _data()
    with ScannedElements() as scan:
        subset = select(model, batches, 300, "el2n", balance=balance, profile=False)
    assert len(subset.indices) == 300
    # the pool's logits and embeddings once; the rest: checks of the 300 chosen weights
    assert N * (C + D) <= scan.elements < N * (C + D) + N, scan.elements


def test_a_selector_called_on_its_own_still_refuses_a_nan_and_scans_once():
    pool = PoolOutputs(torch.randn(N, C), torch.randn(N, D), torch.arange(N) % C, torch.arange(N))
    inputs = SelectionInputs(pool)
    with ScannedElements() as scan:
        select_balanced(select_el2n, inputs, 300, generator=torch.Generator())
    assert N * (C + D) <= scan.elements < N * (C + D) + N, scan.elements  # not per class
    pool.embeddings[1234, 5] = float("nan")
    for call in (select_el2n, lambda *a, **k: select_balanced(select_el2n, *a, **k)):
        with pytest.raises(UserError, match=r"in 1 row\(s\) \(dataset index 1234 first\)"):
            call(inputs, 300, generator=torch.Generator())
