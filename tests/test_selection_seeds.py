"""Random streams of the selection stage: GraNd's extra models and every re-selection draw from
independent SeedSequence streams, the initial selection keeps the run's own seed, and the random
baselines (online, class-balanced) never run a model over the pool."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lipt.core.seeding import repeat_seed, reselect_seed
from lipt.run.config import run_of, validate
from lipt.selection import api as selection_api
from lipt.selection import split_budget
from lipt.stages import train as train_stage
from lipt.stages.build import build_datamodule, build_model, build_parts
from lipt.stages.select import choose_subset
from tests.helpers import FAST


def test_streams_of_different_runs_share_nothing() -> None:
    seeds = range(5)
    repeats = {s: {repeat_seed(s, r) for r in range(10)} for s in seeds}
    rounds = {s: {reselect_seed(s, e) for e in range(1, 200)} for s in seeds}
    for s in seeds:
        assert repeat_seed(s, 0) == reselect_seed(s, 0) == s  # the initial draw is unchanged
        assert len(repeats[s]) == 10 and len(rounds[s]) == 199
        assert not (repeats[s] - {s}) & rounds[s]  # repeats and re-selections differ
        for other in seeds:
            if other != s:
                assert not repeats[s] & repeats[other], (s, other)
                assert not rounds[s] & rounds[other], (s, other)


def test_initial_random_selection_keeps_the_seed(make_cfg) -> None:
    cfg = make_cfg([*FAST, "selector=random", "budget=subset", "fraction=0.2"])
    dm = build_datamodule(run_of(cfg))
    indices, _ = choose_subset(run_of(cfg), build_parts(run_of(cfg), dm), [], 3)
    budget = round(0.2 * len(dm.pool_indices))
    expected = torch.randperm(len(dm.pool_indices), generator=torch.Generator().manual_seed(3))
    assert torch.equal(indices, dm.pool_indices[expected[:budget]].sort().values)


@pytest.fixture
def no_scoring(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a random selector ran the model over the pool")

    monkeypatch.setattr(selection_api, "model_outputs", refuse)


def test_random_baselines_never_score_the_pool(make_cfg, no_scoring) -> None:
    for selector in ("random", "random_balanced"):
        cfg = make_cfg([*FAST, f"selector={selector}", "budget=subset", "fraction=0.2"])
        dm = build_datamodule(run_of(cfg))
        choose_subset(
            run_of(cfg), build_parts(run_of(cfg), dm), [build_model(run_of(cfg), 0)], 5
        )  # a model is offered, and ignored


def test_class_balanced_random_takes_each_class_share(make_cfg, no_scoring) -> None:
    cfg = make_cfg([*FAST, "selector=random_balanced", "budget=subset", "fraction=0.3"])
    dm = build_datamodule(run_of(cfg))
    labels = dm.train_source.labels
    pool_counts = torch.bincount(labels[dm.pool_indices]).tolist()
    shares = split_budget(pool_counts, round(0.3 * len(dm.pool_indices)))
    for seed in (0, 1):
        indices, _ = choose_subset(run_of(cfg), build_parts(run_of(cfg), dm), [], seed)
        assert torch.bincount(labels[indices], minlength=len(shares)).tolist() == shares


def test_random_online_redraws_without_scoring(make_cfg, tmp_path, no_scoring) -> None:
    cfg = make_cfg(
        [
            *FAST,
            "selector=random",
            "budget=subset",
            "fraction=0.2",
            "reselect_every=1",
            "trainer.max_epochs=3",
        ]
    )
    summary = train_stage.run(validate(cfg))
    assert summary["stages"]["train"]["reselections"] == 2
    subsets = [np.load(tmp_path / "subset.npz")["indices"]]
    subsets += [np.load(tmp_path / "subsets" / f"epoch_{e}.npz")["indices"] for e in (1, 2)]
    assert all(len(s) == 100 for s in subsets)
    assert not np.array_equal(subsets[0], subsets[1])
    assert not np.array_equal(subsets[1], subsets[2])
