"""Every selector on a 200k x 10-class x 64-dim pool, watching every tensor the selector creates:
none may be as large as the [N, C*D] per-sample gradient matrix (or anything N x N)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pytest
import torch

from lipt.core.seeding import torch_threads
from lipt.selection import (
    PoolOutputs,
    SelectionInputs,
    last_layer_gradients,
    select_balanced,
)
from tests.helpers import SELECTORS, LargestTensor

N, C, D = 200_000, 10, 64


@pytest.fixture(scope="module")
def big_inputs() -> Iterator[SelectionInputs]:
    with torch_threads(1):  # see test_selection_selectors: many tiny ops
        yield make_inputs()


def make_inputs() -> SelectionInputs:
    g = torch.Generator().manual_seed(0)
    W = torch.randn(C, D, generator=g) / D**0.5
    b = torch.zeros(C)
    y = torch.randint(C, (N,), generator=g)
    h = torch.randn(N, D, generator=g).relu() + W[y].clamp_min(0)
    pool = PoolOutputs(h @ W.T + b, h, y, torch.arange(N))
    val = PoolOutputs(pool.logits[:2000], h[:2000], y[:2000], torch.arange(2000))
    return SelectionInputs(pool, val=val, classifier_weight=W, classifier_bias=b)


def test_the_watch_sees_a_gradient_matrix(big_inputs: SelectionInputs) -> None:
    pool = big_inputs.pool.take(torch.arange(5000))
    with LargestTensor() as watch:
        last_layer_gradients(pool.logits, pool.targets, pool.embeddings)
    assert watch.largest >= 5000 * C * D


CASES = {
    **SELECTORS,
    "grand": partial(SELECTORS["grand"], chunk_size=8192),
    "glister": partial(SELECTORS["glister"], chunk_size=8192),
    # CRAIG's work is N x partition_size (facility location within each partition): with the
    # default 4096 it takes ~10 s here on one core, so the quick run uses smaller partitions.
    "craig_1024": partial(SELECTORS["craig"], partition_size=1024),
}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n == "craig" else n for n in sorted(CASES)],
)
def test_selector_never_builds_a_gradient_matrix(big_inputs: SelectionInputs, name: str) -> None:
    fn = CASES[name]
    budget = 400  # 0.2%: keeps the greedy loops short; the partitions are full size
    with LargestTensor() as watch:  # (its time is benchmarks/selection_cost.py's business)
        sel = fn(big_inputs, budget, generator=torch.Generator().manual_seed(0))
    assert len(sel.rows) == budget
    assert watch.largest < N * C * D // 4, (name, watch.largest)


def test_balanced_stays_small(big_inputs: SelectionInputs) -> None:
    fn = SELECTORS["gradmatch"]
    with LargestTensor() as watch:
        sel = select_balanced(fn, big_inputs, 200, generator=torch.Generator().manual_seed(0))
    assert len(sel.rows) == 200
    assert watch.largest < N * C * D // 4
