"""benchmarks/frontier.py: its pure parts on hand-made results (costs, aggregation, the lossless
speed-up, the table), the whole-pool method's shorter cosine, bad input, and `--small` end to end
(every run's result written, a second invocation skipping every run, the report files)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helpers import FAST, ROOT, run_entry


def load_frontier() -> ModuleType:
    spec = importlib.util.spec_from_file_location("frontier", ROOT / "benchmarks" / "frontier.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["frontier"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


fr = load_frontier()


def result(method: str, budget: float, seed: int, accuracy: float, seconds: float) -> dict:
    """A run's result as frontier.py writes it, with what aggregation reads."""
    return {
        "name": fr.run_name(method, budget, seed),
        "method": method,
        "budget": budget,
        "seed": seed,
        "test_accuracy": accuracy,
        "seconds": {"end_to_end": seconds},
        "samples": {"forward_backward": int(1000 * seconds)},
    }


def reference(accuracies: tuple[float, ...] = (0.885, 0.887, 0.889), seconds: float = 100.0):
    return [result("reference", 1.0, s, a, seconds) for s, a in enumerate(accuracies)]


# --- costs and aggregation ------------------------------------------------------------------


def test_costs_add_the_stages_and_count_a_missing_stage_as_zero() -> None:
    summary = {
        "test_accuracy": 0.8,
        "val_accuracy": 0.79,
        "train_size": 500,
        "subset_size": 50,
        "stages": {
            "pretrain": {"seconds": 2.5, "samples": 320, "unique_samples": 32},
            "select": {"seconds": 0.5, "diagnostics": {}},
            "train": {"seconds": 7.0, "samples": 100, "unique_samples": 50},
        },
    }
    c = fr.costs(summary)
    assert c["seconds"] == {"pretrain": 2.5, "select": 0.5, "train": 7.0, "end_to_end": 10.0}
    assert c["samples"] == {"pretrain": 320, "train": 100, "forward_backward": 420}
    assert c["reselections"] == 0 and c["unique_samples"] == 50
    whole = {"test_accuracy": 0.9, "stages": {"train": {"seconds": 4.0, "samples": 1000}}}
    c = fr.costs(whole)
    assert c["seconds"]["end_to_end"] == 4.0 and c["samples"]["forward_backward"] == 1000
    # dynamic=lipt's scoring pass of the soup over the pool is a stage of its own: it is paid
    scored = {**whole, "stages": {**whole["stages"], "score": {"seconds": 1.5}}}
    assert fr.costs(scored)["seconds"]["end_to_end"] == 5.5


def test_aggregate_means_stds_and_speedups() -> None:
    results = [
        *reference(seconds=100.0),
        result("random", 0.1, 0, 0.80, 10.0),
        result("random", 0.1, 1, 0.82, 30.0),
    ]
    points = {p.method: p for p in fr.aggregate(results)}
    ref, rnd = points["reference"], points["random"]
    assert ref.accuracy == pytest.approx(88.7) and ref.accuracy_std == pytest.approx(0.2)
    assert ref.speedup == pytest.approx(1.0)
    assert rnd.seeds == (0, 1) and rnd.accuracy == pytest.approx(81.0)
    assert rnd.accuracy_std == pytest.approx(math.sqrt(2) * 1.0)  # stdev of 80, 82
    assert rnd.seconds == pytest.approx(20.0) and rnd.speedup == pytest.approx(5.0)
    assert rnd.samples == pytest.approx(20000) and rnd.sample_speedup == pytest.approx(5.0)
    # Without a reference: points, no speed-ups.
    assert all(p.speedup is None for p in fr.aggregate(results[3:]))


def test_lossless_speedup_none_when_no_budget_is_within_the_tolerance() -> None:
    results = [
        *reference(),  # mean 88.7
        result("random", 0.1, 0, 0.85, 10.0),
        result("random", 0.5, 0, 0.8839, 50.0),  # 0.31 points below: not lossless
    ]
    best = fr.lossless_speedups(fr.aggregate(results))
    assert best == {"random": None}
    rows = "\n".join(fr.lossless_rows(fr.aggregate(results)))
    assert "| random | none | - | - |" in rows


def test_lossless_speedup_picks_the_fastest_point_within_the_tolerance() -> None:
    results = [
        *reference(),  # mean 88.7, 100 s
        result("full", 0.1, 0, 0.870, 10.0),  # 10x but 1.7 points below
        result("full", 0.2, 0, 0.884, 25.0),  # 4x, exactly 0.3 below: qualifies
        result("full", 0.5, 0, 0.889, 50.0),  # 2x, above the reference
        result("paper", 0.1, 0, 0.889, 120.0),  # level, but slower than the reference
        result("curve", 16 / 12, 0, 0.897, 130.0),  # the whole pool's extra point: never picked
    ]
    points = fr.aggregate(results)
    best = fr.lossless_speedups(points)
    assert set(best) == {"full", "paper"}
    assert best["full"].budget == 0.2 and best["full"].speedup == pytest.approx(4.0)
    assert best["paper"].speedup == pytest.approx(100 / 120)
    rows = "\n".join(fr.lossless_rows(points))
    assert "| full | 4.00x | 0.2 | 88.40 |" in rows


def test_table_rows_reference_first_then_each_method_by_budget() -> None:
    results = [
        *reference(),
        result("random", 0.2, 0, 0.85, 20.0),
        result("random", 0.1, 0, 0.83, 10.0),
        result("random", 0.1, 1, 0.84, 10.0),
        result("curve", 16 / 12, 0, 0.897, 130.0),
    ]
    rows = fr.table_rows(fr.aggregate(results), ref_epochs=12)
    body = rows[2:]
    assert body[0].startswith("| reference (whole pool, 12 epochs) | 1 | 3 | 88.70 ± 0.20 | 100.0")
    assert body[1] == "| random | 0.1 | 2 | 83.50 ± 0.71 | 10.0 | 10,000 | 10.00x | 10.00x |"
    assert body[2] == "| random | 0.2 | 1 | 85.00 | 20.0 | 20,000 | 5.00x | 5.00x |"
    assert body[3].startswith("| whole pool, 16 epochs | 1.33 | 1 | 89.70 |")


# --- methods and the plan -------------------------------------------------------------------


def test_method_overrides() -> None:
    ref = fr.Reference(epochs=12, steps_per_epoch=215, reselect_every=1)
    assert fr.full(0.1, ref) == [
        "selector=full",
        "pretrain=none",
        "trainer.max_epochs=2",  # 258 steps: one epoch and a part
        "++trainer.max_steps=258",
    ]
    assert "fraction=0.3" in fr.random_subset(0.3, ref)
    assert "trainer.max_epochs=2" in fr.infobatch(0.1, ref)  # round(1.2 / 0.7)
    assert "trainer.max_epochs=9" in fr.infobatch(0.5, ref)
    assert "dynamic.budget=0.2" in fr.lipt_dynamic(0.2, ref)
    assert fr.lipt_warm(0.2, ref) == [*fr.lipt_dynamic(0.2, ref), "init_from=pretrained"]
    assert fr.paper(0.1, ref)[:1] == ["+approach=grand_lipt"]
    assert set(fr.METHODS) >= {"full", "random", "coverage", "infobatch", "lipt_dynamic", "paper"}


def test_the_main_jobs_default_is_the_frontiers_infobatch_at_its_budget(make_cfg: Any) -> None:
    """`python train.py fraction=b trainer.max_epochs=E_ref` (selector=infobatch, the default)
    trains the frontier's infobatch method: the same epochs and the same InfoBatch node."""
    from lipt.dynamic.plan import infobatch_epochs
    from lipt.run.config import run_of

    ref = fr.Reference(epochs=12, steps_per_epoch=215, reselect_every=1)
    for budget in (0.1, 0.2, 0.3, 0.5):
        default = make_cfg([f"fraction={budget}", f"trainer.max_epochs={ref.epochs}"])
        method = make_cfg(fr.infobatch(budget, ref))
        assert run_of(default).budget_epochs and not run_of(method).budget_epochs
        assert infobatch_epochs(budget, ref.epochs) == method.trainer.max_epochs
        assert default.dynamic == method.dynamic
    # The default at its own budget: 10% of a 15-epoch run is 2 epochs of InfoBatch.
    assert infobatch_epochs(0.1, make_cfg([]).trainer.max_epochs) == 2


def test_the_default_is_chosen_on_validation_not_test() -> None:
    def scored(method: str, seed: int, val: float, test: float) -> dict:
        return {**result(method, 0.1, seed, test, 10.0), "val_accuracy": val}

    results = [
        *reference(),
        scored("infobatch", 0, 0.85, 0.80),  # highest on validation, lowest on test
        scored("infobatch", 1, 0.87, 0.80),
        scored("coverage", 0, 0.84, 0.90),
        scored("coverage", 1, 0.84, 0.90),
    ]
    ranked = fr.highest_on_validation(fr.aggregate(results))[0.1]
    assert [p.method for p in ranked] == ["infobatch", "coverage"]
    assert ranked[0].val_accuracy == pytest.approx(86.0)
    table = "\n".join(fr.validation_rows(fr.aggregate(results)))
    assert "| 0.1 | infobatch 86.00 | coverage 84.00 | 80.00 ± 0.00 | 10.0 |" in table
    # A point with a seed lacking validation (dataset.val_size=0) ranks nowhere.
    assert fr.highest_on_validation(fr.aggregate([*reference(), result("x", 0.1, 0, 0.9, 1)])) == {}


def test_plan_puts_references_first_and_tiny_jigsaw_only_where_it_pretrains() -> None:
    ref = fr.Reference(epochs=2, steps_per_epoch=16, reselect_every=1)
    runs = fr.plan(["full", "coverage"], [0.5], [0, 1], ref, [3], ["B=1"], ["pretrain.x=1"])
    names = [r.name for r in runs]
    assert names == [
        "reference_s0",
        "reference_s1",
        "full_b0.5_s0",
        "coverage_b0.5_s0",
        "curve_e3_s0",
        "full_b0.5_s1",
        "coverage_b0.5_s1",
        "curve_e3_s1",
    ]
    by_name = {r.name: r for r in runs}
    assert "pretrain.x=1" in by_name["coverage_b0.5_s1"].overrides
    assert "pretrain.x=1" not in by_name["full_b0.5_s1"].overrides
    assert by_name["curve_e3_s0"].budget == pytest.approx(1.5)
    assert all(r.overrides[0] == "B=1" and r.overrides[-1] == f"seed={r.seed}" for r in runs)


def test_full_method_anneals_the_cosine_over_its_max_steps(make_cfg: Any) -> None:
    """Lightning's estimated_stepping_batches honours max_steps: the cosine reaches ~0 at the
    last of the shorter run's steps, not at the end of max_epochs whole epochs."""
    import lightning as L
    import torch

    from lipt.run.build import build_classifier, build_datamodule, build_model, build_trainer
    from lipt.run.config import run_of

    ref = fr.Reference(epochs=2, steps_per_epoch=16, reselect_every=1)  # synthetic, batch 32
    overrides = fr.full(0.3, ref)
    assert overrides[2:] == ["trainer.max_epochs=1", "++trainer.max_steps=10"]
    cfg = make_cfg([*FAST, *overrides])
    dm = build_datamodule(run_of(cfg))
    dm.set_subset(None)
    assert math.ceil(len(dm.pool_indices) / cfg.batch_size) == ref.steps_per_epoch

    class Lrs(L.Callback):
        def __init__(self) -> None:
            self.seen: list[float] = []

        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            self.seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    lrs = Lrs()
    module = build_classifier(run_of(cfg), build_model(run_of(cfg), 0))
    trainer = build_trainer(run_of(cfg), logger=False, enable_checkpointing=False, callbacks=[lrs])
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 10
    schedule = trainer.lr_scheduler_configs[0].scheduler
    assert isinstance(schedule, torch.optim.lr_scheduler.CosineAnnealingLR)
    assert schedule.T_max == 10
    assert lrs.seen[0] == pytest.approx(0.1)
    assert lrs.seen[-1] == pytest.approx(0.1 * (1 + math.cos(math.pi * 9 / 10)) / 2)  # step 9 of 10
    assert all(a > b for a, b in zip(lrs.seen, lrs.seen[1:], strict=False))


def test_run_all_skips_finished_runs_and_reruns_changed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = fr.Reference(epochs=2, steps_per_epoch=16, reselect_every=1)
    runs = fr.plan(["random"], [0.5], [0], ref, [], ["B=1"])
    trained: list[str] = []

    def fake_train(run: Any, ref_epochs: int, run_dir: Path) -> dict:
        trained.append(run.name)
        return {
            **result(run.method, run.budget, run.seed, 0.5, 1.0),
            "overrides": list(run.overrides),
        }

    monkeypatch.setattr(fr, "train_one", fake_train)
    results = tmp_path / "runs"
    fr.run_all(runs, 2, results, tmp_path / "work")
    assert trained == ["reference_s0", "random_b0.5_s0"]
    assert json.loads((results / "random_b0.5_s0.json").read_text())["test_accuracy"] == 0.5
    fr.run_all(runs, 2, results, tmp_path / "work")  # all finished: nothing trains
    assert len(trained) == 2
    changed = fr.plan(["random"], [0.5], [0], ref, [], ["B=2"])  # another base override
    fr.run_all(changed[1:], 2, results, tmp_path / "work")
    assert trained[2:] == ["random_b0.5_s0"]
    assert not list(results.glob(".*.tmp"))  # atomic writes leave no temporary file


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "full", "nope"], "unknown method(s) nope"),
        (["--budgets", "0.1", "1.5"], "outside (0, 1]"),
        (["--budgets", "0"], "outside (0, 1]"),
        (["--seeds"], "no seeds"),
        (["--methods"], "no methods"),
        (["--ref-epochs", "0"], "must be positive"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        fr.main([*args, "--small", "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists()


def test_a_method_whose_config_is_not_here_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(fr.NEEDS, "random", "dynamic/not_there.yaml")
    with pytest.raises(SystemExit) as exit_info:
        fr.main(["--methods", "random", "--small", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "random (configs/dynamic/not_there.yaml)" in capsys.readouterr().err


# --- --small end to end ---------------------------------------------------------------------

RESULT_KEYS = {
    "name",
    "method",
    "budget",
    "seed",
    "overrides",
    "ref_epochs",
    "epochs",
    "test_accuracy",
    "seconds",
    "samples",
    "call_seconds",
}


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


@pytest.mark.slow
def test_small_frontier_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "frontier"
    args = ["--small", "--methods", "full", "random", "coverage", "paper", "--out", str(out)]
    first = run_entry("benchmarks/frontier.py", args, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]

    runs_dir = out / "runs" / "ref2"
    expected = ["reference_s0"] + [
        f"{m}_b{b}_s0" for m in ("full", "random", "coverage", "paper") for b in ("0.25", "0.5")
    ]
    paths = {name: runs_dir / f"{name}.json" for name in expected}
    assert sorted(p.name for p in runs_dir.glob("*.json")) == sorted(p.name for p in paths.values())
    results = {name: json.loads(path.read_text()) for name, path in paths.items()}
    for name, r in results.items():
        assert set(r) >= RESULT_KEYS, name
        assert 0 <= r["test_accuracy"] <= 1 and r["seed"] == 0 and r["ref_epochs"] == 2
        assert all(finite(v) for v in r["seconds"].values()), name
        assert all(isinstance(v, int) and v >= 0 for v in r["samples"].values()), name
        assert r["seconds"]["end_to_end"] > 0 and r["samples"]["forward_backward"] > 0
        assert r["seconds"]["end_to_end"] == pytest.approx(
            r["seconds"]["pretrain"] + r["seconds"]["select"] + r["seconds"]["train"], abs=1e-3
        )
    # The whole pool (500 images, batch 32: 16 steps an epoch) for 0.25 of 2 epochs: 8 steps.
    assert results["full_b0.25_s0"]["max_steps"] == 8
    assert results["full_b0.25_s0"]["samples"]["train"] == 8 * 32
    assert results["reference_s0"]["samples"]["train"] == 2 * 500
    # The jigsaw learners' samples are counted where they ran, and only there.
    assert results["coverage_b0.25_s0"]["samples"]["pretrain"] > 0
    assert results["paper_b0.5_s0"]["samples"]["pretrain"] > 0
    assert results["paper_b0.5_s0"]["reselections"] == 1
    assert results["random_b0.5_s0"]["samples"]["pretrain"] == 0

    # The report: every run in frontier.json, the table and the lossless speed-ups from them.
    frontier = json.loads((out / "frontier.json").read_text())
    assert frontier["ref_epochs"] == 2 and frontier["missing"] == []
    assert {"cpu", "cores", "torch"} <= set(frontier["hardware"])
    assert frontier["commit"] and frontier["command"].startswith("python ")
    assert sorted(r["name"] for r in frontier["runs"]) == sorted(expected)
    points = fr.aggregate(list(results.values()))
    md = (out / "frontier.md").read_text()
    for row in [*fr.table_rows(points, 2), *fr.lossless_rows(points)]:
        assert row in md
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A second invocation trains nothing: every run skipped, no file rewritten.
    stamps = {p: p.stat().st_mtime_ns for p in (out / "work").rglob("*") if p.is_file()}
    stamps |= {p: p.stat().st_mtime_ns for p in runs_dir.glob("*.json")}
    second = run_entry("benchmarks/frontier.py", args, timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stderr.count("finished already, skipped") == len(expected)
    assert "Trainer" not in second.stderr + second.stdout
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps

    # --report-only re-renders the same table from the saved results.
    (out / "frontier.md").unlink()
    third = run_entry("benchmarks/frontier.py", [*args, "--report-only"], timeout=120)
    assert third.returncode == 0, third.stderr[-3000:]
    assert fr.table_rows(points, 2)[2] in (out / "frontier.md").read_text()


def test_the_timing_caveat_flags_loaded_runs_but_not_pinned_ones() -> None:
    """A run pinned to one core with one thread pays a one-core rate whatever the other core
    does; the system-wide load average flags only the runs that were not pinned."""
    two_cores = {"cores": 2, "torch_threads": 2, "cores_allowed": 2}
    pinned = {"cores": 2, "torch_threads": 1, "cores_allowed": 1}
    loaded = [3.1, 2.9]
    results = [{**r, "host": pinned, "load_average": loaded} for r in reference(seconds=600.0)] + [
        {**result("full", 0.1, 0, 0.82, 60.0), "host": pinned, "load_average": loaded},
        {**result("full", 0.2, 0, 0.85, 130.0), "host": two_cores, "load_average": loaded},
        {**result("full", 0.3, 0, 0.87, 190.0), "host": two_cores, "load_average": [1.0, 1.2]},
    ]
    assert fr.is_pinned(results[0]) and not fr.is_pinned(results[-1])
    hardware = {"cpu": "cpu", "cores": 2, "accelerator": "no GPU", "torch": "2"}
    meta = {"command": "x", "commit": "c", "hardware": hardware, "ref_epochs": 12}
    text = fr.markdown(meta, fr.aggregate(results), results, [])
    caveat = next(line for line in text.splitlines() if line.startswith("Timing caveat"))
    assert caveat.endswith(": full_b0.2_s0."), caveat  # the loaded run that was not pinned
    assert "4 of 6 runs ran pinned to one core" in text


def test_pinned_runs_with_busy_other_cores_are_flagged() -> None:
    """A pinned run still shares cache and memory: the other cores' busy share during it,
    from /proc/stat, flags it; a quiet pinned run is not flagged."""
    pinned = {"cores": 2, "torch_threads": 1, "cores_allowed": 1}
    results = [{**r, "host": pinned, "other_cores_busy": 0.02} for r in reference(seconds=600.0)]
    results += [
        {**result("full", 0.1, 0, 0.82, 60.0), "host": pinned, "other_cores_busy": 0.9},
        {**result("full", 0.2, 0, 0.85, 130.0), "host": pinned, "other_cores_busy": 0.1},
    ]
    hardware = {"cpu": "cpu", "cores": 2, "accelerator": "no GPU", "torch": "2"}
    meta = {"command": "x", "commit": "c", "hardware": hardware, "ref_epochs": 12}
    text = fr.markdown(meta, fr.aggregate(results), results, [])
    caveats = [line for line in text.splitlines() if line.startswith("Timing caveat")]
    assert caveats == [
        "Timing caveat: 1 of 5 pinned runs had the other cores busy more than 25% of their time "
        "(shared cache and memory inflate a pinned run's seconds, by up to ~40% measured here): "
        "full_b0.1_s0."
    ], caveats
    # the share itself: busy ticks over all ticks of the cores outside the affinity set
    before = {c: (0, 0) for c in range(64)}
    after = {c: (50, 100) for c in range(64)}
    allowed = set(__import__("os").sched_getaffinity(0))
    share = fr.other_cores_busy(before, after)
    assert share == (0.5 if len(allowed) < 64 else None)
