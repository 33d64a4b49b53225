"""The real selector configs, composed as a user gets them: a default run of every selector
that ranks with a model takes each class's proportional share of the budget."""

from __future__ import annotations

import pytest
import torch

from lipt.build import build_datamodule, build_model
from lipt.select import choose_subset
from lipt.selection import split_budget
from tests.conftest import CONFIGS, FAST

MODEL_SELECTORS = sorted(
    p.stem for p in (CONFIGS / "selector").glob("*.yaml") if p.stem not in ("full", "random")
)


@pytest.mark.parametrize("selector", MODEL_SELECTORS)
def test_default_selection_is_class_balanced(make_cfg, selector: str) -> None:
    cfg = make_cfg([*FAST, f"selector={selector}", "fraction=0.3"])
    dm = build_datamodule(cfg)
    labels = dm.train_source.labels
    pool_counts = torch.bincount(labels[dm.pool_indices]).tolist()
    budget = round(0.3 * len(dm.pool_indices))
    model = build_model(cfg, 0)
    indices, _ = choose_subset(cfg, dm, [model], 0)
    counts = torch.bincount(labels[indices], minlength=len(pool_counts)).tolist()
    assert counts == split_budget(pool_counts, budget), (selector, counts, pool_counts)
