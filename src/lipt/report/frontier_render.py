"""frontier.md, frontier.png and frontier.json of a frontier sweep (lipt.report.frontier has
the numbers; this module only lays them out)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lipt.core.artifacts import atomic_write_bytes, write_json
from lipt.report.frontier import (
    LOSSLESS_POINTS,
    WHOLE_POOL,
    WHOLE_POOL_SCHEDULES,
    Detection,
    Paired,
    Point,
    aggregate,
    detections,
    highest_on_validation,
    lossless_speedups,
    paired_with_whole_pool,
    reference_of,
    timing_caveats,
    to_json,
)
from lipt.report.frontier_runs import CURVE, REFERENCE, Record, by_condition, by_epochs, records


def accuracy_text(p: Point) -> str:
    return f"{p.accuracy:.2f} ± {p.accuracy_std:.2f}" if len(p.seeds) > 1 else f"{p.accuracy:.2f}"


def label_of(p: Point, epochs_ref: int) -> tuple[str, str]:
    if p.method == REFERENCE:
        return f"reference (whole pool, {epochs_ref} epochs)", "1"
    if p.method == CURVE:
        return f"whole pool, {round(p.budget * epochs_ref)} epochs", f"{p.budget:.2f}"
    return p.method, f"{p.budget:g}"


def markdown_table(header: Sequence[str], align: str, rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table; `align` has one letter per column: l(eft) or r(ight)."""
    rule = "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"
    return ["| " + " | ".join(header) + " |", rule, *("| " + " | ".join(r) + " |" for r in rows)]


def table_rows(points: Sequence[Point], epochs_ref: int) -> list[str]:
    """The reference first, then each method by budget, the curve last."""
    ordered = sorted(
        points, key=lambda p: (p.method != REFERENCE, p.method == CURVE, p.method, p.budget)
    )
    header = ["method", "budget", "seeds", "test acc. (%)", "val. acc. (%)", "end-to-end (s)",
              "samples (fwd+bwd)", "speed-up (s)", "speed-up (samples)"]  # fmt: skip
    rows = []
    for p in ordered:
        label, budget = label_of(p, epochs_ref)
        val = "-" if p.val_accuracy is None else f"{p.val_accuracy:.2f}"
        speedup = "-" if p.speedup is None else f"{p.speedup:.2f}x"
        by_samples = "-" if p.sample_speedup is None else f"{p.sample_speedup:.2f}x"
        rows.append([label, budget, str(len(p.seeds)), accuracy_text(p), val,
                     f"{p.seconds:.1f}", f"{p.samples:,.0f}", speedup, by_samples])  # fmt: skip
    return markdown_table(header, "lrrrrrrrr", rows)


def lossless_rows(points: Sequence[Point]) -> list[str]:
    header = ["method", f"lossless speed-up (within {LOSSLESS_POINTS} points)", "at budget",
              "test acc. (%)"]  # fmt: skip
    rows = [
        [method, "none", "-", "-"]
        if p is None
        else [method, f"{p.speedup:.2f}x", f"{p.budget:g}", accuracy_text(p)]
        for method, p in lossless_speedups(points).items()
    ]
    return markdown_table(header, "lrrr", rows)


def lossless_validation_rows(points: Sequence[Point]) -> list[str]:
    """The budget each method is lossless at by validation accuracy, and its test accuracy."""
    header = ["method", f"lossless speed-up (within {LOSSLESS_POINTS} points on validation)",
              "at budget", "val. acc. (%)", "its test acc. (%)"]  # fmt: skip
    rows = []
    for method, p in lossless_speedups(points, on="validation").items():
        if p is None:
            rows.append([method, "none", "-", "-", "-"])
        else:
            speedup, val = f"{p.speedup:.2f}x", f"{p.val_accuracy:.2f}"
            rows.append([method, speedup, f"{p.budget:g}", val, accuracy_text(p)])
    return markdown_table(header, "lrrrr", rows)


def validation_rows(points: Sequence[Point]) -> list[str]:
    header = ["budget", "highest on validation (%)", "second (%)", "its test acc. (%)",
              "its seconds"]  # fmt: skip
    rows = []
    for budget, ranked in highest_on_validation(points).items():
        first = ranked[0]
        second = f"{ranked[1].method} {ranked[1].val_accuracy:.2f}" if len(ranked) > 1 else "-"
        rows.append([f"{budget:g}", f"{first.method} {first.val_accuracy:.2f}", second,
                     accuracy_text(first), f"{first.seconds:.1f}"])  # fmt: skip
    return markdown_table(header, "rllrr", rows)


def paired_rows(pairs: Sequence[Paired]) -> list[str]:
    header = ["method", "budget", "seeds", "paired with",
              "test acc. minus its, same seed (points)", "samples trained / its"]  # fmt: skip
    rows = []
    for p in pairs:
        spread = f" ± {p.difference_std:.2f}" if len(p.seeds) > 1 else ""
        rows.append([p.method, f"{p.budget:g}", str(len(p.seeds)), p.baseline,
                     f"{p.difference:+.2f}{spread}", f"{p.samples_ratio:.2f}"])  # fmt: skip
    return markdown_table(header, "lrrlrr", rows)


def detection_rows(found: Sequence[Detection]) -> list[str]:
    def text(pair: tuple[float, float] | None, digits: int = 3) -> str:
        return "" if pair is None else f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}"

    header = ["method", "budget", "seeds", "flagged", "precision", "recall", "detection s"]
    rows = [
        [
            d.method,
            f"{d.budget:g}",
            str(len(d.seeds)),
            f"{d.flagged:,.0f}",
            text(d.precision),
            text(d.recall),
            text(d.seconds, 1),
        ]
        for d in found
    ]
    return markdown_table(header, "lrrrrrr", rows)


def section(points: Sequence[Point], runs: Sequence[Record], epochs_ref: int) -> list[str]:
    """One condition's frontier: the table, the lossless speed-ups, the pairing with the whole
    pool, the choice on validation and, where runs cleaned labels, their detection."""
    ref = reference_of(points)
    lines = [*table_rows(points, epochs_ref)]
    repeated = [
        " at ".join(label_of(p, epochs_ref)) for p in points if len(set(p.seeds)) < len(p.seeds)
    ]
    if repeated:
        lines += [
            "",
            f"Caveat: {len(repeated)} of {len(points)} points ran a seed more than once and "
            "average its runs (their seeds column counts runs): the folder holds a sweep twice, "
            "or the sweep varied a setting these points mix (one other than the data set, the "
            f"model, the labels and the epochs, which get frontiers of their own): "
            f"{', '.join(repeated)}.",
        ]
    if ref is not None:
        floor = ref.accuracy - LOSSLESS_POINTS
        ref_val = ref.val_accuracy
        lines += [
            "",
            f"Lossless: the largest speed-up whose mean test accuracy is at least {floor:.2f}% "
            f"(the reference's {ref.accuracy:.2f}% less {LOSSLESS_POINTS} points). The budget "
            "is read off the test split, so its accuracy is an optimistic one"
            + ("." if ref_val is None else "; the next table picks it on validation."),
            "",
            *lossless_rows(points),
        ]
        if ref_val is not None:
            lines += [
                "",
                "Lossless chosen on validation: the largest speed-up whose mean validation "
                f"accuracy is at least {ref_val - LOSSLESS_POINTS:.2f}% (the "
                f"reference's {ref_val:.2f}% less {LOSSLESS_POINTS} points), and its "
                "test accuracy, which may fall short of the test floor above.",
                "",
                *lossless_validation_rows(points),
            ]
    pairs = paired_with_whole_pool(runs)
    if pairs:
        lines += [
            "",
            "Paired with the whole pool on the same budget's shorter schedule, seed by seed: "
            f"the schedule ({', '.join(WHOLE_POOL_SCHEDULES)}) of the higher mean validation "
            "accuracy at that budget; mean ± std of the differences.",
            "",
            *paired_rows(pairs),
        ]
    if highest_on_validation(points):
        lines += [
            "",
            "The method highest on the validation split at each budget (chosen on "
            "validation alone):",
            "",
            *validation_rows(points),
        ]
    found = detections(runs)
    if found:
        lines += [
            "",
            "Label cleaning: the labels each cleaner flagged, precision and recall against the "
            "flipped labels (mean ± std over seeds), and the seconds finding them took "
            "(pre-training included).",
            "",
            *detection_rows(found),
        ]
    return lines


# One frontier of a sweep: its points, its runs and its reference's epochs (E_ref), by title
# (its data condition and, where the methods ran several, its epochs; "" for a plain sweep).
Frontiers = dict[str, tuple[list[Point], list[Record], int]]


def markdown(sweep_dir: Path, frontiers: Frontiers) -> str:
    every = list({id(r.summary): r for _, runs, _ in frontiers.values() for r in runs}.values())
    epochs = sorted({e for _, _, e in frontiers.values()})
    reference = (
        f"the whole pool, {epochs[0]} epochs"
        if len(epochs) == 1
        else f"the whole pool, at each frontier's epochs ({', '.join(map(str, epochs))})"
    )
    lines = [
        "# Frontier: test accuracy against end-to-end cost",
        "",
        f"`make report SWEEP={sweep_dir}`: {len(every)} finished runs. Reference: {reference}. "
        "Budgets are shares of the reference's cost asked for; the costs are measured. "
        "Accuracy: mean ± sample std over seeds.",
    ]
    for title, (points, runs, epochs_ref) in frontiers.items():
        if len(frontiers) > 1 or title:
            lines += ["", f"## {title or 'labels as given'}"]
        lines += ["", *section(points, runs, epochs_ref)]
    lines += [
        "",
        "Cost. End-to-end seconds: summary.json's stages, pre-training + label cleaning + "
        "selection (or the soup's scoring) + training (re-selection and the per-epoch "
        "validation run inside training); loading the data and the test pass are not counted. "
        "Samples: passed forward and backward, pre-training's + K-fold cleaning's + training's; "
        "the forward-only passes of selection, of label cleaning and of the jigsaw merge's "
        "held-out scoring are not counted (their time is "
        "in the seconds).",
    ]
    for caveat in timing_caveats(every):
        lines += ["", caveat]
    return "\n".join(lines) + "\n"


def plot(
    points: Sequence[Point],
    epochs_ref: int,
    path: Path,
    condition: str = "",
    found: Sequence[Detection] = (),
) -> None:
    """The frontier; beside it, where runs cleaned labels with known flips (`found`), each
    cleaner's precision and recall against its detection seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [d for d in found if d.precision is not None and d.recall is not None]
    if scored:
        fig, (ax, right) = plt.subplots(1, 2, figsize=(13, 5.5), width_ratios=[8, 5])
        plot_detection(right, scored)
    else:
        fig, ax = plt.subplots(figsize=(8, 5.5))
    ref = reference_of(points)
    if ref is not None:
        ax.axhspan(
            ref.accuracy - ref.accuracy_std,
            ref.accuracy + ref.accuracy_std,
            color="0.85",
            label=f"reference ({epochs_ref} epochs) ± std",
        )
        ax.axhline(ref.accuracy - LOSSLESS_POINTS, color="0.5", ls=":", lw=1,
                   label=f"reference - {LOSSLESS_POINTS} points")  # fmt: skip
        ax.errorbar([ref.seconds], [ref.accuracy], xerr=[ref.seconds_std],
                    yerr=[ref.accuracy_std], fmt="*", ms=12, color="black", capsize=3)  # fmt: skip
    whole = {WHOLE_POOL, REFERENCE, CURVE}  # the whole pool's curve: one line through them all
    lines = {
        f"{WHOLE_POOL} (whole pool, shorter schedule)": [p for p in points if p.method in whole]
    }
    for method in dict.fromkeys(p.method for p in points):
        if method not in whole:
            lines[method] = [p for p in points if p.method == method]
    for label, group in lines.items():
        group = sorted(group, key=lambda p: p.budget)  # by budget: noisy costs cross
        if group:
            ax.errorbar(
                [p.seconds for p in group],
                [p.accuracy for p in group],
                xerr=[p.seconds_std for p in group],
                yerr=[p.accuracy_std for p in group],
                marker="o",
                capsize=3,
                label=label,
            )
    ax.set_xlabel("end-to-end seconds (pre-training + selection + training), mean over seeds")
    ax.set_ylabel("test accuracy (%)")
    where = f"{condition}; " if condition else ""
    ax.set_title(f"Test accuracy against end-to-end cost ({where}reference: the whole pool, "
                 f"{epochs_ref} epochs)", fontsize=10)  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def plot_detection(ax: Any, found: Sequence[Detection]) -> None:
    """Precision (circles) and recall (squares) against detection seconds, one colour per
    cleaner, its budgets pooled (a seed's flags do not depend on the budget)."""
    by_method: dict[str, list[Detection]] = {}
    for d in found:
        by_method.setdefault(d.method, []).append(d)
    for i, (method, rows) in enumerate(sorted(by_method.items())):
        colour = f"C{i}"
        seconds = [d.seconds for d in rows]
        for value, marker, what in ((lambda d: d.precision, "o", "precision"),
                                    (lambda d: d.recall, "s", "recall")):  # fmt: skip
            ax.errorbar(
                [m for m, _ in seconds],
                [value(d)[0] for d in rows],
                xerr=[sd for _, sd in seconds],
                yerr=[value(d)[1] for d in rows],
                fmt=marker,
                color=colour,
                capsize=3,
                label=f"{method}: {what}",
            )
    ax.set_xlabel("detection seconds (pre-training included), mean over seeds")
    ax.set_ylabel("against the flipped labels")
    ax.set_title("Label cleaning: precision and recall against cost", fontsize=10)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")


def slug(condition: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in condition.replace("%", "pct")).strip("_")


def write_frontier(
    sweep_dir: Path,
    summaries: Sequence[tuple[str, dict]],
    reference: str,
    out: Path | None = None,
) -> Path:
    """frontier.md, frontier.png and frontier.json of the sweep in `sweep_dir`, written to `out`
    (default: `sweep_dir`): one frontier per data condition, data set and model and, where the
    methods ran several numbers of epochs, per epochs (frontier_<title>.png where the sweep has
    several); returns the Markdown's path."""
    out = sweep_dir if out is None else out
    frontiers: Frontiers = {}
    for condition, group in by_condition(summaries).items():
        split = by_epochs(group, reference)
        for epochs, runs_at in split.items():
            runs, epochs_ref = records(runs_at, reference, epochs)
            at = f"{epochs_ref} epochs" if len(split) > 1 else ""
            title = ", ".join(part for part in (condition, at) if part)
            frontiers[title] = (aggregate(runs), runs, epochs_ref)
    path = out / "frontier.md"
    atomic_write_bytes(path, markdown(sweep_dir, frontiers).encode())
    payload = {t or "labels as given": to_json(p, r, e) for t, (p, r, e) in frontiers.items()}
    write_json(
        out / "frontier.json", next(iter(payload.values())) if len(payload) == 1 else payload
    )
    for title, (points, runs, epochs_ref) in frontiers.items():
        if points:
            name = "frontier.png" if len(frontiers) == 1 else f"frontier_{slug(title)}.png"
            plot(points, epochs_ref, out / name, title, detections(runs))
    return path
