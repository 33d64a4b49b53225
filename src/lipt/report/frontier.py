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
the reference's; its lossless speed-up is the largest such one. Methods are compared on the
validation split (never test) per budget, and paired seed by seed against the whole pool on the
same budget's shorter schedule (`full_schedule`), the user's simplest alternative.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeGuard

from lipt.core.host import BUSY_SHARE, is_busy_beside, is_loaded, is_pinned

LOSSLESS_POINTS = 0.3  # a method is lossless within this many points of the reference's mean
REFERENCE = "reference"  # the reference's method name in the tables
CURVE = "curve"  # the whole pool at other epochs than the reference's
WHOLE_POOL = "full_schedule"  # the whole pool's shorter schedule: the user's first alternative
# Its schedules (the cosine, linear decay to zero): each method is paired with the one of higher
# mean validation accuracy at its budget.
WHOLE_POOL_SCHEDULES = (WHOLE_POOL, "full_schedule_linear")
FRONTIER_SWEEPER = "FrontierSweeper"


@dataclass(frozen=True)
class Record:
    """One job of the sweep, as the frontier sees it."""

    name: str  # its job folder
    method: str
    budget: float  # the share of the reference's cost asked for
    seed: int
    test: float  # %
    val: float | None  # %
    seconds: float  # end to end
    samples: int  # forward + backward
    summary: Mapping[str, Any]


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


def reference_approach(sweep_dir: Path) -> str | None:
    """The reference's approach if a frontier sweeper ran a sweep under `sweep_dir` (its
    multirun.yaml), else None: not a frontier."""
    import yaml

    for path in sorted(sweep_dir.rglob("multirun.yaml")):
        sweeper = (yaml.safe_load(path.read_text()) or {}).get("hydra", {}).get("sweeper") or {}
        if str(sweeper.get("_target_", "")).endswith(FRONTIER_SWEEPER):
            overrides = [str(o) for o in sweeper.get("reference", [])]
            approaches = [
                o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("approach=")
            ]
            return approaches[0] if approaches else "full_data"
    return None


def costs(summary: Mapping[str, Any]) -> tuple[float, int]:
    """End-to-end seconds (every stage that ran: pretrain, clean, select, score, train) and
    forward+backward samples (pretrain + clean + train) of one run."""
    stages = summary["stages"]
    seconds = sum(float(stage.get("seconds") or 0) for stage in stages.values())
    trained = ("pretrain", "clean", "train")  # clean: K-fold cleaning's models
    samples = sum(int(stages.get(name, {}).get("samples") or 0) for name in trained)
    return round(seconds, 3), samples


# The method of a job that trains a saved subset (subset_path): whatever selected it.
SAVED_SUBSET = "subset_path"


def method_of(config: dict[str, Any]) -> str:
    """A job's method where it names no approach: a saved subset's (subset_path, which stands
    in for the selector and a whole-pool budget), its selector's name, or, where it selects
    nothing (selector=none), its budget's."""
    if config.get("subset_path"):
        return SAVED_SUBSET
    selector = (config.get("selector") or {}).get("name")
    return str(selector if selector not in (None, "none") else config["budget"]["name"])


def approach_of(config: Mapping[str, Any]) -> str:
    """A job's method as the sweep named it: its `approach`, else `method_of`."""
    return str(config.get("approach") or method_of(dict(config)))


def epochs_of(summary: Mapping[str, Any]) -> int:
    return int(summary["config"]["trainer"]["max_epochs"])


def finite(value: Any) -> TypeGuard[float]:
    """A number that is not NaN or infinite (nor a bool): an accuracy a mean can be taken of."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def finished(summary: Mapping[str, Any]) -> bool:
    """A run that trained and tested: its test accuracy is a finite number."""
    return finite(summary.get("test_accuracy"))


def records(
    summaries: Sequence[tuple[str, Mapping[str, Any]]],
    reference: str,
    epochs_ref: int | None = None,
) -> tuple[list[Record], int]:
    """Each finished job as a Record, and E_ref (`epochs_ref`, by default the epochs most jobs
    were configured with: the reference's). The reference's jobs at other epochs are the whole
    pool's curve."""
    runs = [(n, s) for n, s in summaries if finished(s)]
    if epochs_ref is None:
        ref_epochs = Counter(epochs_of(s) for _, s in runs).most_common(1)
        epochs_ref = ref_epochs[0][0] if ref_epochs else 1
    out = []
    for name, summary in runs:
        config = summary["config"]
        method = approach_of(config)
        budget = float(config["fraction"])
        if method == reference:
            epochs = int(config["trainer"]["max_epochs"])
            method, budget = (
                (REFERENCE, 1.0) if epochs == epochs_ref else (CURVE, epochs / epochs_ref)
            )
        seconds, samples = costs(summary)
        val = summary.get("val_accuracy")
        out.append(
            Record(
                name,
                method,
                budget,
                int(config["seed"]),
                100 * float(summary["test_accuracy"]),
                100 * float(val) if finite(val) else None,
                seconds,
                samples,
                summary,
            )
        )
    return out, epochs_ref


def condition_of(summary: Mapping[str, Any]) -> str:
    """The data condition a run trained under: its wrong labels (dataset.label_noise, or a
    user's dataset.train_labels), "" for the data set's own labels."""
    dataset = summary["config"].get("dataset", {})
    noise = dataset.get("label_noise") or {}
    if float(noise.get("rate") or 0) > 0:
        return f"{float(noise['rate']):.0%} {noise['kind']} label noise"
    labels = dataset.get("train_labels")
    return f"labels from {Path(str(labels)).name}" if labels else ""


# What a frontier sweep can sweep besides its methods' points and the labels: the data set and the
# model (`dataset=fashion_mnist,cifar10`, `model=...`). The sweeper runs a reference for each
# value, and a method's runs on one are no point of another's frontier.
SETTINGS = ("dataset.name", "model._target_")


def setting_of(summary: Mapping[str, Any], dotted: str) -> str | None:
    """A run's value of a dotted config key, as text; None where the config has no such key."""
    node: Any = summary["config"]
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return None if node is None else str(node)


def setting_text(dotted: str, value: str | None) -> str:
    """A setting as a frontier's title names it: `cifar10`, `ConvNet` (a class by its name)."""
    if value is None:
        return f"no {dotted}"
    return value.rsplit(".", 1)[-1] if dotted.endswith("_target_") else value


def by_condition(
    summaries: Sequence[tuple[str, Mapping[str, Any]]],
) -> dict[str, list[tuple[str, Mapping[str, Any]]]]:
    """The sweep's runs split by data condition (`condition_of`) and, where its runs have
    several, by data set and model (SETTINGS), in the order first seen; each group under its
    title (the settings that vary, then the condition; "" for a plain sweep)."""
    runs = [(name, summary) for name, summary in summaries if "config" in summary]
    # A run without the key (an older summary) splits nothing off: only values that differ do.
    varying = [key for key in SETTINGS if len({setting_of(s, key) for _, s in runs} - {None}) > 1]
    groups: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for name, summary in runs:
        parts = [setting_text(key, setting_of(summary, key)) for key in varying]
        title = ", ".join(part for part in (*parts, condition_of(summary)) if part)
        groups.setdefault(title, []).append((name, summary))
    return groups


def by_epochs(
    summaries: Sequence[tuple[str, Mapping[str, Any]]], reference: str
) -> dict[int | None, list[tuple[str, Mapping[str, Any]]]]:
    """One condition's runs split into frontiers by the epochs their methods ran: a budget is a
    share of the reference's cost at those epochs, so runs at 12 and 36 epochs (two frontier
    sweeps read as one folder) make two frontiers, not one point each method of mixed runs.
    {E: summaries} where the methods ran one number of epochs E (the reference's, however many
    runs of the whole pool's curve there are), {None: summaries} where no method ran; else, per
    epochs E, the methods' runs at E and every reference run (the reference at E, the whole
    pool's curve at other epochs)."""
    done = [(n, s) for n, s in summaries if finished(s)]
    methods = [(n, s) for n, s in done if approach_of(s["config"]) != reference]
    epochs = sorted({epochs_of(s) for _, s in methods})
    if len(epochs) < 2:
        return {epochs[0] if epochs else None: list(summaries)}
    references = [(n, s) for n, s in done if approach_of(s["config"]) == reference]
    return {e: [*references, *((n, s) for n, s in methods if epochs_of(s) == e)] for e in epochs}


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
    points: Sequence[Point], tolerance: float = LOSSLESS_POINTS
) -> dict[str, Point | None]:
    """Per method (not the reference or the curve): the point with the largest speed-up whose
    mean test accuracy is at most `tolerance` points below the reference's (above counts too);
    None where no budget qualifies."""
    ref = reference_of(points)
    if ref is None:
        raise ValueError("no reference among the points: no speed-up to compute")
    best: dict[str, Point | None] = {}
    for p in points:
        if p.method in (REFERENCE, CURVE):
            continue
        best.setdefault(p.method, None)
        if p.speedup is None or ref.accuracy - p.accuracy > tolerance + 1e-9:
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
    found = detections(runs)
    return {
        **({"detection": [asdict(d) for d in found]} if found else {}),
        "ref_epochs": epochs_ref,
        "lossless_points": LOSSLESS_POINTS,
        "points": [asdict(p) for p in points],
        "lossless": {m: None if p is None else asdict(p) for m, p in lossless.items()},
        "paired": [asdict(p) for p in paired_with_whole_pool(runs)],
        "runs": [{k: v for k, v in asdict(r).items() if k != "summary"} for r in runs],
    }
