"""The real selector configs, composed as a user gets them: a default run of every selector
that ranks with a model takes each class's proportional share of the budget; the fallbacks a
selector takes reach summary.json; a selector that needs validation rows refuses to run
without them."""

from __future__ import annotations

import json

import pytest
import torch

from lipt.core.errors import UserError
from lipt.run.config import run_of, validate
from lipt.selection import split_budget
from lipt.stages import select as select_stage
from lipt.stages import train as train_stage
from lipt.stages.build import build_datamodule, build_model, build_parts
from lipt.stages.select import choose_subset
from tests.helpers import CONFIGS, FAST

# coverage budgets classes by their difficulty on purpose (tests/test_selection_coverage.py).
MODEL_SELECTORS = sorted(
    p.stem
    for p in (CONFIGS / "selector").glob("*.yaml")
    if p.stem not in ("none", "random", "coverage")
)


@pytest.mark.parametrize("selector", MODEL_SELECTORS)
def test_default_selection_is_class_balanced(make_cfg, selector: str) -> None:
    cfg = make_cfg([*FAST, f"selector={selector}", "budget=subset", "fraction=0.3"])
    dm = build_datamodule(run_of(cfg))
    labels = dm.train_source.labels
    pool_counts = torch.bincount(labels[dm.pool_indices]).tolist()
    budget = round(0.3 * len(dm.pool_indices))
    model = build_model(run_of(cfg), 0)
    indices, _ = choose_subset(run_of(cfg), build_parts(run_of(cfg), dm), [model], 0)
    counts = torch.bincount(labels[indices], minlength=len(pool_counts)).tolist()
    assert counts == split_budget(pool_counts, budget), (selector, counts, pool_counts)


@pytest.mark.parametrize("selector", ["glister", "gradmatch"])
def test_summary_reports_the_selectors_fallbacks(make_cfg, tmp_path, selector: str) -> None:
    overrides = [*FAST, f"selector={selector}", "budget=subset", "fraction=0.3"]
    train_summary = train_stage.run(validate(make_cfg(overrides)))
    select_summary = select_stage.run(validate(make_cfg(overrides, config_name="select")))
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    for summary in (train_summary, select_summary, on_disk):
        profile = summary["stages"]["select"]["profile"]  # lipt.selection.profile
        assert 0.0 <= profile["norm_percentile"] <= 1.0 and profile["coverage_ratio"] > 0
        diagnostics = summary["stages"]["select"]["diagnostics"]
        assert diagnostics["pool_as_target"] == 0  # every class has validation rows
        if selector == "gradmatch":
            assert 0 <= diagnostics["backfill_rows"] <= 0.3 * 500


def test_no_validation_rows_is_a_user_error_before_any_work(
    make_cfg, tmp_path, monkeypatch
) -> None:
    cfg = make_cfg(
        [*FAST, "selector=glister", "budget=subset", "dataset.val_size=0", "pretrain=full"]
    )
    with pytest.raises(UserError, match=r"dataset\.val_size"):
        train_stage.run(validate(cfg))
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "subset.npz").exists()
    # a split that comes out empty is caught by the stage itself
    cfg = make_cfg([*FAST, "selector=gradmatch", "budget=subset", "dataset.val_size=0"])
    dm = build_datamodule(run_of(cfg))
    assert len(dm.val_indices) == 0
    cfg.selector.target = "val"
    with pytest.raises(UserError, match="validation split"):
        choose_subset(run_of(cfg), build_parts(run_of(cfg), dm), [build_model(run_of(cfg), 0)], 0)

    def pretrained(*args: object, **kwargs: object) -> None:
        raise AssertionError("pre-trained before the check")

    monkeypatch.setattr(select_stage, "ranking_models", pretrained)
    with pytest.raises(UserError, match="validation split"):
        select_stage.select_subset(run_of(cfg), build_parts(run_of(cfg), dm))


def test_gradmatch_per_batch_runs_from_the_config(make_cfg) -> None:
    cfg = make_cfg(
        [
            *FAST,
            "selector=gradmatch",
            "budget=subset",
            "selector.granularity=batch",
            "selector.balance=false",
        ]
    )
    assert cfg.selector.batch_size == cfg.batch_size == 32  # the training batch, as in CORDS
    dm = build_datamodule(run_of(cfg))
    diagnostics: dict[str, int] = {}
    indices, weights = choose_subset(
        run_of(cfg), build_parts(run_of(cfg), dm), [build_model(run_of(cfg), 0)], 0, diagnostics
    )
    assert len(indices) == 50 and diagnostics["backfill_rows"] <= 50
    # one weight per 32-row batch: 2 batches (the second cut to 18 rows), unless OMP stopped
    assert len(torch.unique(weights)) <= 2 + diagnostics["backfill_rows"]


def test_full_steps_trains_the_whole_pool_for_the_subset_runs_steps(make_cfg) -> None:
    """approach=full_steps: the whole pool (500 rows), stopped after the 2 x ceil(100 / 32) = 8
    optimiser steps a 20% subset run makes in 2 epochs: 8 full batches, not 2 epochs of 500."""
    # FAST's budget would win over the preset's (command-line overrides win): leave it out
    fast = [o for o in FAST if not o.startswith("budget=")]
    overrides = [*fast, "+approach=full_steps", "fraction=0.2", "trainer.max_epochs=2"]
    summary = train_stage.run(validate(make_cfg(overrides)))
    assert summary["config"]["budget"]["name"] == "full_steps" and summary["subset_size"] == 500
    assert summary["stages"]["train"]["samples"] == 8 * 32
