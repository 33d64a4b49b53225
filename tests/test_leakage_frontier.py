"""The frontier's lossless speed-up picks a budget per method; picked on the test split its test
accuracy is biased up, so the report also picks it on validation (lipt.report.frontier)."""

from __future__ import annotations

from typing import Any

import pytest

from lipt.report.frontier import aggregate, lossless_speedups, to_json
from lipt.report.frontier_render import section
from lipt.report.frontier_runs import records


def summary(
    approach: str, fraction: float, seed: int, test: float, val: float | None, seconds: float
) -> tuple[str, dict[str, Any]]:
    config = {"approach": approach, "fraction": fraction, "seed": seed,
              "trainer": {"max_epochs": 12}, "selector": {"name": "x"}}  # fmt: skip
    stages = {"train": {"seconds": seconds, "samples": int(1000 * seconds)}}
    return f"{approach}_{fraction}_{seed}", {
        "test_accuracy": test, "val_accuracy": val, "stages": stages, "config": config,
    }  # fmt: skip


def frontier(half_val: float | None = 0.890) -> list[tuple[str, dict[str, Any]]]:
    """The reference at 90% on both splits over 3 seeds; InfoBatch at 50% of its cost a point
    short on validation but level on test (luck on test), at 70% lossless on both."""
    jobs = [summary("full_data", 0.1, s, 0.900 + 0.001 * s, 0.900, 100.0) for s in range(3)]
    jobs += [summary("infobatch", 0.5, s, 0.902, half_val, 50.0) for s in range(3)]
    jobs += [summary("infobatch", 0.7, s, 0.899, 0.899, 70.0) for s in range(3)]
    return jobs


def test_the_lossless_budget_chosen_on_validation_ignores_test_luck() -> None:
    runs, epochs = records(frontier(), "full_data")
    points = aggregate(runs)
    on_test = lossless_speedups(points)["infobatch"]
    on_val = lossless_speedups(points, on="validation")["infobatch"]
    assert on_test is not None and on_test.budget == 0.5  # the test split's pick
    assert on_val is not None and on_val.budget == 0.7
    assert on_val.speedup == pytest.approx(100 / 70)
    assert on_val.accuracy == pytest.approx(89.9)  # its test accuracy, reported as it is
    text = "\n".join(section(points, runs, epochs))
    assert "| infobatch | 1.43x | 0.7 | 89.90 | 89.90 ± 0.00 |" in text
    assert "read off the test split" in text
    assert "never used to choose" not in text  # the lossless table above it is read on test
    chosen = to_json(points, runs, epochs)["lossless_on_validation"]["infobatch"]
    assert chosen["budget"] == 0.7


def test_no_budget_within_the_floor_on_validation_and_none_without_validation() -> None:
    runs, epochs = records(frontier()[:6], "full_data")  # InfoBatch at 50% only
    points = aggregate(runs)
    assert lossless_speedups(points)["infobatch"] is not None
    assert lossless_speedups(points, on="validation") == {"infobatch": None}
    runs, epochs = records(frontier(half_val=None), "full_data")
    points = aggregate(runs)
    assert lossless_speedups(points, on="validation")["infobatch"].budget == 0.7  # type: ignore[union-attr]
    unvalidated = [summary("full_data", 0.1, s, 0.9, None, 100.0) for s in range(3)]
    unvalidated += [summary("infobatch", 0.7, s, 0.9, None, 70.0) for s in range(3)]
    runs, epochs = records(unvalidated, "full_data")
    points = aggregate(runs)
    assert lossless_speedups(points, on="validation") == {"infobatch": None}
    assert "Lossless chosen on validation" not in "\n".join(section(points, runs, epochs))
