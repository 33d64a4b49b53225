"""lipt's selectors called on their own with NaN or infinite model outputs: a one-line refusal
naming the first row, not CRAIG's lazy greedy looping forever, coverage failing deep in its
k-means, or the score selectors silently ranking NaN first. Finite outputs of a model whose
outputs are all equal (ties everywhere) still give a full, valid subset."""

from __future__ import annotations

import functools

import pytest
import torch

from lipt.core.errors import UserError
from lipt.selection import (
    LearnerHeads,
    PoolOutputs,
    SelectionInputs,
    select_balanced,
    select_ccs,
    select_coverage,
    select_craig,
    select_el2n,
    select_glister,
    select_gradmatch,
    select_uncertainty,
)

N, C, D, BUDGET = 1200, 10, 64, 120
SELECTORS = {
    "craig": select_craig,
    "coverage": select_coverage,
    "glister": select_glister,
    "gradmatch": select_gradmatch,
    "el2n": select_el2n,
    "uncertainty": select_uncertainty,
    "ccs": select_ccs,
}


def inputs(logits: torch.Tensor, embeddings: torch.Tensor) -> SelectionInputs:
    g = torch.Generator().manual_seed(1)
    targets, indices = torch.arange(N) % C, torch.arange(N) * 3  # positions, not rows
    pool = PoolOutputs(logits, embeddings, targets, indices)
    return SelectionInputs(
        pool=pool,
        val=pool.take(torch.arange(0, N, 5)),
        classifier_weight=torch.randn(C, D, generator=g),
        classifier_bias=torch.zeros(C),
        learner_heads=LearnerHeads(torch.randn(3, C, D, generator=g), torch.zeros(3, C)),
    )


def finite() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, C, generator=g), torch.randn(N, D, generator=g).relu()


@pytest.mark.parametrize("name", list(SELECTORS))
@pytest.mark.parametrize("bad", ["nan-logit", "inf-embedding"])
def test_a_selector_refuses_non_finite_outputs_naming_the_first_row(name, bad):
    logits, embeddings = finite()
    if bad == "nan-logit":
        logits[[777, 31], 2] = float("nan")
    else:
        embeddings[[777, 31], 5] = float("inf")
    g = torch.Generator().manual_seed(0)
    with pytest.raises(UserError) as caught:
        SELECTORS[name](inputs(logits, embeddings), BUDGET, generator=g)
    message = str(caught.value)
    assert message.startswith(
        "the logits or embeddings of the pool are NaN or infinite in 2 row(s) "
        "(dataset index 93 first): no selector can rank them"
    ), message


@pytest.mark.parametrize("name", list(SELECTORS))
def test_a_model_whose_outputs_are_all_equal_still_gives_a_full_balanced_subset(name):
    logits, embeddings = torch.zeros(N, C), torch.ones(N, D)
    fn = SELECTORS[name]
    if name != "coverage":  # coverage sets its own class budgets
        fn = functools.partial(select_balanced, fn)
    chosen = fn(inputs(logits, embeddings), BUDGET, generator=torch.Generator().manual_seed(0))
    assert len(chosen.rows.unique()) == BUDGET
    assert bool(torch.isfinite(chosen.weights).all()) and bool((chosen.weights > 0).all())
    counts = torch.bincount(torch.arange(N)[chosen.rows] % C, minlength=C)
    if name != "coverage":  # ties broken within each class's own budget
        assert counts.tolist() == [BUDGET // C] * C
    assert int(counts.min()) > 0, counts.tolist()
