"""A frontier sweep's jobs, read from their summary.json files as Records: each job's method (its
`approach`), budget (`fraction`), seed, accuracies and end-to-end cost, the reference's runs at
other epochs as the whole pool's curve; and the runs split by data condition, by data set and
model, and by the epochs their methods ran, one frontier each. lipt.report.frontier compares them.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

REFERENCE = "reference"  # the reference's method name in the tables
CURVE = "curve"  # the whole pool at other epochs than the reference's
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


def reference_approach(sweep_dir: Path) -> str | None:
    """The reference's approach if a frontier sweeper ran a sweep under `sweep_dir` (its
    multirun.yaml), else None: not a frontier."""
    import yaml

    for path in find_named(sweep_dir, "multirun.yaml"):
        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):  # a sweep starting: Hydra writing it
            continue
        hydra = loaded.get("hydra") if isinstance(loaded, dict) else None
        sweeper = (hydra or {}).get("sweeper") or {}
        if str(sweeper.get("_target_", "")).endswith(FRONTIER_SWEEPER):
            overrides = [str(o) for o in sweeper.get("reference", [])]
            approaches = [
                o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("approach=")
            ]
            return approaches[0] if approaches else "full_data"
    return None


def find_named(root: Path, name: str) -> list[Path]:
    """The entries named `name` under `root`, at any depth, sorted: `sorted(root.rglob(name))`,
    but for folders that vanish during the walk, which a sweep's running jobs make and remove
    (a refused job's folder, a logger's temporary ones) and which ended a report read while
    the sweep ran in FileNotFoundError. Links to folders are not followed, as rglob does not."""
    found = []
    for folder, dirs, files in os.walk(root):  # os.walk passes over a folder it cannot list
        found += [Path(folder) / entry for entry in (*dirs, *files) if entry == name]
    return sorted(found)


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
