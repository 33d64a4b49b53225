"""lipt.report.sweep on a real tiny sweep (`train.py -m` on the synthetic data set) whose numbers
are recomputed from its summary.json files, and on hand-written sweeps (summary.json in the real
format with the real resolved config) for what a tiny sweep cannot reach: paper-sized numbers
to format, truncated and missing summaries, select-only runs, fraction sweeps."""

from __future__ import annotations

import csv
import functools
import itertools
import json
import math
import shutil
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lipt.report import sweep as sweep_report
from lipt.report import sweep_runs
from lipt.report.frontier_runs import costs
from tests.helpers import CONFIGS, FAST, run_entry

DATASET_TRAIN_SIZE = 60000
PRETRAIN_UNIQUE = 2560
SUBSET = 5500
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
OUTPUT_DIR = "/placeholder/output_dir"  # where the composed config says the run writes

# The accuracies each selector's three seeds reach: the sweep of most tests.
ACCURACIES = {"glister": [0.8431, 0.8392, 0.8517], "random": [0.8012, 0.8127, 0.7954]}


@functools.cache
def _composed(groups: tuple[str, ...]) -> str:
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[*groups, f"paths.output_dir={OUTPUT_DIR}"])
    return json.dumps(OmegaConf.to_container(cfg, resolve=True))


def resolved_config(groups: Sequence[str], output_dir: Path, **top_level: Any) -> dict[str, Any]:
    """The config a run stores in summary.json, resolved as Hydra does. Composing takes a few
    tenths of a second, so it is done once per choice of config groups; top-level keys (seed,
    fraction: nothing interpolates them) and the output dir are filled in afterwards."""
    text = _composed(tuple(groups)).replace(json.dumps(OUTPUT_DIR), json.dumps(str(output_dir)))
    config: dict[str, Any] = json.loads(text)
    assert top_level.keys() <= config.keys()
    return config | top_level


def write_run(
    job_dir: Path,
    groups: Sequence[str],
    accuracy: float | None,
    subset_size: int | None = SUBSET,
    pretrain_unique: int | None = PRETRAIN_UNIQUE,
    **top_level: Any,
) -> None:
    """One job directory of a multirun: .hydra/ and summary.json (stages as lipt writes them)."""
    (job_dir / ".hydra").mkdir(parents=True)
    stages: dict[str, Any] = {}
    if pretrain_unique is not None:
        stages["pretrain"] = {
            "seconds": 3.2,
            "samples": 10 * pretrain_unique,
            "unique_samples": pretrain_unique,
        }
    stages["select"] = {"seconds": 1.1}
    if accuracy is not None:
        size = subset_size or SUBSET
        stages["train"] = {"seconds": 40.0, "samples": 15 * size, "unique_samples": size}
    summary = {
        "test_accuracy": accuracy,
        "train_size": 55000,
        "dataset_train_size": DATASET_TRAIN_SIZE,
        "subset_size": subset_size,
        "stages": stages,
        "config": resolved_config(groups, job_dir, **top_level),
    }
    (job_dir / "summary.json").write_text(json.dumps(summary, indent=2))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """`train.py -m pretrain=jigsaw selector=glister,random seed=0,1,2`: six runs, then a job that
    died while writing (truncated file) and one that died before writing anything."""
    root = tmp_path / "multirun" / "train" / "2024-05-01_12-00-00"
    job = 0
    for selector, accuracies in ACCURACIES.items():
        for seed, accuracy in enumerate(accuracies):
            groups = ["pretrain=jigsaw", f"selector={selector}"]
            write_run(root / str(job), groups, accuracy, seed=seed)
            job += 1
    (root / "6" / ".hydra").mkdir(parents=True)
    (root / "6" / "summary.json").write_text('{"test_accuracy": 0.8, "stages": {"pre')
    (root / "7" / ".hydra").mkdir(parents=True)
    return root


def write_fraction_sweep(root: Path) -> None:
    """The paper's figure 2: `pretrain=none,jigsaw fraction=0.05,0.1,0.3 seed=0,1`."""
    runs = itertools.product(("none", "jigsaw"), (0.05, 0.1, 0.3), (0, 1))
    for job, (pretrain, fraction, seed) in enumerate(runs):
        accuracy = 0.7 + fraction / 2 + (0.03 if pretrain == "jigsaw" else 0) + seed / 100
        unique = PRETRAIN_UNIQUE if pretrain == "jigsaw" else None
        size = int(55000 * fraction)
        groups = [f"pretrain={pretrain}"]
        write_run(root / str(job), groups, accuracy, size, unique, fraction=fraction, seed=seed)


def write_stages(
    job_dir: Path, groups: Sequence[str], stages: dict[str, Any], accuracy: float, **top_level: Any
) -> dict[str, Any]:
    """A job directory whose summary.json holds `stages` as given (stages.clean, stages.score:
    as label cleaning and budget=lipt's scoring pass write them); returns the summary."""
    (job_dir / ".hydra").mkdir(parents=True)
    summary = {
        "test_accuracy": accuracy,
        "train_size": 55000,
        "dataset_train_size": DATASET_TRAIN_SIZE,
        "subset_size": stages["train"].get("unique_samples", 55000),
        "stages": stages,
        "config": resolved_config(groups, job_dir, **top_level),
    }
    (job_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _pretrain(seconds: float) -> dict[str, Any]:
    return {"seconds": seconds, "samples": 5120, "unique_samples": PRETRAIN_UNIQUE}


def _train(seconds: float, size: int) -> dict[str, Any]:
    return {"seconds": seconds, "samples": 12 * size, "unique_samples": size}


def write_stage_sweep(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Two seeds each of: label cleaning by the jigsaw soup (clean=lipt: stages.clean's seconds
    are its own, detection_seconds adds the pre-training it needed), cleanlab's K folds
    (clean=cleanlab: stages.clean trains, samples > 0), budget=lipt's pruned whole pool
    (stages.score: the pool's pass through the soup) and a subset selector (no clean, no score).
    Returns the summaries by clean.name / budget.name."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for seed in (0, 1):
        d = 0.22 * seed  # the seeds' seconds differ: the columns are means
        clean_lipt = {
            "pretrain": _pretrain(3.1 + d),
            "clean": {
                "method": "lipt",
                "action": "drop",
                "flagged": 870,
                "pool": 8192,
                "seconds": 1.9 + d,
                "samples": 0,
                "detection_seconds": round(5.0 + 2 * d, 3),
            },
            "select": {"seconds": 3.15 + d, "diagnostics": {}},
            "train": _train(40.0 + d, 5500),
        }
        cleanlab = {
            "clean": {
                "method": "cleanlab",
                "action": "drop",
                "flagged": 4100,
                "pool": 55000,
                "seconds": 61.5 + d,
                "samples": 220000,  # 5 folds x 4/5 of the pool x 1 epoch
                "detection_seconds": 61.5 + d,
            },
            "train": _train(90.0 + d, 50900),
        }
        budget_lipt = {
            "pretrain": _pretrain(20.3 + d),
            "score": {"seconds": 18.5 + d, "samples": 55000},
            "train": _train(466.0 + d, 55000),
        }
        subset = {
            "pretrain": _pretrain(3.2 + d),
            "select": {"seconds": 1.1 + d},
            "train": _train(40.0 + d, 5500),
        }
        made = [
            ("lipt", ["clean=lipt", "selector=glister", "budget=subset"], clean_lipt),
            ("cleanlab", ["clean=cleanlab", "budget=full_schedule"], cleanlab),
            ("budget_lipt", ["budget=lipt"], budget_lipt),
            ("subset", ["selector=glister", "budget=subset"], subset),
        ]
        for name, groups, stages in made:
            job = root / f"{name},seed={seed}"
            summary = write_stages(job, groups, stages, 0.8 + seed / 100, seed=seed)
            runs.setdefault(name, []).append(summary)
    return runs


def test_report_counts_every_stage_as_the_frontier_does(tmp_path):
    # stages.clean and stages.score are in the stage columns, the total and the training
    # samples, as lipt.report.frontier_runs.costs counts a run's end-to-end cost.
    runs = write_stage_sweep(tmp_path / "sweep")
    out = tmp_path / "out"
    sweep_report.main([str(tmp_path / "sweep"), "--out", str(out), "--baseline", "none"])
    rows = list(csv.DictReader((out / "results.csv").open()))
    stage_columns = [c for c in rows[0] if c.endswith("_seconds") and c != "total_seconds"]
    assert stage_columns == [
        f"{s}_seconds" for s in ("pretrain", "clean", "select", "score", "train")
    ]
    by_group = {
        "lipt": ("lipt", "subset"),
        "cleanlab": ("cleanlab", "full_schedule"),
        "budget_lipt": ("none", "lipt"),
        "subset": ("none", "subset"),
    }
    assert len(rows) == len(by_group)
    for name, (clean, budget) in by_group.items():
        row = next(r for r in rows if (r["clean.name"], r["budget.name"]) == (clean, budget))
        summaries = runs[name]
        seconds = statistics.mean(costs(s)[0] for s in summaries)
        samples = statistics.mean(costs(s)[1] for s in summaries)
        assert float(row["total_seconds"]) == pytest.approx(seconds, abs=1e-9), name
        assert float(row["training_samples"]) == pytest.approx(samples, abs=1e-9), name
        # The total is the sum of the stage columns (a stage a run lacks: blank, counting 0).
        shown = sum(float(row[c]) for c in stage_columns if row[c] != "")
        assert shown == pytest.approx(seconds, abs=1e-9), name
        for stage in ("clean", "score"):
            had = [s["stages"][stage]["seconds"] for s in summaries if stage in s["stages"]]
            value = row[f"{stage}_seconds"]
            if had:
                assert float(value) == pytest.approx(statistics.mean(had), abs=1e-9), name
            else:
                assert value == "", name  # no run of the group had it
    # The reviewer's run: pretrain 3.1 + clean 1.9 + select 3.15 + train 40 on seed 0, not
    # 6.25 + train; clean=lipt's detection_seconds (pre-training included) is not added on top.
    lipt = next(r for r in rows if r["clean.name"] == "lipt")
    assert float(lipt["total_seconds"]) == pytest.approx(48.15 + 4 * 0.11)
    # cleanlab's K-fold models trained 220,000 samples before main training's.
    cleanlab = next(r for r in rows if r["clean.name"] == "cleanlab")
    assert float(cleanlab["training_samples"]) == 220000 + 12 * 50900

    table = (out / "results.md").read_text()
    assert "| pretrain (s) | clean (s) | select (s) | score (s) | train (s) | total (s) |" in table
    assert "| 3.21 | 2.01 | 3.26 | — | 40.1 | 48.6 | 71,120 |" in table  # clean=lipt's row
    assert "total = pretrain + clean + select + score + train." in table
    assert (out / "stage_times.png").read_bytes().startswith(PNG_MAGIC)


def test_columns_of_a_stage_no_run_had_are_left_out(tmp_path):
    # Label cleaning only: a score column would be empty, so there is none; and a sweep of
    # neither keeps the columns (and notes) it always had.
    runs = write_stage_sweep(tmp_path / "sweep")
    for name in ("budget_lipt", "lipt"):
        for job in (tmp_path / "sweep").glob(f"{name},seed=*"):
            shutil.rmtree(job)
    out = tmp_path / "cleaning"
    sweep_report.main([str(tmp_path / "sweep"), "--out", str(out), "--baseline", "none"])
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert "clean_seconds" in header and "score_seconds" not in header
    assert "total = pretrain + clean + select + train." in (out / "results.md").read_text()

    for job in (tmp_path / "sweep").glob("cleanlab,seed=*"):
        shutil.rmtree(job)
    out = tmp_path / "neither"
    sweep_report.main([str(tmp_path / "sweep"), "--out", str(out), "--baseline", "none"])
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert header[-5:] == [
        "pretrain_seconds",
        "select_seconds",
        "train_seconds",
        "total_seconds",
        "training_samples",
    ]
    table = (out / "results.md").read_text()
    assert "| pretrain (s) | select (s) | train (s) | total (s) | training samples |" in table
    assert "total = pretrain + select + train.\n- training samples:" in table
    assert runs["subset"][0]["stages"].keys() == {"pretrain", "select", "train"}


def test_flatten_makes_dotted_keys_and_comparable_lists():
    flat = sweep_runs.flatten({"a": 1, "b": {"c": {"d": "x"}, "e": [0.5]}, "f": {}})
    assert flat == {"a": 1, "b.c.d": "x", "b.e": "[0.5]"}


def test_varying_keys_names_rows_by_the_approach_preset_when_a_sweep_has_one():
    # `+approach=random,glister_full,lipt`: each preset pins pretrain and selector, so those
    # vary too, but only `approach` tells lipt (jigsaw) from its ablations (jigsaw, no prune).
    def config(approach: str, pretrain: str, selector: str, prune: str, seed: int) -> dict:
        tree = {"approach": approach, "pretrain": {"name": pretrain}, "seed": seed}
        return sweep_runs.flatten(tree | {"selector": {"name": selector}, "prune": {"name": prune}})

    presets = [
        ("random", "none", "random", "omp"),
        ("glister_full", "full", "glister", "omp"),
        ("lipt", "jigsaw", "glister", "omp"),
        ("lipt_merge", "jigsaw", "glister", "none"),
    ]
    configs = [config(*preset, seed) for preset in presets for seed in (0, 1)]
    assert sweep_report.varying_keys(configs) == ["approach"]
    configs += [sweep_runs.flatten({**config(*presets[0], 2), "fraction": 0.2})]
    assert sweep_report.varying_keys(configs) == ["approach", "fraction"]


def test_varying_keys_keeps_a_swept_option_of_one_approach():
    # pretrain=none,jigsaw with pretrain.num_learners=5,10 for jigsaw: the option splits runs.
    def config(name: str, learners: int | None, seed: int) -> dict[str, Any]:
        pretrain: dict[str, Any] = {"name": name}
        if learners is not None:
            pretrain |= {"num_learners": learners, "local_epochs": 10}
        return sweep_runs.flatten({"pretrain": pretrain, "seed": seed, "fraction": 0.1})

    configs = [config("none", None, s) for s in (0, 1)]
    configs += [config("jigsaw", n, s) for n in (5, 10) for s in (0, 1)]
    assert sweep_report.varying_keys(configs) == ["pretrain.name", "pretrain.num_learners"]
    rows = sweep_report.aggregate(
        [sweep_runs.Run(Path(f"{i}"), {"stages": {}}, c) for i, c in enumerate(configs)],
        ["pretrain.name", "pretrain.num_learners"],
    )
    keys = [(r["pretrain.name"], r["pretrain.num_learners"], r["runs"]) for r in rows]
    assert keys == [("jigsaw", 5, 2), ("jigsaw", 10, 2), ("none", None, 2)]  # numbers sort as such


def test_load_skips_a_truncated_summary_and_a_job_without_one_with_warnings(sweep):
    runs, warnings = sweep_runs.load_summaries(sweep)
    assert len(runs) == 6
    assert len(warnings) == 2
    assert "6/summary.json: unreadable" in warnings[0]
    assert f"{sweep / '7'}: no summary.json" in warnings[1]


def test_single_runs_and_runs_without_training(tmp_path):
    # A lone run has no std; a select-only run (no pretrain, no train) no accuracy, no data used.
    write_run(tmp_path / "0", ["selector=glister"], 0.85)
    write_run(tmp_path / "1", ["selector=random"], None, subset_size=None, pretrain_unique=None)
    runs, warnings = sweep_runs.load_summaries(tmp_path)
    assert warnings == []
    trained, selected = sweep_report.aggregate(
        runs, sweep_report.varying_keys([r.config for r in runs])
    )
    assert trained["test_acc_pct_mean"] == pytest.approx(85.0)
    assert trained["test_acc_pct_std"] is None
    assert selected["test_acc_pct_mean"] is None
    assert selected["data_used_pct"] == 0.0
    assert (selected["pretrain_seconds"], selected["train_seconds"]) == (None, None)
    assert selected["total_seconds"] == pytest.approx(1.1)
    table = sweep_report.to_markdown([trained, selected], ["selector.name"])
    assert "| glister | 1 | 0 | 85.00 |" in table
    assert "| random | 1 | 0 | — | — | 0.00 | — | 1.10 | — | 1.10 | 0 |" in table


def test_markdown_table_is_formatted(sweep):
    runs, _ = sweep_runs.load_summaries(sweep)
    rows = sweep_report.aggregate(runs, ["selector.name"])
    lines = sweep_report.to_markdown(rows, ["selector.name"]).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| selector.name"))
    assert "| test acc. (%) |" in lines[header]
    assert lines[header + 1].startswith("|:---|---:|")
    glister = np.array(ACCURACIES["glister"]) * 100
    expected = f"{glister.mean():.2f} ± {glister.std(ddof=1):.2f}"
    assert lines[header + 2] == (
        f"| glister | 3 | 0,1,2 | {expected} | 5,500 | 13.43 | 3.20 | 1.10 | 40.0 | 44.3 "
        "| 108,100 |"
    )
    assert lines[header + 3].startswith("| random | 3 |")


def test_main_writes_tables_and_figures_and_warns(sweep, capsys):
    sweep_report.main([str(sweep)])
    out = sweep / "report"
    captured = capsys.readouterr()
    assert "2 groups from 6 runs, grouped by selector.name" in captured.out
    warnings = captured.err.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("warning: skipped ") for w in warnings)
    assert "selector.name" in (out / "results.md").read_text()
    assert len(list(csv.DictReader((out / "results.csv").open()))) == 2
    for name in ("accuracy_vs_data.png", "stage_times.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        assert len(data) > 10_000, name  # axes, bars, text: not a blank canvas


def test_main_plots_a_fraction_sweep_against_fraction(tmp_path):
    write_fraction_sweep(tmp_path)
    out = tmp_path / "out"
    sweep_report.main([str(tmp_path), "--out", str(out), "--x", "fraction"])
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["pretrain.name"], r["fraction"]) for r in rows] == [
        ("jigsaw", "0.05"),
        ("jigsaw", "0.1"),
        ("jigsaw", "0.3"),
        ("none", "0.05"),
        ("none", "0.1"),
        ("none", "0.3"),
    ]
    assert (out / "accuracy_vs_data.png").read_bytes().startswith(PNG_MAGIC)


def test_group_by_overrides_the_detected_keys(sweep, tmp_path, capsys):
    sweep_report.main([str(sweep), "--out", str(tmp_path / "one"), "--group-by", "pretrain.name"])
    rows = list(csv.DictReader((tmp_path / "one" / "results.csv").open()))
    assert [(r["pretrain.name"], r["runs"]) for r in rows] == [("jigsaw", "6")]
    with pytest.raises(SystemExit) as exc:
        sweep_report.main([str(sweep), "--group-by", "selector.nmae"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --group-by: no config key selector.nmae")
    assert "selector.name" in err  # the hint lists the keys that do vary


def test_runs_are_paired_with_random_seed_by_seed(sweep, tmp_path, capsys):
    # selector=glister,random: random is the default baseline; each glister seed minus random's.
    sweep_report.main([str(sweep), "--out", str(tmp_path)])
    assert "paired against selector.name=random" in capsys.readouterr().out
    diffs = [100 * (g - r) for g, r in zip(*ACCURACIES.values(), strict=True)]
    rows = list(csv.DictReader((tmp_path / "paired.csv").open()))
    assert [(r["selector.name"], r["seed"]) for r in rows] == [
        ("glister", str(s)) for s in range(3)
    ]
    assert [float(r["diff_pts"]) for r in rows] == pytest.approx(diffs, abs=1e-9)
    table = (tmp_path / "results.md").read_text()
    assert "## Paired against selector.name=random: same seed\n" in table
    spread = f"{statistics.mean(diffs):+.2f} ± {statistics.stdev(diffs):.2f}"
    per_seed = ", ".join(f"s{k} {d:+.2f}" for k, d in enumerate(diffs))
    assert f"| glister | 3 | {spread} | {per_seed} |" in table
    assert "| random | " not in table.split("## Paired")[1]  # the baseline has no row of its own


def test_pairs_follow_the_other_group_keys_and_the_seeds_both_have(tmp_path):
    # pretrain=none,jigsaw x fraction x seed 0,1: jigsaw is 3 points above none at each fraction
    # and seed, so a pairing across fractions (or seeds) would not give exactly +3.
    sweep = tmp_path / "sweep"
    write_fraction_sweep(sweep)
    none_03_seed1 = next(
        job
        for job in sweep.iterdir()
        if '"name": "none"' in (text := (job / "summary.json").read_text())
        and json.loads(text)["config"]["fraction"] == 0.3
        and json.loads(text)["config"]["seed"] == 1
    )
    (none_03_seed1 / "summary.json").unlink()
    out = tmp_path / "out"
    sweep_report.main([str(sweep), "--out", str(out), "--baseline", "pretrain.name=none"])
    table = (out / "results.md").read_text()
    assert "## Paired against pretrain.name=none: same seed, same fraction" in table
    assert "| jigsaw | 0.05 | 2 | +3.00 ± 0.00 | s0 +3.00, s1 +3.00 |" in table
    assert "| jigsaw | 0.3 | 1 | +3.00 | s0 +3.00 |" in table  # seed 1's baseline is missing


def test_a_seed_run_twice_is_one_pair_at_its_mean(sweep, tmp_path):
    # A second sweep of the same experiment in the folder: glister's seed 0 again, 2 points up.
    write_run(sweep / "again" / "0", ["pretrain=jigsaw", "selector=glister"], 0.8631, seed=0)
    sweep_report.main([str(sweep), "--out", str(tmp_path)])
    rows = list(csv.DictReader((tmp_path / "paired.csv").open()))
    assert [r["seed"] for r in rows] == ["0", "1", "2"]
    first = 100 * ((ACCURACIES["glister"][0] + 0.8631) / 2 - ACCURACIES["random"][0])
    assert float(rows[0]["diff_pts"]) == pytest.approx(first, abs=1e-9)


@pytest.mark.parametrize(
    ("baseline", "message"),
    [
        ("random", "--baseline 'random': write KEY=VALUE"),
        ("selector.nmae=random", "--baseline: selector.nmae is not a group key of this sweep"),
        ("selector.name=craig", "--baseline: no run has selector.name=craig (its values here"),
    ],
)
def test_a_bad_baseline_is_one_line_and_writes_nothing(sweep, tmp_path, capsys, baseline, message):
    with pytest.raises(SystemExit) as exc:
        sweep_report.main([str(sweep), "--out", str(tmp_path / "out"), "--baseline", baseline])
    assert exc.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {message}"), errors
    assert not (tmp_path / "out").exists()


def test_baseline_none_drops_the_paired_table_and_a_stale_paired_csv(sweep, tmp_path):
    sweep_report.main([str(sweep), "--out", str(tmp_path)])
    assert (tmp_path / "paired.csv").is_file()
    sweep_report.main([str(sweep), "--out", str(tmp_path), "--baseline", "none"])
    assert not (tmp_path / "paired.csv").exists()
    assert "Paired" not in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize("make", ["empty", "missing", "only_broken"])
def test_nothing_to_report_is_one_line_and_exit_2(tmp_path, capsys, make):
    target = tmp_path / "sweep"
    if make != "missing":
        target.mkdir()
    if make == "only_broken":
        (target / "summary.json").write_text("{")
    with pytest.raises(SystemExit) as exc:
        sweep_report.main([str(target)])
    assert exc.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(errors) == 1
    assert str(target) in errors[0]
    assert not (target / "report").exists()


def test_command_line_error_has_no_traceback(tmp_path):
    # As a user runs it, from the repository root.
    out = run_entry("-m", ["lipt.report.sweep", str(tmp_path)], timeout=60)
    assert out.returncode == 2
    assert out.stderr == f"error: no readable summary.json under {tmp_path}\n"


# --- a real sweep --------------------------------------------------------------------------

SELECTORS = ("el2n", "random")  # el2n pre-trains (pretrain=full), random needs no model


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory) -> Path:
    """`train.py -m selector=el2n,random seed=0,1` with wandb offline: four jobs, in one process
    (Hydra's basic launcher), as a user runs a sweep."""
    sweep = tmp_path_factory.mktemp("real") / "sweep"
    fast = [o for o in FAST if o not in ("logger=none", "pretrain=none", "budget=infobatch")]
    out = run_entry(
        "train.py",
        [
            "-m",
            *fast,
            "logger=wandb",
            "pretrain=full",
            "pretrain.epochs=1",
            "fraction=0.2",
            f"selector={','.join(SELECTORS)}",
            "seed=0,1",
            f"hydra.sweep.dir={sweep}",
        ],
        env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return sweep


def _by_hand(summaries: list[dict[str, Any]], names: Sequence[str]) -> dict[str, float | None]:
    """The report's columns for one group, from the documented definitions (`names`: the
    sweep's stages: pretrain, select, train and any other a run recorded)."""
    accuracies = [100 * s["test_accuracy"] for s in summaries]
    stages = [s["stages"] for s in summaries]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    seconds = {  # a stage no run of the group had: blank; one some runs lack: 0 for them
        name: mean([st.get(name, {}).get("seconds", 0.0) for st in stages])
        if any(name in st for st in stages)
        else None
        for name in names
    }
    used = [
        100
        * (st.get("pretrain", {}).get("unique_samples", 0) + st["train"]["unique_samples"])
        / s["dataset_train_size"]
        for s, st in zip(summaries, stages, strict=True)
    ]
    trained = ("pretrain", "clean", "train")  # clean: K-fold cleaning's models
    samples = [sum(st.get(name, {}).get("samples", 0) for name in trained) for st in stages]
    return {
        "runs": len(summaries),
        "test_acc_pct_mean": mean(accuracies),
        "test_acc_pct_std": statistics.stdev(accuracies),
        "subset_size": mean([s["subset_size"] for s in summaries]),
        "data_used_pct": mean(used),
        **{f"{name}_seconds": value for name, value in seconds.items()},
        "total_seconds": mean([sum(stage["seconds"] for stage in st.values()) for st in stages]),
        "training_samples": mean(samples),
    }


@pytest.mark.slow
def test_report_of_a_real_sweep_is_recomputed_from_its_summaries(real_sweep, tmp_path):
    jobs = sorted(p for p in real_sweep.iterdir() if (p / ".hydra").is_dir())
    assert len(jobs) == len(SELECTORS) * 2
    groups: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        selector = next(name for name in SELECTORS if f"selector={name}" in overrides)
        groups.setdefault(selector, []).append(json.loads((job / "summary.json").read_text()))
    assert "pretrain" in groups["el2n"][0]["stages"]
    assert "pretrain" not in groups["random"][0]["stages"]

    out = run_entry("-m", ["lipt.report.sweep", str(real_sweep), "--out", str(tmp_path)])
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # nothing skipped
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    # Seeds, output dirs and wandb save dirs differ too; only the selector names the rows.
    assert next(iter(rows[0])) == "selector.name"
    assert [r["selector.name"] for r in rows] == sorted(SELECTORS)
    table = (tmp_path / "results.md").read_text()
    names = {"pretrain", "select", "train"}
    names |= {name for summaries in groups.values() for s in summaries for name in s["stages"]}
    for row in rows:
        expected = _by_hand(groups[row["selector.name"]], sorted(names))
        assert row["seeds"] == "0,1"
        for column, value in expected.items():
            if value is None:
                assert row[column] == "", column
            else:
                assert float(row[column]) == pytest.approx(value, rel=1e-9, abs=1e-9), column
        mean, std = expected["test_acc_pct_mean"], expected["test_acc_pct_std"]
        assert f"| {row['selector.name']} | 2 | 0,1 | {mean:.2f} ± {std:.2f} |" in table
    # el2n paired with random on each seed, from the summaries themselves.
    by_seed = {
        name: {s["config"]["seed"]: 100 * s["test_accuracy"] for s in summaries}
        for name, summaries in groups.items()
    }
    diffs = [by_seed["el2n"][k] - by_seed["random"][k] for k in (0, 1)]
    paired = list(csv.DictReader((tmp_path / "paired.csv").open()))
    assert [(r["selector.name"], r["seed"]) for r in paired] == [("el2n", "0"), ("el2n", "1")]
    assert [float(r["diff_pts"]) for r in paired] == pytest.approx(diffs, abs=1e-9)


def _wandb_records(path: Path) -> list[Any]:
    """The records of an offline .wandb file (LevelDB log framing: 32 KiB blocks, records of a
    7-byte header (crc, length, type) and a payload, split across blocks when long)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, records, pending = path.read_bytes(), 32768, [], b""
    position = 7  # the file header: ":W&B", a magic number and a version
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        length = int.from_bytes(data[position + 4 : position + 6], "little")
        kind = data[position + 6]
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last part of one
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
        elif length == 0 and kind == 0:
            break
    return records


def _wandb_runs(path: Path) -> list[Any]:
    """The run records of an offline .wandb file."""
    return [r.run for r in _wandb_records(path) if r.WhichOneof("record_type") == "run"]


@pytest.mark.slow
def test_each_job_of_a_real_sweep_is_its_own_wandb_run_in_the_sweeps_group(real_sweep):
    run_ids, groups = set(), set()
    for job in sorted(p for p in real_sweep.iterdir() if (p / ".hydra").is_dir()):
        files = list((job / "wandb").glob("offline-run-*/run-*.wandb"))
        assert len(files) == 1, job  # each job logs to a run of its own, in its own folder
        records = _wandb_runs(files[0])
        assert records, files[0]
        run_ids.add(records[0].run_id)
        groups.update(r.run_group for r in records)
    assert len(run_ids) == len(SELECTORS) * 2
    # one group for the whole sweep, named by its folder (lipt.stages.build.sweep_name)
    (group,) = groups
    assert group == str(real_sweep) or real_sweep.as_posix().endswith(f"/{group}"), group


@pytest.mark.slow
def test_each_wandb_run_of_a_real_sweep_stages_its_tables_in_its_own_folder(real_sweep):
    """An offline run's record names the files wandb staged for its tables (subset/classes, the
    report's results), which `wandb sync` uploads: each job's lie in its own folder, and the
    sweep's report run's in the sweep's, so a job synced, moved or kept alone keeps them (all
    of them once landed in the first job's folder)."""
    jobs = sorted(p for p in real_sweep.iterdir() if (p / ".hydra").is_dir())
    for folder in [*jobs, real_sweep]:
        (record_file,) = (folder / "wandb").glob("offline-run-*/run-*.wandb")
        staged = [
            Path(entry.local_path)
            for record in _wandb_records(record_file)
            if record.WhichOneof("record_type") == "artifact"
            for entry in record.artifact.manifest.contents
        ]
        assert staged, record_file  # a job's subset/classes table, the report's results
        for path in staged:
            assert path.is_file(), path
            assert path.is_relative_to(folder / ".cache"), (folder, path)


@pytest.mark.slow
def test_the_sweeps_wandb_report_table_holds_numbers_as_numbers(real_sweep):
    """The "report" run's results table, as wandb wrote it: the figures are numbers a dashboard
    sorts and plots (they were text, "10" before "9"), an unknown one null; seeds and names
    are text. It agrees with results.csv."""
    (table_file,) = (real_sweep / "wandb").glob("offline-run-*/files/media/table/report/*.json")
    table = json.loads(table_file.read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    expected = list(csv.DictReader((real_sweep / "report" / "results.csv").open()))
    assert [r["selector.name"] for r in rows] == [r["selector.name"] for r in expected]
    for row, text in zip(rows, expected, strict=True):
        assert row["seeds"] == "0,1" and row["runs"] == 2
        for column in ("test_acc_pct_mean", "test_acc_pct_std", "train_seconds"):
            assert isinstance(row[column], float) and row[column] == float(text[column])
        assert row["training_samples"] == float(text["training_samples"])
    random_row = next(r for r in rows if r["selector.name"] == "random")
    assert random_row["pretrain_seconds"] is None  # no run of the group pre-trained


def test_a_run_whose_test_accuracy_is_not_a_number_is_skipped_with_a_warning(
    sweep, tmp_path, capsys
):
    """A summary.json with `"test_accuracy": NaN` (json writes it so) stopped the report with a
    traceback from the paired table's std; its group's accuracy read `nan ± nan`. It is skipped
    with a warning, as an unreadable summary is, and the others are reported."""
    groups = ["pretrain=jigsaw", "selector=glister"]
    write_run(sweep / "8", groups, math.nan, seed=3)
    write_run(sweep / "9", ["pretrain=jigsaw", "selector=random"], 0.80, seed=3)
    sweep_report.main([str(sweep), "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert "2 groups from 7 runs, grouped by selector.name" in captured.out
    assert f"warning: skipped {sweep / '8' / 'summary.json'}: its test_accuracy is nan" in (
        captured.err
    )
    rows = {r["selector.name"]: r for r in csv.DictReader((tmp_path / "results.csv").open())}
    glister = 100 * np.array(ACCURACIES["glister"])
    assert float(rows["glister"]["test_acc_pct_mean"]) == pytest.approx(glister.mean())
    assert rows["glister"]["seeds"] == "0,1,2" and rows["random"]["seeds"] == "0,1,2,3"
    paired = list(csv.DictReader((tmp_path / "paired.csv").open()))
    assert [r["seed"] for r in paired] == ["0", "1", "2"]


def test_out_takes_a_frontier_sweeps_frontier_and_leaves_the_sweep_folder_alone(sweep, tmp_path):
    """--out DIR got the tables, but frontier.md, .png and .json were still written into the
    sweep's folder (one the user keeps as it is, e.g. a committed results folder)."""
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n"
        "    _target_: hydra_plugins.lipt_frontier.frontier_sweeper.FrontierSweeper\n"
        "    reference: [+approach=full_data]\n"
    )
    before = sorted(path.name for path in sweep.iterdir())
    out = tmp_path / "out"
    sweep_report.main([str(sweep), "--out", str(out)])
    assert sorted(path.name for path in sweep.iterdir()) == before
    assert {"frontier.md", "frontier.png", "frontier.json", "results.md"} <= {
        path.name for path in out.iterdir()
    }
    assert "| glister | 0.1 | 3 | 84.47 ± 0.64 |" in (out / "frontier.md").read_text()
    sweep_report.main([str(sweep)])  # without --out: beside the sweep, as documented
    assert (sweep / "frontier.md").is_file() and (sweep / "report" / "results.md").is_file()
