"""Tables and figures for a sweep: `python -m lipt.report.sweep SWEEP_DIR` (or
`make report SWEEP=...`).

Reads every run's `summary.json` under SWEEP_DIR (recursively; the format is in docs/DESIGN.md,
"Artifacts"), groups the runs by the config keys that vary across the sweep, averaging over
seeds, and writes to SWEEP_DIR/report/ (or --out):

- `results.md`, `results.csv`: one row per group, sorted by the group keys; `results.md` then
  pairs each group with the baseline (`--baseline`, default the random subset) seed by seed,
  also written to `paired.csv` (lipt.report.paired);
- `accuracy_vs_data.png`: test accuracy against data used, one line per approach (the paper's
  figure 2);
- `stage_times.png`: mean seconds of pre-training, selection and training (and of label
  cleaning and the pool's scoring pass where a run had them), stacked, per group (the paper's
  table 1);
- for a frontier sweep (hydra/sweeper=frontier), `frontier.md`, `frontier.png` and
  `frontier.json` (lipt.report.frontier) in SWEEP_DIR, or in --out where one is given.

How the columns are computed (per run, then over the runs of a group):

- test accuracy: mean and sample standard deviation (ddof=1) in %, over the group's runs that
  report one (null for pretrain- or select-only runs); no std for a single run.
- data used: (pretrain.unique_samples + train.unique_samples) / dataset_train_size, in %, a
  stage that did not run adding 0 (a train stage without unique_samples adds subset_size). It is
  the paper's cost proxy (figure 2: data read by pre-training plus main training): an item read
  by both stages counts twice, as summary.json does not record the overlap, so it can exceed
  100% (pretrain=full) and bounds from above the share of distinct items touched.
- seconds: mean per stage, a stage a run did not have counting 0 (blank when no run of the
  group had it). The columns: pretrain, select and train, and clean (label cleaning, its own
  seconds: the pre-training clean=lipt needs is pretrain's) and score (budget=lipt: the pool's
  pass through the soup) where a run of the sweep recorded them. total = every stage the run
  recorded, as the frontier counts a run's cost (lipt.report.frontier_runs.costs). Re-selection
  time is inside train.
- training samples: pretrain.samples + clean.samples (K-fold cleaning's models) +
  train.samples (samples passed forward and backward; frontier_runs.costs).

Groups: the config is flattened to dotted keys and a key is a group key when its value differs
between runs, except seeds (`seed`, `*_seed`: replicates) and bookkeeping (`paths`, `hydra`,
`logger`, `*_dir`, `*_path`, worker/thread counts, progress bars). Keys implied by others (a
selector's own options when `selector.name` varies) are dropped: see `varying_keys`.
`--group-by KEY ...` sets the keys instead.

A summary.json that cannot be read, or whose test accuracy is not a number (NaN, infinite, text),
is skipped with a warning, as is a job folder without one. `--since TIME` reads only the
summaries written since TIME: a multirun's own, where its sweep folder still holds an earlier
multirun's jobs (Hydra numbers each multirun's job folders from 0, so a second one with fewer
jobs or trials leaves the first one's last folders as they were). Mistakes a user can fix (no such
directory, no summary.json in it, an unknown --group-by key) end with one line on stderr and exit
code 2, as lipt's other commands do.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lipt.core.errors import UserError, fail
from lipt.report.frontier_render import write_frontier
from lipt.report.frontier_runs import costs, reference_approach
from lipt.report.paired import paired_rows, parse_baseline
from lipt.report.render import (
    Row,
    paired_csv,
    paired_markdown,
    plot_accuracy,
    plot_stage_times,
    stage_columns,
    to_csv,
    to_markdown,
)
from lipt.report.sweep_runs import Run, load_summaries

# Stages whose unique_samples count towards "data used" (selection reads data but trains on none;
# label cleaning and scoring record none). Seconds and training samples:
# lipt.report.frontier_runs.costs.
DATA_STAGES = ("pretrain", "train")

# Where and how a run was executed, not what it computed: output dirs differ between every two
# runs, and none of these changes a result.
BOOKKEEPING_SECTIONS = frozenset({"paths", "hydra", "logger"})
BOOKKEEPING_NAMES = frozenset(
    {
        "num_workers",
        "num_threads",
        "download",
        "enable_progress_bar",
        "enable_model_summary",
        "log_every_n_steps",
        "dirpath",  # a checkpoint callback's folder, inside the run folder
    }
)
BOOKKEEPING_SUFFIXES = ("_dir", "_path")

# --- grouping -------------------------------------------------------------------------------


def is_replicate(key: str) -> bool:
    """Seeds: runs that differ only in them are repeats of one experiment."""
    name = key.rsplit(".", 1)[-1]
    return name == "seed" or name.endswith("_seed")


def is_bookkeeping(key: str) -> bool:
    name = key.rsplit(".", 1)[-1]
    return (
        key.split(".", 1)[0] in BOOKKEEPING_SECTIONS
        or name in BOOKKEEPING_NAMES
        or name.endswith(BOOKKEEPING_SUFFIXES)
    )


def _partition_size(configs: Sequence[Mapping[str, Hashable]], keys: Sequence[str]) -> int:
    return len({tuple(config.get(key) for key in keys) for config in configs})


def varying_keys(configs: Sequence[Mapping[str, Hashable]]) -> list[str]:
    """The keys to group runs by: those whose value differs between runs (an absent key counts
    as null), minus seeds and bookkeeping, minus keys implied by the ones already chosen.

    Switching `selector=random,glister` changes `selector.name` and also `selector._target_`,
    `selector.eta`, ...; only the first says something. So candidates are taken in order
    (`*.name` first, then shallow keys before deep ones, then alphabetically) and a key is kept
    only if it splits runs that the keys kept before it put together. `approach` (the row label
    that `+approach=` presets set in the experiment sweeps) comes before all: it names what the
    pretrain, selector, prune, ... options it pins only imply."""
    keys = sorted({key for config in configs for key in config})
    candidates = [
        key
        for key in keys
        if not is_replicate(key)
        and not is_bookkeeping(key)
        and len({config.get(key) for config in configs}) > 1
    ]
    candidates.sort(
        key=lambda key: (key != "approach", key.rsplit(".", 1)[-1] != "name", key.count("."), key)
    )
    chosen: list[str] = []
    for key in candidates:
        if _partition_size(configs, [*chosen, key]) > _partition_size(configs, chosen):
            chosen.append(key)
    return chosen


def check_group_keys(configs: Sequence[Mapping[str, Hashable]], keys: Sequence[str]) -> None:
    """--group-by keys must exist in the configs (a typo would silently make one group)."""
    known = {key for config in configs for key in config}
    unknown = [key for key in keys if key not in known]
    if unknown:
        hint = ", ".join(varying_keys(configs)) or "none"
        raise UserError(
            f"--group-by: no config key {', '.join(unknown)} in these runs "
            f"(dotted keys such as selector.name; the keys that vary here: {hint})"
        )


# --- aggregating ----------------------------------------------------------------------------


def _stage(summary: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    stage = summary["stages"].get(name)
    return stage if isinstance(stage, Mapping) else {}


def sweep_stages(runs: Sequence[Run]) -> tuple[str, ...]:
    """The report's stage columns: pretrain, select and train, and every other stage a run of
    the sweep recorded (clean, score), in pipeline order (lipt.report.render.stage_columns)."""
    return stage_columns(name for run in runs for name in run.summary["stages"])


def run_metrics(
    summary: Mapping[str, Any], stages: Sequence[str] | None = None
) -> dict[str, float | None]:
    """One run's numbers (see the module docstring for the definitions); None where unknown.
    A seconds value per stage of `stages` (default: the report's three and the run's own);
    total seconds and training samples as the frontier counts a run's cost (frontier_runs.costs):
    every stage the run recorded."""
    if stages is None:
        stages = stage_columns(summary["stages"])
    accuracy = summary.get("test_accuracy")
    seconds = {name: _stage(summary, name).get("seconds") for name in stages}
    total_seconds, training_samples = costs(summary)
    unique = 0.0
    for name in DATA_STAGES:
        stage = _stage(summary, name)
        fallback = summary.get("subset_size") if name == "train" and stage else 0
        unique += stage.get("unique_samples", fallback) or 0
    dataset_size = summary.get("dataset_train_size")
    subset_size = summary.get("subset_size")
    return {
        "test_acc_pct": None if accuracy is None else 100.0 * accuracy,
        "subset_size": None if subset_size is None else float(subset_size),
        "data_used_pct": 100.0 * unique / dataset_size if dataset_size else None,
        **{f"{name}_seconds": seconds[name] for name in stages},
        "total_seconds": total_seconds,
        "training_samples": float(training_samples),
    }


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def _count_mean(values: Sequence[float | None]) -> int | float | None:
    """A mean of counts, as an int when whole (5500, not 5500.0, in the CSV)."""
    mean = _mean(values)
    return int(mean) if mean is not None and mean.is_integer() else mean


def _seeds(runs: Sequence[Run]) -> str:
    seeds = {run.config.get("seed") for run in runs} - {None}
    return ",".join(str(s) for s in sorted(seeds, key=_order))


def summarise(runs: Sequence[Run], stages: Sequence[str] | None = None) -> Row:
    """The metric columns (lipt.report.render.metrics) of one group; a seconds column per stage
    of `stages` (default: those of its runs, sweep_stages)."""
    stages = sweep_stages(runs) if stages is None else stages
    per_run = [run_metrics(run.summary, stages) for run in runs]
    accuracies = np.array([m["test_acc_pct"] for m in per_run if m["test_acc_pct"] is not None])
    row: Row = {
        "runs": len(runs),
        "seeds": _seeds(runs),
        "test_acc_pct_mean": float(accuracies.mean()) if accuracies.size else None,
        # Sample std (ddof=1): the seeds are a sample of the runs one could have made.
        "test_acc_pct_std": float(accuracies.std(ddof=1)) if accuracies.size > 1 else None,
    }
    for column in ("subset_size", "training_samples"):
        row[column] = _count_mean([m[column] for m in per_run])
    for column in ("data_used_pct", "total_seconds"):
        row[column] = _mean([m[column] for m in per_run])
    for name in stages:
        seconds = [m[f"{name}_seconds"] for m in per_run]
        had_stage = any(s is not None for s in seconds)
        row[f"{name}_seconds"] = _mean([s or 0.0 for s in seconds]) if had_stage else None
    return row


def _order(value: Any) -> tuple[int, Any]:
    """Sort key for config values of mixed types: null, then numbers, then text."""
    if value is None:
        return (0, 0)
    if isinstance(value, int | float):
        return (1, value)
    return (2, str(value))


def aggregate(
    runs: Sequence[Run], keys: Sequence[str], stages: Sequence[str] | None = None
) -> list[Row]:
    """One row per distinct combination of `keys` values: the keys, then the metrics (a seconds
    column per stage of `stages`, by default every stage a run of the sweep had: sweep_stages);
    sorted by the keys in order."""
    stages = sweep_stages(runs) if stages is None else stages
    groups: dict[tuple[Hashable, ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(run.config.get(key) for key in keys), []).append(run)
    rows = []
    for values in sorted(groups, key=lambda values: [_order(v) for v in values]):
        rows.append({**dict(zip(keys, values, strict=True)), **summarise(groups[values], stages)})
    return rows


# --- the command ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lipt.report.sweep",
        description="Tables (results.md, results.csv) and figures (accuracy_vs_data.png, "
        "stage_times.png) for a sweep: every summary.json under SWEEP_DIR, grouped by the "
        "config keys that vary, averaged over seeds.",
    )
    parser.add_argument("sweep_dir", type=Path, metavar="SWEEP_DIR")
    parser.add_argument(
        "--out",
        type=Path,
        help="output directory (default SWEEP_DIR/report; a frontier sweep's frontier.* files "
        "go to SWEEP_DIR, or here where given)",
    )
    parser.add_argument(
        "--group-by",
        nargs="+",
        action="extend",
        metavar="KEY",
        help="dotted config keys to group by, instead of the ones that vary (e.g. selector.name)",
    )
    parser.add_argument(
        "--x",
        choices=("data_used", "fraction"),
        default="data_used",
        help="x-axis of accuracy_vs_data.png (default: data used, as the paper's figure 2)",
    )
    parser.add_argument(
        "--since",
        type=float,
        metavar="TIME",
        help="only the runs whose summary.json was written at or after TIME (seconds since the "
        "epoch, as `date +%%s` prints): a multirun's own, in a sweep folder an earlier one used",
    )
    parser.add_argument(
        "--baseline",
        metavar="KEY=VALUE",
        help="the group the others are paired against, seed by seed (results.md, paired.csv); "
        "default approach=random or selector.name=random where a group has it; none: no pairing",
    )
    return parser.parse_args(argv)


def write_report(args: argparse.Namespace) -> str:
    """Read the sweep, write the four files; returns the line to print. Raises UserError."""
    runs, warnings = load_summaries(args.sweep_dir, args.since)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not runs:
        raise UserError(f"no readable summary.json under {args.sweep_dir}")
    configs = [run.config for run in runs]
    if args.group_by:
        check_group_keys(configs, args.group_by)
    keys = args.group_by or varying_keys(configs)
    if args.x == "fraction" and "fraction" not in keys:  # before anything is written
        raise UserError("--x fraction: `fraction` is not a group key of this sweep")
    baseline = parse_baseline(args.baseline, configs, keys)
    stages = sweep_stages(runs)
    rows = aggregate(runs, keys, stages)
    out = args.out or args.sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    title = f"Results: {args.sweep_dir} ({len(runs)} runs)"
    markdown = to_markdown(rows, keys, title, stages)
    paired_path = out / "paired.csv"
    if baseline is None:
        paired_path.unlink(missing_ok=True)  # a stale one would describe another report
    else:
        accuracies = [(run.config, run_metrics(run.summary)["test_acc_pct"]) for run in runs]
        paired = paired_rows(accuracies, keys, baseline)
        paired.sort(key=lambda row: [_order(row[key]) for key in keys])
        markdown += "\n" + paired_markdown(paired, keys, baseline)
        paired_path.write_text(paired_csv(paired, keys))
    (out / "results.md").write_text(markdown)
    (out / "results.csv").write_text(to_csv(rows, keys, stages))
    plot_accuracy(rows, keys, out / "accuracy_vs_data.png", x=args.x)
    plot_stage_times(rows, keys, out / "stage_times.png", stages)
    by = ", ".join(keys) or "nothing"
    against = "" if baseline is None else f", paired against {baseline}"
    line = f"{len(rows)} groups from {len(runs)} runs, grouped by {by}{against}: {out}"
    reference = reference_approach(args.sweep_dir)
    if reference is not None:  # a frontier sweep (hydra/sweeper=frontier)
        summaries = [(run.path.parent.name, run.summary) for run in runs]
        line += f"\nfrontier: {write_frontier(args.sweep_dir, summaries, reference, args.out)}"
    return line


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        print(write_report(args))
    except UserError as e:
        fail(str(e))
    except OSError as e:  # e.g. an --out that cannot be written
        fail(f"cannot write the report: {e}")


if __name__ == "__main__":
    main()
