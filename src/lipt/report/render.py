"""A sweep's report rendered from its rows (lipt.report.sweep groups the runs): the tables
(results.md, results.csv) and the figures, test accuracy against data used (the paper's figure
2) and seconds per stage (its table 1). matplotlib is imported when a figure is drawn."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lipt.core.errors import UserError
from lipt.report.paired import Baseline

# A run's stages, in pipeline order (summary.json's `stages`): the order of a report's stage
# columns. Every report has the paper's three (TABLE_STAGES); label cleaning's and the pool's
# scoring pass (budget=lipt) only where a run of the sweep had them; a stage of another name
# after these.
STAGES = ("pretrain", "clean", "select", "score", "train")
TABLE_STAGES = ("pretrain", "select", "train")
Row = dict[str, Any]


def stage_columns(names: Iterable[str] = ()) -> tuple[str, ...]:
    """The stage columns of a report whose runs recorded the stages `names`: TABLE_STAGES and
    every stage in `names`, in pipeline order (STAGES), unknown names last, sorted."""
    present = set(names) | set(TABLE_STAGES)
    return (*(s for s in STAGES if s in present), *sorted(present - set(STAGES)))


def row_stages(rows: Sequence[Row]) -> tuple[str, ...]:
    """The stage columns rows carry (a `{stage}_seconds` value), where the caller names none."""
    return stage_columns(s for s in STAGES if any(f"{s}_seconds" in row for row in rows))


def metrics(stages: Sequence[str] = TABLE_STAGES) -> tuple[str, ...]:
    """The metric columns of a row, in table order (the group keys come first)."""
    return (
        "runs",
        "seeds",
        "test_acc_pct_mean",
        "test_acc_pct_std",
        "subset_size",
        "data_used_pct",
        *(f"{name}_seconds" for name in stages),
        "total_seconds",
        "training_samples",
    )


def value_text(key: str, value: Any) -> str:
    """A group key's value as a table cell or a label shows it."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    if key.endswith("_target_"):  # lipt.models.ConvNet -> ConvNet
        text = text.rsplit(".", 1)[-1]
    return text.replace("|", "\\|")


# --- tables ---------------------------------------------------------------------------------


def to_csv(rows: Sequence[Row], keys: Sequence[str], stages: Sequence[str] | None = None) -> str:
    """Group keys and metrics (one seconds column per stage: `stages`, by default those the rows
    carry) at full precision; empty cells where a value is unknown."""
    columns = [*keys, *metrics(row_stages(rows) if stages is None else stages)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row[c] is None else row[c] for c in columns])
    return buffer.getvalue()


def _number(value: float | None, decimals: int = 1) -> str:
    return "—" if value is None else f"{value:,.{decimals}f}"


def _seconds(value: float | None) -> str:
    # Selection can take hundredths of a second: keep them visible next to the long stages.
    return _number(value, 2 if value is not None and value < 10 else 1)


def _accuracy(row: Row) -> str:
    mean, std = row["test_acc_pct_mean"], row["test_acc_pct_std"]
    if mean is None:
        return "—"
    return f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"


def _stage_cell(name: str) -> Callable[[Row], str]:
    return lambda row: _seconds(row[f"{name}_seconds"])


def markdown_columns(
    stages: Sequence[str] = TABLE_STAGES,
) -> tuple[tuple[str, Callable[[Row], str]], ...]:
    """Markdown columns after the group keys: header and how to show a row's value."""
    return (
        ("runs", lambda r: str(r["runs"])),
        ("seeds", lambda r: r["seeds"] or "—"),
        ("test acc. (%)", _accuracy),
        ("subset", lambda r: _number(r["subset_size"], 0)),
        ("data used (%)", lambda r: _number(r["data_used_pct"], 2)),
        *((f"{name} (s)", _stage_cell(name)) for name in stages),
        ("total (s)", lambda r: _seconds(r["total_seconds"])),
        ("training samples", lambda r: _number(r["training_samples"], 0)),
    )


# The columns of a report without label cleaning or scoring (lipt.run.hydra_callbacks picks some).
MARKDOWN_COLUMNS = markdown_columns()


def markdown_notes(stages: Sequence[str] = TABLE_STAGES) -> str:
    """The notes under the table: how its columns are computed (`stages`: its stage columns)."""
    notes = [
        "- test acc.: mean ± sample standard deviation (ddof=1) over the group's runs (seeds), "
        "in %.",
        "- subset: subset size (mean over runs).",
        "- data used: (pre-training unique samples + main-training unique samples) / size of the",
        "  training split, in %: the paper's cost proxy; an item read by both stages counts twice.",
        "- seconds: mean wall-clock time per stage; a stage a run did not have counts 0, — when "
        "no run",
        f"  of the group had it; total = {' + '.join(stages)}.",
    ]
    if "clean" in stages:
        notes.append(
            "- clean: label cleaning's own seconds (pre-training for clean=lipt is in pretrain)."
        )
    if "score" in stages:
        notes.append(
            "- score: the pool's pass through the soup before pruned training (budget=lipt)."
        )
    if "clean" in stages:
        notes += [
            "- training samples: samples passed forward and backward in pre-training, K-fold label",
            "  cleaning and main training, mean per run.",
        ]
    else:
        notes += [
            "- training samples: samples passed forward and backward in pre-training plus main"
            " training,",
            "  mean per run.",
        ]
    return "\n".join(notes) + "\n"


def to_markdown(
    rows: Sequence[Row],
    keys: Sequence[str],
    title: str = "Results",
    stages: Sequence[str] | None = None,
) -> str:
    """The table (a seconds column per stage: `stages`, by default those the rows carry) and
    its notes."""
    stages = row_stages(rows) if stages is None else stages
    columns = markdown_columns(stages)
    headers = [*keys, *(header for header, _ in columns)]
    # Group keys left-aligned, numbers right-aligned.
    align = [":---"] * len(keys) + ["---:"] * len(columns)
    lines = [f"# {title}", "", "| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    for row in rows:
        cells = [value_text(key, row[key]) for key in keys]
        cells += [show(row) for _, show in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + markdown_notes(stages)


def _signed(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "—"
    return f"{mean:+.2f}" if std is None else f"{mean:+.2f} ± {std:.2f}"


def paired_markdown(rows: Sequence[Row], keys: Sequence[str], baseline: Baseline) -> str:
    """The paired table (lipt.report.paired.paired_rows): per group, the seeds paired with the
    baseline, the mean ± std of the differences and each seed's difference, in points."""
    others = [key for key in keys if key != baseline.key]
    headers = [*keys, "pairs", f"vs {baseline} (points)", "per seed"]
    align = [":---"] * len(keys) + ["---:", "---:", ":---"]
    same = "same seed" + (f", same {', '.join(others)}" if others else "")
    lines = [
        f"## Paired against {baseline}: {same}",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(align) + "|",
    ]
    for row in rows:
        per_seed = ", ".join(f"s{seed} {diff:+.2f}" for seed, diff in row["per_seed"].items())
        cells = [value_text(key, row[key]) for key in keys]
        cells += [str(row["pairs"]), _signed(row["diff_mean"], row["diff_std"]), per_seed or "—"]
        lines.append("| " + " | ".join(cells) + " |")
    notes = (
        "- each seed's test accuracy minus the baseline's with the same seed (and the same values"
        " of the other group keys), in points; mean ± sample std (ddof=1) over the pairs.\n"
    )
    return "\n".join(lines) + "\n\n" + notes


def paired_csv(rows: Sequence[Row], keys: Sequence[str]) -> str:
    """One line per group and seed: the group keys, the seed and its paired difference."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*keys, "seed", "diff_pts"])
    for row in rows:
        for seed, diff in row["per_seed"].items():
            writer.writerow([*("" if row[k] is None else row[k] for k in keys), seed, diff])
    return buffer.getvalue()


# --- figures ---------------------------------------------------------------------------------


def row_label(row: Row, keys: Sequence[str]) -> str:
    """`pretrain=jigsaw, selector=glister` (a `.name` key by its group's name), or `all runs`."""
    parts = [
        f"{key.removesuffix('.name')}={value_text(key, row[key])}" for key in keys if key in row
    ]
    return ", ".join(parts) or "all runs"


def new_figure(
    width: float, height: float, layout: Literal["constrained"] | None = "constrained"
) -> Any:
    # An Agg canvas on a bare Figure: no pyplot, no global backend switch, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout=layout)
    FigureCanvasAgg(figure)
    return figure


def plot_accuracy(
    rows: Sequence[Row], keys: Sequence[str], path: Path, x: str = "data_used"
) -> None:
    """Test accuracy (mean, with a ± std band and error bars) against data used (`x`:
    "data_used") or the subset fraction ("fraction"), one line per approach: the group keys
    other than `fraction`, which moves along the x-axis."""
    if x == "fraction" and "fraction" not in keys:
        raise UserError("--x fraction: `fraction` is not a group key of this sweep")
    series_keys = [key for key in keys if key != "fraction"]
    series: dict[str, list[tuple[float, float, float]]] = {}
    for row in rows:
        if x == "data_used":
            x_value = row["data_used_pct"]
        else:
            x_value = None if row.get("fraction") is None else 100.0 * row["fraction"]
        if row["test_acc_pct_mean"] is None or x_value is None:
            continue  # no training in these runs: nothing to plot
        std = row["test_acc_pct_std"] or 0.0
        series.setdefault(row_label(row, series_keys), []).append(
            (x_value, row["test_acc_pct_mean"], std)
        )

    figure = new_figure(8, 5)
    ax = figure.add_subplot()
    for index, (label, points) in enumerate(series.items()):
        xs, means, stds = (np.array(column) for column in zip(*sorted(points), strict=True))
        color = f"C{index % 10}"
        ax.errorbar(
            xs, means, yerr=stds, marker="o", capsize=3, color=color, label=label, linewidth=1.5
        )
        if len(xs) > 1:
            ax.fill_between(xs, means - stds, means + stds, color=color, alpha=0.15, linewidth=0)
    if not series:
        message = "no run in this sweep reports a test accuracy"
        ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    if x == "data_used":
        ax.set_xlabel("Data used (% of the training split: pre-training + subset)")
        ax.set_title("Test accuracy vs data used (mean ± std over seeds)")
    else:
        ax.set_xlabel("Subset fraction (% of the training pool)")
        ax.set_title("Test accuracy vs subset fraction (mean ± std over seeds)")
    ax.set_ylabel("Test accuracy (%)")
    ax.grid(alpha=0.3)
    if series:
        # Beside the axes when there are many lines, so the legend never hides one.
        outside = len(series) > 6
        ax.legend(
            fontsize="small",
            loc="upper left" if outside else "best",
            bbox_to_anchor=(1.02, 1.0) if outside else None,
        )
    figure.savefig(path, dpi=120)


def plot_stage_times(
    rows: Sequence[Row], keys: Sequence[str], path: Path, stages: Sequence[str] | None = None
) -> None:
    """Horizontal bars, one per group in table order: the mean seconds of each stage (`stages`,
    by default those the rows carry: pretrain, select and train, and clean and score where a run
    had them) stacked, the total written at the end."""
    stages = row_stages(rows) if stages is None else stages
    labels = [f"{row_label(row, keys)} (n={row['runs']})" for row in rows]
    figure = new_figure(9, max(2.8, 0.45 * len(rows) + 1.6))
    ax = figure.add_subplot()
    positions = np.arange(len(rows))
    left = np.zeros(len(rows))
    for index, name in enumerate(stages):
        seconds = np.array([row[f"{name}_seconds"] or 0.0 for row in rows])
        ax.barh(positions, seconds, left=left, color=f"C{index}", label=name, height=0.6)
        left += seconds
    for position, total in zip(positions, left, strict=True):
        ax.text(total, position, f" {total:,.1f} s", va="center", fontsize="small")
    ax.set_xlim(0, max(float(left.max(initial=0.0)), 1e-9) * 1.15)  # room for the totals
    ax.set_yticks(positions, labels)
    ax.invert_yaxis()  # first row on top, as in the table
    ax.set_xlabel("Mean wall-clock seconds per run")
    ax.set_title("Time per stage (mean over seeds)")
    ax.grid(axis="x", alpha=0.3)
    # Below the axes: inside, it would cover the longest bars.
    ncols = min(len(stages), 6)
    figure.legend(loc="outside lower center", ncols=ncols, fontsize="small", frameon=False)
    figure.savefig(path, dpi=120)
