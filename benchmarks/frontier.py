"""The frontier: test accuracy against end-to-end cost. Does lipt save time at equal accuracy?

Fashion-MNIST, `convnet`, the default recipe (batch 256, SGD, cosine). The reference is the
whole pool trained E_ref epochs (`selector=full pretrain=none trainer.max_epochs=E_ref`, default
E_ref = 12, `--ref-epochs`). Every method runs at budgets b (default 0.1 0.2 0.3 0.5 of the
reference's cost) and seeds (default 0 1 2); a method is one entry of METHODS (name -> train.py
overrides for a budget and the reference):

- full: the whole pool for b x E_ref epochs, the cosine annealed over the shorter run
  (`trainer.max_steps` = round(b x E_ref x steps per epoch): fractional epochs);
- random: a random b share of the pool, E_ref epochs;
- coverage: lipt's subset pipeline (jigsaw pre-training, the `coverage` selector), fraction b,
  E_ref epochs;
- infobatch: InfoBatch on the whole pool (`dynamic=infobatch`), E = max(1, round(b x E_ref / 0.7))
  epochs, as it keeps about 70% of an epoch's samples (`lipt.dynamic.infobatch_epochs`): the
  main job's default, `python train.py fraction=b trainer.max_epochs=E_ref`, trains these epochs;
- lipt_dynamic: `selector=full dynamic=lipt dynamic.budget=b`, E_ref epochs;
- lipt_warm: lipt_dynamic with main training starting from the soup (`init_from=pretrained`);
- paper: the paper's pipeline (`+approach=grand_lipt`: GraNd on the jigsaw soup), fraction b,
  re-selecting every round(E_ref / 10) epochs (the paper's 20 of 200), E_ref epochs.

The budget is what each method is asked for; the cost plotted is what each run measured, two
ways: end-to-end seconds (summary.json's stages: pre-training + selection + training, re-selection
and the per-epoch validation inside training; loading the data and the test pass are not counted)
and samples passed forward and backward (pre-training's + training's; the forward-only passes of
selection, re-selection and the jigsaw merge's held-out scoring are not in summary.json and are
not counted). `--curve-epochs` adds whole-pool runs of more epochs to the whole pool's curve.

Each run is one in-process `lipt.stages.train.run` (as `python train.py OVERRIDES` would run
it, its own run folder under --work), one at a time, with the config's thread settings. Its
result lands in OUT/runs/ref<E_ref>/<name>.json as it ends (written atomically); a re-run
skips every run whose result is there with the same overrides, so work spread over sessions is
never lost. At the end
(or with --report-only, from the saved results alone) it writes OUT/frontier.json (command,
commit, hardware, E_ref, every run), OUT/frontier.md (method x budget: test accuracy mean ± std
over seeds, mean seconds and samples, speed-up against the reference; each method's lossless
speed-up: the largest whose mean test accuracy is within 0.3 points of the reference's) and
OUT/frontier.png (test accuracy against end-to-end seconds).

    python benchmarks/frontier.py                 # the full frontier: about 4-5 hours, 2 CPU cores
    python benchmarks/frontier.py --report-only   # re-render table and plot from the saved runs
    python benchmarks/frontier.py --small         # synthetic data, tiny model: about 10 s
    python benchmarks/frontier.py --methods full random --budgets 0.1 --seeds 0 --ref-epochs 2 \\
        --out /tmp/frontier_try                   # one real point: a few minutes

The full run is 3 references + 6 methods x 4 budgets x 3 seeds = 75 runs (more with
--curve-epochs). The estimate is from docs/RESULTS.md's quiet-machine figures: about 40 s per
whole-pool epoch, 20 s of jigsaw pre-training, 80 s of coverage selection, 13.5 s per GraNd
re-selection (the paper's runs re-select every epoch at E_ref = 12). Two torch threads on two
cores that other work also uses spin-wait for each other and inflate the seconds several times
over (the whole pool for 516 steps: 331 s beside a niced test suite, where 258 and 774 steps
took 58 and 151 s). So the committed frontier
runs pinned to one core with one thread, where every method pays the same one-core rate and
other work on the other core leaves its seconds alone:

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/frontier.py

Each run records its torch threads, allowed cores and the load average at its start and end;
the table names the runs measured under load.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
DEFAULT_OUT = ROOT / "docs" / "results" / "frontier"
DEFAULT_WORK = ROOT / "multirun" / "frontier"  # run folders of the default --out (not committed)
SMALL_OUT = ROOT / "outputs" / "frontier_small"

# The whole pool still climbs at 16 epochs (PEERS.md); 3 seeds of longer do not fit 2 cores.
REF_EPOCHS = 12
BUDGETS = (0.1, 0.2, 0.3, 0.5)
SEEDS = (0, 1, 2)
LOSSLESS_POINTS = 0.3  # a method is lossless within this many points of the reference's mean

# Every run: the benchmark's data, model and recipe (the config's defaults, named for the record).
BASE = ["dataset=fashion_mnist", "model=convnet", "trainer.enable_progress_bar=false"]
# --small: learnable toy images, a tiny model, two tiny jigsaw learners (tests/helpers.py FAST).
SMALL_BASE = [
    "dataset=synthetic",
    "trainer.accelerator=cpu",
    "model.width=8",
    "batch_size=32",
    "trainer.enable_progress_bar=false",
    "logger=none",
]
SMALL_JIGSAW = ["pretrain.num_learners=2", "pretrain.local_epochs=1", "merge.ratios=2"]
SMALL_BUDGETS = (0.25, 0.5)
SMALL_REF_EPOCHS = 2


# --- methods: name -> train.py overrides ---------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """What a method's overrides depend on besides its budget."""

    epochs: int  # E_ref: the reference trains the whole pool this many epochs
    steps_per_epoch: int  # optimiser steps of one whole-pool epoch: ceil(pool / batch_size)
    reselect_every: int  # the paper's re-selection period, in epochs


Method = Callable[[float, Reference], list[str]]


def full(budget: float, ref: Reference) -> list[str]:
    """The whole pool for budget x E_ref epochs. Lightning stops at max_steps, and the cosine
    anneals over `trainer.estimated_stepping_batches` = min(max_steps, max_epochs x steps per
    epoch) (lipt.models.classifier.Classifier.configure_optimizers): over the shorter run."""
    steps = max(1, round(budget * ref.epochs * ref.steps_per_epoch))
    epochs = math.ceil(steps / ref.steps_per_epoch)
    return [
        "selector=full",
        "pretrain=none",
        f"trainer.max_epochs={epochs}",
        f"++trainer.max_steps={steps}",
    ]


def subset_of(selector: str, pretrain: str) -> Method:
    """A b share of the pool chosen by `selector` after `pretrain`, trained E_ref epochs."""

    def overrides(budget: float, ref: Reference) -> list[str]:
        return [
            f"selector={selector}",
            f"pretrain={pretrain}",
            f"fraction={budget}",
            f"trainer.max_epochs={ref.epochs}",
        ]

    return overrides


random_subset = subset_of("random", "none")
coverage = subset_of("coverage", "jigsaw")  # lipt's subset pipeline: the soup, then coverage


def infobatch(budget: float, ref: Reference) -> list[str]:
    from lipt.dynamic.plan import infobatch_epochs

    epochs = infobatch_epochs(budget, ref.epochs)
    return ["selector=full", "pretrain=none", "dynamic=infobatch", f"trainer.max_epochs={epochs}"]


def lipt_dynamic(budget: float, ref: Reference) -> list[str]:
    return [
        "selector=full",
        "dynamic=lipt",
        f"dynamic.budget={budget}",
        f"trainer.max_epochs={ref.epochs}",
    ]


def lipt_warm(budget: float, ref: Reference) -> list[str]:
    """lipt's dynamic pruning, main training starting from the soup (another use of it)."""
    return [*lipt_dynamic(budget, ref), "init_from=pretrained"]


def paper(budget: float, ref: Reference) -> list[str]:
    """GraNd on the jigsaw soup with re-selection (configs/approach/grand_lipt.yaml)."""
    return [
        "+approach=grand_lipt",
        f"fraction={budget}",
        f"reselect_every={ref.reselect_every}",
        f"trainer.max_epochs={ref.epochs}",
    ]


METHODS: dict[str, Method] = {
    "full": full,
    "random": random_subset,
    "coverage": coverage,
    "infobatch": infobatch,
    "lipt_dynamic": lipt_dynamic,
    "lipt_warm": lipt_warm,
    "paper": paper,
}
# Config files a method needs beyond train.yaml's defaults (run only where they are here).
NEEDS = {
    "infobatch": "dynamic/infobatch.yaml",
    "lipt_dynamic": "dynamic/lipt.yaml",
    "lipt_warm": "dynamic/lipt.yaml",
}
REFERENCE = "reference"  # the whole pool, E_ref epochs
DEFAULT_METHOD = "infobatch"  # what `python train.py fraction=b` trains (selector=infobatch)
CURVE = "curve"  # the whole pool, --curve-epochs epochs


def missing_config(method: str) -> str | None:
    need = NEEDS.get(method)
    return need if need is not None and not (CONFIGS / need).is_file() else None


def pretrains(overrides: Sequence[str]) -> bool:
    """Whether a run's config pre-trains with jigsaw (where --small's tiny jigsaw applies)."""
    return "pretrain=none" not in overrides


# --- the plan: every run, by name -----------------------------------------------------------


@dataclass(frozen=True)
class Run:
    name: str  # its result file's stem
    method: str
    budget: float  # the share of the reference's cost asked for (1 for the reference)
    seed: int
    overrides: tuple[str, ...]


def run_name(method: str, budget: float, seed: int, epochs: int | None = None) -> str:
    if method == REFERENCE:
        return f"{REFERENCE}_s{seed}"
    if method == CURVE:
        return f"{CURVE}_e{epochs}_s{seed}"
    return f"{method}_b{budget:g}_s{seed}"


def plan(
    methods: Sequence[str],
    budgets: Sequence[float],
    seeds: Sequence[int],
    ref: Reference,
    curve_epochs: Sequence[int],
    base: Sequence[str],
    jigsaw: Sequence[str] = (),
) -> list[Run]:
    """The references first (every speed-up needs them), then seed by seed, so that a run
    stopped early has whole frontiers of its first seeds."""

    def make(
        method: str, budget: float, seed: int, overrides: list[str], epochs: int | None = None
    ) -> Run:
        extra = list(jigsaw) if pretrains(overrides) else []
        every = (*base, *overrides, *extra, f"seed={seed}")
        return Run(run_name(method, budget, seed, epochs), method, budget, seed, every)

    whole = ["selector=full", "pretrain=none"]
    runs = [make(REFERENCE, 1.0, s, [*whole, f"trainer.max_epochs={ref.epochs}"]) for s in seeds]
    for seed in seeds:
        for method in methods:
            for budget in budgets:
                runs.append(make(method, budget, seed, METHODS[method](budget, ref)))
        for epochs in curve_epochs:
            runs.append(
                make(
                    CURVE,
                    epochs / ref.epochs,
                    seed,
                    [*whole, f"trainer.max_epochs={epochs}"],
                    epochs,
                )
            )
    return runs


# --- running one run ------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    """Atomically: a reader (or a killed run) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)


def load_result(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def compose(overrides: Sequence[str], run_dir: Path) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return hydra_compose("train", overrides=[*overrides, f"paths.output_dir={run_dir}"])


def steps_per_epoch(base: Sequence[str], work: Path) -> int:
    """Optimiser steps of one whole-pool epoch (the train loader keeps the last short batch)."""
    from lipt.run.build import build_datamodule
    from lipt.run.config import run_of

    cfg = compose(base, work / "probe")
    return math.ceil(len(build_datamodule(run_of(cfg)).pool_indices) / int(cfg.batch_size))


def costs(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A run's cost from its summary.json: seconds and forward+backward samples per stage (a
    stage that did not run counts 0) and end to end."""
    stages = summary["stages"]

    def stage(name: str, key: str) -> float:
        return float(stages.get(name, {}).get(key) or 0)

    # Every stage that ran: pretrain, select, score (dynamic=lipt's pass of the soup over the
    # pool), train; those that did not count 0.
    names = (
        "pretrain",
        "select",
        "train",
        *(n for n in stages if n not in ("pretrain", "select", "train")),
    )
    seconds = {name: stage(name, "seconds") for name in names}
    samples = {name: int(stage(name, "samples")) for name in ("pretrain", "train")}
    train = stages["train"]
    return {
        "test_accuracy": float(summary["test_accuracy"]),
        "val_accuracy": summary.get("val_accuracy"),
        "seconds": {**seconds, "end_to_end": round(sum(seconds.values()), 3)},
        "samples": {**samples, "forward_backward": sum(samples.values())},
        "train_size": summary.get("train_size"),
        "subset_size": summary.get("subset_size"),
        "unique_samples": train.get("unique_samples"),
        "reselections": train.get("reselections", 0),
        "reselect_seconds": train.get("reselect_seconds", 0.0),
    }


def train_one(run: Run, ref_epochs: int, run_dir: Path) -> dict[str, Any]:
    """Train `run` in its own fresh run folder; its result, ready to write."""
    from lipt.run.config import validate
    from lipt.stages.train import run as train_run

    if run_dir.exists():
        shutil.rmtree(run_dir)  # an earlier attempt that did not finish: start clean
    cfg = compose(run.overrides, run_dir)
    load_before = os.getloadavg()[0]
    ticks_before = core_ticks()
    start = time.perf_counter()
    summary = train_run(validate(cfg))  # as train.py: the checks, then the stage
    call_seconds = time.perf_counter() - start
    other_busy = other_cores_busy(ticks_before, core_ticks())
    return {
        **asdict(run),
        "overrides": list(run.overrides),
        "ref_epochs": ref_epochs,
        "epochs": int(cfg.trainer.max_epochs),
        "max_steps": cfg.trainer.get("max_steps"),
        **costs(summary),
        "call_seconds": round(call_seconds, 3),  # data loading and the test pass included
        # 1-minute load averages at the start and the end: above the core count, other work
        # shared the machine and the seconds are inflated
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        # share of the time the cores this run may not use were busy: a pinned run's seconds
        # grow when the other core works beside it (shared cache and memory), ~40% measured
        "other_cores_busy": other_busy,
        "run_dir": str(run_dir),
        "host": host(),  # results spread over sessions may come from different machines
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def run_all(runs: Sequence[Run], ref_epochs: int, results_dir: Path, work: Path) -> None:
    for k, run in enumerate(runs, 1):
        path = results_dir / f"{run.name}.json"
        done = load_result(path)
        if done is not None and done.get("overrides") == list(run.overrides):
            log(f"[{k}/{len(runs)}] {run.name}: finished already, skipped")
            continue
        if done is not None:
            log(f"[{k}/{len(runs)}] {run.name}: its overrides changed, running it again")
        log(f"[{k}/{len(runs)}] {run.name}: {' '.join(run.overrides)}")
        result = train_one(run, ref_epochs, work / run.name)
        write_json(path, result)
        log(
            f"[{k}/{len(runs)}] {run.name}: test {100 * result['test_accuracy']:.2f}%, "
            f"{result['seconds']['end_to_end']:.1f} s, "
            f"{result['samples']['forward_backward']:,} samples"
        )


# --- aggregation (pure) ---------------------------------------------------------------------


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
    speedup: float | None = None  # the reference's mean seconds / this point's
    sample_speedup: float | None = None  # the reference's mean samples / this point's
    val_accuracy: float | None = None  # mean validation accuracy, % (what choices are made on)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def aggregate(results: Sequence[Mapping[str, Any]]) -> list[Point]:
    """One Point per (method, budget), in the order first seen; speed-ups against the
    reference's mean seconds when the results hold a reference."""
    groups: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["method"], float(r["budget"])), []).append(r)
    points = []
    for (method, budget), group in groups.items():
        accuracy, accuracy_std = mean_std([100 * r["test_accuracy"] for r in group])
        seconds, seconds_std = mean_std([r["seconds"]["end_to_end"] for r in group])
        samples = statistics.fmean(r["samples"]["forward_backward"] for r in group)
        seeds = tuple(sorted(r["seed"] for r in group))
        vals = [r.get("val_accuracy") for r in group]
        val = None if None in vals else 100 * statistics.fmean(v for v in vals if v is not None)
        points.append(
            Point(
                method,
                budget,
                seeds,
                accuracy,
                accuracy_std,
                seconds,
                seconds_std,
                samples,
                val_accuracy=val,
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
    """Per method (not the reference or the whole pool's extra curve points): the point with
    the largest speed-up whose mean test accuracy is at most `tolerance` points below the
    reference's mean (above it counts too); None where no budget qualifies."""
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
    highest first: how the main job's default is chosen (never on the test split)."""
    by_budget: dict[float, list[Point]] = {}
    for p in points:
        if p.method not in (REFERENCE, CURVE) and p.val_accuracy is not None:
            by_budget.setdefault(p.budget, []).append(p)
    return {
        budget: sorted(group, key=lambda p: -(p.val_accuracy or 0.0))
        for budget, group in sorted(by_budget.items())
    }


# --- output ---------------------------------------------------------------------------------


def accuracy_text(p: Point) -> str:
    return f"{p.accuracy:.2f} ± {p.accuracy_std:.2f}" if len(p.seeds) > 1 else f"{p.accuracy:.2f}"


def table_rows(points: Sequence[Point], ref_epochs: int) -> list[str]:
    """The Markdown table: the reference first, then each method by budget."""
    ordered = sorted(
        points, key=lambda p: (p.method != REFERENCE, p.method == CURVE, p.method, p.budget)
    )
    lines = [
        "| method | budget | seeds | test acc. (%) | end-to-end (s) | samples (fwd+bwd) "
        "| speed-up (s) | speed-up (samples) |",
        "|:---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in ordered:
        if p.method == REFERENCE:
            label, budget = f"reference (whole pool, {ref_epochs} epochs)", "1"
        elif p.method == CURVE:
            label, budget = f"whole pool, {round(p.budget * ref_epochs)} epochs", f"{p.budget:.2f}"
        else:
            label, budget = p.method, f"{p.budget:g}"
        speedup = "-" if p.speedup is None else f"{p.speedup:.2f}x"
        by_samples = "-" if p.sample_speedup is None else f"{p.sample_speedup:.2f}x"
        lines.append(
            f"| {label} | {budget} | {len(p.seeds)} | {accuracy_text(p)} | {p.seconds:.1f} "
            f"| {p.samples:,.0f} | {speedup} | {by_samples} |"
        )
    return lines


def lossless_rows(points: Sequence[Point]) -> list[str]:
    lines = [
        f"| method | lossless speed-up (within {LOSSLESS_POINTS} points) | at budget "
        "| test acc. (%) |",
        "|:---|---:|---:|---:|",
    ]
    for method, p in lossless_speedups(points).items():
        if p is None:
            lines.append(f"| {method} | none | - | - |")
        else:
            lines.append(f"| {method} | {p.speedup:.2f}x | {p.budget:g} | {accuracy_text(p)} |")
    return lines


def validation_rows(points: Sequence[Point]) -> list[str]:
    lines = [
        "| budget | highest on validation (%) | second (%) | its test acc. (%) | its seconds |",
        "|---:|:---|:---|---:|---:|",
    ]
    for budget, ranked in highest_on_validation(points).items():
        first = ranked[0]
        second = f"{ranked[1].method} {ranked[1].val_accuracy:.2f}" if len(ranked) > 1 else "-"
        lines.append(
            f"| {budget:g} | {first.method} {first.val_accuracy:.2f} | {second} "
            f"| {accuracy_text(first)} | {first.seconds:.1f} |"
        )
    return lines


def markdown(
    meta: Mapping[str, Any],
    points: Sequence[Point],
    results: Sequence[Mapping[str, Any]],
    missing: Sequence[str],
) -> str:
    ref = reference_of(points)
    hw = meta["hardware"]
    lines = [
        "# Frontier: test accuracy against end-to-end cost",
        "",
        f"`{meta['command']}`",
        "",
        f"Commit {meta['commit']}; {hw['cpu']} ({hw['cores']} cores), {hw['accelerator']}, "
        f"torch {hw['torch']}. Reference: the whole pool, {meta['ref_epochs']} epochs (chosen "
        "by what the machine affords; the whole pool's rows at more epochs, where run "
        "(--curve-epochs), show how far it still climbs). Budgets are shares of the "
        "reference's cost asked for; the costs below are measured. Accuracy: mean ± sample "
        "std over seeds.",
        "",
        *table_rows(points, meta["ref_epochs"]),
        "",
    ]
    if ref is not None:
        lines += [
            f"Lossless: the largest speed-up whose mean test accuracy is at least "
            f"{ref.accuracy - LOSSLESS_POINTS:.2f}% (the reference's {ref.accuracy:.2f}% less "
            f"{LOSSLESS_POINTS} points).",
            "",
            *lossless_rows(points),
            "",
        ]
    else:
        lines += ["No reference run finished yet: no speed-ups.", ""]
    if highest_on_validation(points):
        lines += [
            "The main job's default is the method highest on the validation split at its "
            "budget (the test split is never used to choose). Mean validation accuracy over "
            "seeds, per budget:",
            "",
            *validation_rows(points),
            "",
        ]
    lines += [
        "Cost. End-to-end seconds: summary.json's stages, pre-training + selection + training "
        "(re-selection and the per-epoch validation run inside training); loading the data and "
        "the test pass are not counted. Samples: passed forward and backward, pre-training's "
        "(the jigsaw learners) + training's. Not counted as samples: the forward-only passes of "
        "selection and re-selection over the pool and of the jigsaw merge's held-out scoring "
        "(summary.json does not record them); their time is in the seconds.",
    ]
    pinned = [r["name"] for r in results if is_pinned(r)]
    if pinned:
        lines += [
            "",
            f"{len(pinned)} of {len(results)} runs ran pinned to one core with one torch thread "
            "(`OMP_NUM_THREADS=1 taskset -c 1`); each records how busy the other cores were "
            "during it.",
        ]
    beside = [r["name"] for r in results if is_pinned(r) and is_busy_beside(r)]
    if beside:
        lines += [
            "",
            f"Timing caveat: {len(beside)} of {len(results)} pinned runs had the other cores busy "
            f"more than {BUSY_SHARE:.0%} of their time (shared cache and memory inflate a pinned "
            f"run's seconds, by up to ~40% measured here): {', '.join(beside)}.",
        ]
    busy = [
        r["name"]
        for r in results
        if not is_pinned(r)
        and max(r.get("load_average", [0])) > r.get("host", {}).get("cores", os.cpu_count())
    ]
    if busy:
        lines += [
            "",
            f"Timing caveat: {len(busy)} of {len(results)} runs started or ended with a 1-minute "
            f"load average above the core count (other work shared the machine; their seconds "
            f"are inflated): {', '.join(busy)}.",
        ]
    hosts = {json.dumps(r["host"], sort_keys=True) for r in results if "host" in r}
    if len(hosts) > 1:
        lines += ["", f"The runs were measured on {len(hosts)} machines: {sorted(hosts)}."]
    if meta.get("methods_unavailable"):
        unavailable = ", ".join(meta["methods_unavailable"])
        lines += ["", f"Not run (their config is not on this branch): {unavailable}."]
    if missing:
        lines += ["", f"Not finished yet ({len(missing)} runs): {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def plot(points: Sequence[Point], ref_epochs: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    ref = reference_of(points)
    if ref is not None:
        ax.axhspan(
            ref.accuracy - ref.accuracy_std,
            ref.accuracy + ref.accuracy_std,
            color="0.85",
            label=f"reference ({ref_epochs} epochs) ± std",
        )
        ax.axhline(
            ref.accuracy - LOSSLESS_POINTS,
            color="0.5",
            ls=":",
            lw=1,
            label=f"reference - {LOSSLESS_POINTS} points",
        )
        ax.errorbar(
            [ref.seconds],
            [ref.accuracy],
            xerr=[ref.seconds_std],
            yerr=[ref.accuracy_std],
            fmt="*",
            ms=12,
            color="black",
            capsize=3,
        )
    whole = {"full", REFERENCE, CURVE}  # the whole pool's curve: one line through all of them
    lines = {"full (whole pool, shorter cosine)": [p for p in points if p.method in whole]}
    for method in dict.fromkeys(p.method for p in points):
        if method not in whole:
            label = f"{method} (python train.py)" if method == DEFAULT_METHOD else method
            lines[label] = [p for p in points if p.method == method]
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
    ax.set_title(
        "Test accuracy against end-to-end cost\n(reference: the whole pool, "
        f"{ref_epochs} epochs, as long as the machine affords; it still climbs beyond)",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# A pinned run whose other cores were busy more than this share of its time is flagged.
BUSY_SHARE = 0.25


def core_ticks() -> dict[int, tuple[int, int]]:
    """(busy, total) jiffies per core from /proc/stat; empty where there is none."""
    stat = Path("/proc/stat")
    if not stat.is_file():
        return {}
    ticks = {}
    for line in stat.read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            values = [int(v) for v in fields[:8]]
            idle = values[3] + values[4]  # idle + iowait
            ticks[int(name[3:])] = (sum(values) - idle, sum(values))
    return ticks


def other_cores_busy(
    before: Mapping[int, tuple[int, int]], after: Mapping[int, tuple[int, int]]
) -> float | None:
    """Busy share of the cores outside this process's affinity between two `core_ticks`."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(after)
    others = [c for c in after if c not in allowed and c in before]
    if not others:
        return None
    busy = sum(after[c][0] - before[c][0] for c in others)
    total = sum(after[c][1] - before[c][1] for c in others)
    return round(busy / total, 3) if total > 0 else None


def is_busy_beside(result: Mapping[str, Any]) -> bool:
    """Whether a pinned run's other cores worked beside it (its seconds are inflated)."""
    return (result.get("other_cores_busy") or 0.0) > BUSY_SHARE


def is_pinned(result: Mapping[str, Any]) -> bool:
    """Whether a run ran on one core with one torch thread (its seconds: a one-core rate)."""
    machine = result.get("host", {})
    return machine.get("cores_allowed") == 1 and machine.get("torch_threads") == 1


def host() -> dict[str, Any]:
    """The machine a run's seconds were measured on."""
    import torch

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "accelerator": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
        "torch_threads": torch.get_num_threads(),
        # cores this process may run on (taskset): a run pinned to one core with one thread
        # keeps its seconds when other work shares the machine
        "cores_allowed": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def hardware() -> dict[str, Any]:
    import torch

    return {
        **host(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def git_commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    return f"{commit} (uncommitted changes)" if git("status", "--porcelain") else commit


def report(
    args: argparse.Namespace, runs: Sequence[Run], results_dir: Path, unavailable: Sequence[str]
) -> str:
    results = [r for run in runs if (r := load_result(results_dir / f"{run.name}.json"))]
    missing = [run.name for run in runs if not (results_dir / f"{run.name}.json").is_file()]
    points = aggregate(results)
    meta = {
        "command": shlex.join(["python", *sys.argv]),
        "report_only": args.report_only,
        "commit": git_commit(),
        "hardware": hardware(),
        "ref_epochs": args.ref_epochs,
        "methods": args.methods,
        "methods_unavailable": list(unavailable),
        "budgets": args.budgets,
        "seeds": args.seeds,
        "curve_epochs": args.curve_epochs,
        "lossless_points": LOSSLESS_POINTS,
        "cost": "seconds: stages pretrain + select + train (no data loading, no test); samples: "
        "pretrain + train forward+backward (selection's forward-only passes not counted)",
    }
    text = markdown(meta, points, results, missing)
    lossless = lossless_speedups(points) if reference_of(points) else {}
    write_json(
        args.out / "frontier.json",
        {
            **meta,
            "points": [asdict(p) for p in points],
            "lossless": {m: None if p is None else asdict(p) for m, p in lossless.items()},
            "missing": missing,
            "runs": results,
        },
    )
    (args.out / "frontier.md").write_text(text)
    if points:
        plot(points, args.ref_epochs, args.out / "frontier.png")
    return text


# --- command line ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--methods",
        nargs="*",
        default=None,
        help=f"of {', '.join(METHODS)} (default: every one whose config is here)",
    )
    p.add_argument(
        "--budgets",
        nargs="*",
        type=float,
        default=None,
        help=f"shares of the reference's cost, in (0, 1] (default {BUDGETS})",
    )
    p.add_argument("--seeds", nargs="*", type=int, default=None, help=f"default {SEEDS}")
    p.add_argument(
        "--ref-epochs",
        type=int,
        default=None,
        help=f"E_ref: the reference's whole-pool epochs (default {REF_EPOCHS})",
    )
    p.add_argument(
        "--curve-epochs",
        nargs="*",
        type=int,
        default=[],
        help="extra whole-pool runs of these many epochs (e.g. 16), for the curve",
    )
    p.add_argument(
        "--paper-reselect",
        type=int,
        default=None,
        help="the paper's re-selection period in epochs (default round(E_ref / 10))",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra override for every run, e.g. trainer.accelerator=gpu (repeatable)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"results (default {DEFAULT_OUT.relative_to(ROOT)}; --small: "
        f"{SMALL_OUT.relative_to(ROOT)})",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help=f"run folders (default {DEFAULT_WORK.relative_to(ROOT)} for the default "
        "--out, else OUT/work)",
    )
    p.add_argument(
        "--small",
        action="store_true",
        help=f"synthetic data, tiny model and jigsaw, seed 0, budgets {SMALL_BUDGETS}, "
        f"a {SMALL_REF_EPOCHS}-epoch reference, one torch thread (a smoke test)",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: table and plot from the saved results of the same flags",
    )
    return p.parse_args(argv)


def check(args: argparse.Namespace) -> str | None:
    """Fill in the defaults; a one-line message for input that cannot run, before any run."""
    if args.methods is None:
        args.methods = [m for m in METHODS if args.report_only or missing_config(m) is None]
    if args.budgets is None:
        args.budgets = list(SMALL_BUDGETS if args.small else BUDGETS)
    if args.seeds is None:
        args.seeds = [0] if args.small else list(SEEDS)
    if args.ref_epochs is None:
        args.ref_epochs = SMALL_REF_EPOCHS if args.small else REF_EPOCHS
    if args.out is None:
        args.out = SMALL_OUT if args.small else DEFAULT_OUT
    if args.work is None:
        args.work = DEFAULT_WORK if args.out == DEFAULT_OUT else args.out / "work"
    if unknown := [m for m in args.methods if m not in METHODS]:
        return f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}"
    if not args.methods:
        return "no methods: give --methods with at least one of " + ", ".join(METHODS)
    if not args.budgets:
        return "no budgets: give --budgets with at least one share in (0, 1]"
    if bad := [b for b in args.budgets if not 0 < b <= 1]:
        return f"budget(s) {', '.join(map(str, bad))} outside (0, 1]"
    if not args.seeds:
        return "no seeds: give --seeds with at least one seed"
    if args.ref_epochs < 1 or any(e < 1 for e in args.curve_epochs):
        return "--ref-epochs and --curve-epochs must be positive"
    if args.paper_reselect is not None and args.paper_reselect < 1:
        return "--paper-reselect must be positive"
    if not args.report_only and (
        absent := [f"{m} (configs/{missing_config(m)})" for m in args.methods if missing_config(m)]
    ):
        return f"not on this branch: {', '.join(absent)}; leave them out of --methods"
    args.budgets = list(dict.fromkeys(args.budgets))
    args.seeds = list(dict.fromkeys(args.seeds))
    return None


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if error := check(args):
        print(f"frontier.py: error: {error}", file=sys.stderr)
        sys.exit(2)
    unavailable = [m for m in METHODS if m not in args.methods and missing_config(m)]
    if unavailable:
        log(f"not run (config missing on this branch): {', '.join(unavailable)}")
    base = [*(SMALL_BASE if args.small else BASE), *args.override]
    jigsaw = SMALL_JIGSAW if args.small else []
    results_dir = args.out / "runs" / f"ref{args.ref_epochs}"
    reselect = args.paper_reselect or max(1, round(args.ref_epochs / 10))
    if args.report_only:
        ref = Reference(args.ref_epochs, 1, reselect)  # names only: they do not need the pool
    else:
        ref = Reference(args.ref_epochs, steps_per_epoch(base, args.work), reselect)
    runs = plan(args.methods, args.budgets, args.seeds, ref, args.curve_epochs, base, jigsaw)
    if not args.report_only:
        if args.small:
            # Tiny models: one thread. Two threads on two busy cores spin-wait for each other
            # and make the smoke test several times slower.
            import torch

            torch.set_num_threads(1)
        log(f"{len(runs)} runs, E_ref={args.ref_epochs}, {ref.steps_per_epoch} steps per epoch")
        run_all(runs, args.ref_epochs, results_dir, args.work)
    print(report(args, runs, results_dir, unavailable))


if __name__ == "__main__":
    main()
