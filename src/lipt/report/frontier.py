"""The frontier: test accuracy against end-to-end cost, from a frontier sweep's summary.json files.

`make report SWEEP=multirun/frontier_cpu` (lipt.report.sweep) writes it beside the sweep's
tables when the sweep ran with `hydra/sweeper=frontier` (configs/experiment/frontier_cpu.yaml):
SWEEP/frontier.md, SWEEP/frontier.png and SWEEP/frontier.json. Each job is a point of a method
(its `approach`) at a budget (`fraction`: the share of the reference's cost it was asked for);
the reference is the whole pool for trainer.max_epochs epochs (`approach=full_data`, the
sweeper's `reference`), and its runs at other epochs draw how far the whole pool still climbs.

Cost, per run: end-to-end seconds (summary.json's stages: pre-training + label cleaning +
selection + training, with re-selection and the per-epoch validation inside training; loading
the data and the test pass are not counted) and samples passed forward and backward
(pre-training's + K-fold cleaning's + training's). A sweep over data conditions (wrong labels:
`dataset.label_noise`) gets one frontier per condition, as does a sweep over data sets or models
(`dataset=...`, `model=...`: the sweeper runs a reference for each), a folder of frontier sweeps
whose methods ran different epochs (the 12- and the 36-epoch one) one per epochs, and runs that
cleaned their labels a detection table: precision and recall against the flipped labels, and
the seconds it took. A run whose test accuracy is not a finite number is left out, as a failed
one is.
A method is lossless at a budget when its mean test accuracy is at most LOSSLESS_POINTS below
the reference's; its lossless speed-up is the largest such one. That picks a budget on the test
split, so the report also gives the budget picked on validation (the same rule on mean
validation accuracy) with its test accuracy, the unbiased reading. Methods are compared on the
validation split (never test) per budget, and paired seed by seed against the whole pool on the
same budget's shorter schedule (`full_schedule`), the user's simplest alternative.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from lipt.core.host import BUSY_SHARE, is_busy_beside, is_loaded, is_pinned
from lipt.report.frontier_runs import CURVE, REFERENCE, Record

LOSSLESS_POINTS = 0.3  # a method is lossless within this many points of the reference's mean
WHOLE_POOL = "full_schedule"  # the whole pool's shorter schedule: the user's first alternative
# Its schedules (the cosine, linear decay to zero): each method is paired with the one of higher
# mean validation accuracy at its budget.
WHOLE_POOL_SCHEDULES = (WHOLE_POOL, "full_schedule_linear")


@dataclass(frozen=True)
class Point:
    """One method at one budget, over its seeds: accuracy in %, cost as measured."""

    method: str
    budget: float
    seeds: tuple[int, ...]
    accuracy: float  # mean test accuracy, %
    accuracy_std: float  # sample std over seeds (0 for one seed)
    seconds: float  # mean end-to-end seconds
    seconds_std: float
    samples: float  # mean forward+backward samples
    val_accuracy: float | None = None  # mean validation accuracy, %
    speedup: float | None = None  # the reference's mean seconds / this point's
    sample_speedup: float | None = None


@dataclass(frozen=True)
class Detection:
    """A label-cleaning method at one budget over its seeds: how well it found the wrong labels
    (precision, recall; None where they are not known) and what finding them cost."""

    method: str
    budget: float
    seeds: tuple[int, ...]
    flagged: float
    precision: tuple[float, float] | None  # mean, std
    recall: tuple[float, float] | None
    seconds: tuple[float, float]  # detection seconds, pre-training included


def detections(runs: Sequence[Record]) -> list[Detection]:
    """One Detection per (method, budget) of the runs that cleaned their labels."""
    groups: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    seeds: dict[tuple[str, float], list[int]] = {}
    for r in runs:
        clean = r.summary.get("stages", {}).get("clean")
        if clean:
            groups.setdefault((r.method, r.budget), []).append(clean)
            seeds.setdefault((r.method, r.budget), []).append(r.seed)
    out = []
    for (method, budget), cleans in groups.items():
        known = all("precision" in c for c in cleans)
        out.append(
            Detection(
                method,
                budget,
                tuple(sorted(seeds[method, budget])),
                statistics.fmean(c["flagged"] for c in cleans),
                mean_std([c["precision"] for c in cleans]) if known else None,
                mean_std([c["recall"] for c in cleans]) if known else None,
                mean_std([c["detection_seconds"] for c in cleans]),
            )
        )
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def aggregate(runs: Sequence[Record]) -> list[Point]:
    """One Point per (method, budget), in the order first seen; speed-ups against the
    reference's mean cost where the runs hold a reference."""
    groups: dict[tuple[str, float], list[Record]] = {}
    for r in runs:
        groups.setdefault((r.method, r.budget), []).append(r)
    points = []
    for (method, budget), group in groups.items():
        accuracy, accuracy_std = mean_std([r.test for r in group])
        seconds, seconds_std = mean_std([r.seconds for r in group])
        vals = [r.val for r in group]
        val = None if None in vals else statistics.fmean(v for v in vals if v is not None)
        points.append(
            Point(
                method,
                budget,
                tuple(sorted(r.seed for r in group)),
                accuracy,
                accuracy_std,
                seconds,
                seconds_std,
                statistics.fmean(r.samples for r in group),
                val,
            )
        )
    ref = reference_of(points)
    if ref is None:
        return points
    return [
        replace(p, speedup=ref.seconds / p.seconds, sample_speedup=ref.samples / p.samples)
        for p in points
    ]


def reference_of(points: Sequence[Point]) -> Point | None:
    return next((p for p in points if p.method == REFERENCE), None)


def lossless_speedups(
    points: Sequence[Point], tolerance: float = LOSSLESS_POINTS, on: str = "test"
) -> dict[str, Point | None]:
    """Per method (not the reference or the curve): the point with the largest speed-up whose
    mean accuracy on split `on` ("test" or "validation") is at most `tolerance` points below
    the reference's (above counts too); None where no budget qualifies (or, on validation, the
    runs hold no validation accuracy). On "test" the budget is picked on the test split, so its
    test accuracy is biased up; on "validation" it is not."""
    assert on in ("test", "validation"), on
    ref = reference_of(points)
    if ref is None:
        raise ValueError("no reference among the points: no speed-up to compute")

    def accuracy(p: Point) -> float | None:
        return p.accuracy if on == "test" else p.val_accuracy

    best: dict[str, Point | None] = {}
    for p in points:
        if p.method in (REFERENCE, CURVE):
            continue
        best.setdefault(p.method, None)
        ours, theirs = accuracy(p), accuracy(ref)
        if p.speedup is None or ours is None or theirs is None:
            continue
        if theirs - ours > tolerance + 1e-9:
            continue
        current = best[p.method]
        if current is None or (current.speedup or 0.0) < p.speedup:
            best[p.method] = p
    return best


def highest_on_validation(points: Sequence[Point]) -> dict[float, list[Point]]:
    """Per budget, the methods (not the reference or the curve) by mean validation accuracy,
    highest first: how a default is chosen (never on the test split)."""
    by_budget: dict[float, list[Point]] = {}
    for p in points:
        if p.method not in (REFERENCE, CURVE) and p.val_accuracy is not None:
            by_budget.setdefault(p.budget, []).append(p)
    return {
        budget: sorted(group, key=lambda p: -(p.val_accuracy or 0.0))
        for budget, group in sorted(by_budget.items())
    }


@dataclass(frozen=True)
class Paired:
    """A method's test accuracy minus the whole pool's on the same budget, seed by seed."""

    method: str
    budget: float
    baseline: str  # the whole pool's schedule it is paired with (best_whole_pool)
    seeds: tuple[int, ...]
    difference: float  # mean, points
    difference_std: float
    # The method's trained samples over the baseline's, same seed (mean): a budget is what a
    # method asks for, and methods spend it differently (dropping labels trains fewer samples).
    samples_ratio: float


def best_whole_pool(runs: Sequence[Record]) -> dict[float, str]:
    """Per budget, the whole pool's shorter schedule (WHOLE_POOL_SCHEDULES) of the higher mean
    validation accuracy: chosen on validation, never on test (the cosine where none has one)."""
    by_budget: dict[float, dict[str, list[float]]] = {}
    for r in runs:
        if r.method in WHOLE_POOL_SCHEDULES:
            vals = by_budget.setdefault(r.budget, {}).setdefault(r.method, [])
            vals.append(-math.inf if r.val is None else r.val)
    return {
        budget: max(sorted(methods), key=lambda m: (statistics.fmean(methods[m]), m == WHOLE_POOL))
        for budget, methods in by_budget.items()
    }


def paired_with_whole_pool(runs: Sequence[Record]) -> list[Paired]:
    """Each method and budget against the whole pool's best shorter schedule at that budget
    (best_whole_pool), seed by seed; the seeds that both ran. A seed run more than once (two
    sweeps of one frontier in the folder) counts by the mean of its runs, as one pair, on
    either side: as the points average every run."""
    chosen = best_whole_pool(runs)
    base: dict[tuple[float, int], list[Record]] = {}
    for r in runs:
        if chosen.get(r.budget) == r.method:
            base.setdefault((r.budget, r.seed), []).append(r)
    groups: dict[tuple[str, float], dict[int, list[Record]]] = {}
    for r in runs:
        if r.method not in (chosen.get(r.budget), REFERENCE, CURVE) and (r.budget, r.seed) in base:
            groups.setdefault((r.method, r.budget), {}).setdefault(r.seed, []).append(r)
    out = []
    for (method, budget), by_seed in sorted(groups.items()):
        differences, ratios = [], []
        for seed, mine in by_seed.items():
            theirs = base[budget, seed]
            differences.append(
                statistics.fmean(r.test for r in mine) - statistics.fmean(r.test for r in theirs)
            )
            their_samples = statistics.fmean(r.samples for r in theirs)
            samples = statistics.fmean(r.samples for r in mine)
            ratios.append(samples / their_samples if their_samples else math.nan)
        mean, std = mean_std(differences)
        ratio = statistics.mean(ratios)
        out.append(Paired(method, budget, chosen[budget], tuple(sorted(by_seed)), mean, std, ratio))
    return out


def timing_caveats(runs: Sequence[Record]) -> list[str]:
    """The lines that name the runs whose seconds other work inflated."""
    lines = []
    pinned = [r for r in runs if is_pinned(r.summary)]
    if pinned:
        lines.append(
            f"{len(pinned)} of {len(runs)} runs ran pinned to one core with one torch thread "
            "(`hydra/callbacks=pin`, or `OMP_NUM_THREADS=1 taskset -c 1`); each records how "
            "busy the other cores were during it."
        )
    beside = [r.name for r in pinned if is_busy_beside(r.summary)]
    if beside:
        lines.append(
            f"Timing caveat: {len(beside)} of {len(pinned)} pinned runs had the other cores busy "
            f"more than {BUSY_SHARE:.0%} of their time (shared cache and memory inflate a pinned "
            f"run's seconds, by up to ~40% measured here): {', '.join(sorted(beside))}."
        )
    loaded = [r.name for r in runs if not is_pinned(r.summary) and is_loaded(r.summary)]
    if loaded:
        lines.append(
            f"Timing caveat: {len(loaded)} of {len(runs)} unpinned runs started or ended with a "
            "1-minute load average above the core count (other work shared the machine; their "
            f"seconds are inflated): {', '.join(sorted(loaded))}."
        )
    machines = Counter(machine_of(r.summary) for r in runs)
    if len(machines) > 1:
        counted = "; ".join(f"{n} on {machine}" for machine, n in sorted(machines.items()))
        lines.append(
            f"Timing caveat: the runs were timed on {len(machines)} machines, so their seconds, "
            f"and the speed-ups in seconds, compare only within one machine: {counted}."
        )
    return lines


def machine_of(summary: Mapping[str, Any]) -> str:
    """The machine that timed a run (summary.json's host: CPU, cores, accelerator), not how the
    run used it (threads, pinning)."""
    host = summary.get("host") or {}
    return ", ".join(str(host.get(key, "?")) for key in ("cpu", "cores", "accelerator"))


def to_json(points: Sequence[Point], runs: Sequence[Record], epochs_ref: int) -> dict[str, Any]:
    lossless = lossless_speedups(points) if reference_of(points) else {}
    on_val = lossless_speedups(points, on="validation") if reference_of(points) else {}
    found = detections(runs)
    return {
        **({"detection": [asdict(d) for d in found]} if found else {}),
        "ref_epochs": epochs_ref,
        "lossless_points": LOSSLESS_POINTS,
        "points": [asdict(p) for p in points],
        "lossless": {m: None if p is None else asdict(p) for m, p in lossless.items()},
        "lossless_on_validation": {m: None if p is None else asdict(p) for m, p in on_val.items()},
        "paired": [asdict(p) for p in paired_with_whole_pool(runs)],
        "runs": [{k: v for k, v in asdict(r).items() if k != "summary"} for r in runs],
    }
