"""A sweep's runs, read back: every readable summary.json under a sweep folder (those of one
multirun, with `since`), its config flattened to dotted keys, and a warning for each one left
out. lipt.report.sweep groups and tabulates them; a multirun's closing table reads them too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lipt.core.artifacts import LEARNERS_DIR
from lipt.core.errors import UserError
from lipt.report.frontier_runs import find_named, finite


@dataclass(frozen=True)
class Run:
    path: Path  # the summary.json
    summary: dict[str, Any]
    config: dict[str, Hashable]  # the summary's config, flattened to dotted keys


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Hashable]:
    """{"selector": {"name": "glister"}} -> {"selector.name": "glister"}. Lists become their JSON
    text, so every value can be compared and grouped on."""
    flat: dict[str, Hashable] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{dotted}."))
        elif isinstance(value, list):
            flat[dotted] = json.dumps(value)
        else:
            flat[dotted] = value
    return flat


# How much older than `since` a file written since may look: file systems that keep whole
# seconds, and the clocks of a cluster's nodes and its file server, which differ a little.
CLOCK_SLACK_S = 2.0


def load_summaries(sweep_dir: Path, since: float | None = None) -> tuple[list[Run], list[str]]:
    """Every readable summary.json under `sweep_dir`, and a warning for each one skipped: an
    unreadable or truncated file, one whose test accuracy is neither null nor a finite number
    (a mean over it would be NaN, its pairs and the frontier wrong), or a Hydra job directory
    (it has `.hydra/`) without one. `since` (a time.time()): only the files written since,
    those of the multirun that began then, where a sweep folder reused by another `-m` run
    still holds the earlier one's jobs (one warning counts them)."""
    if not sweep_dir.is_dir():
        raise UserError(f"{sweep_dir} is not a directory (pass a sweep dir, multirun/<job>/<time>)")
    runs: list[Run] = []
    warnings: list[str] = []
    earlier = [] if since is None else written_before(sweep_dir, since)
    if earlier:
        warnings.append(
            f"left out {len(earlier)} run{'s' * (len(earlier) > 1)} of an earlier multirun in "
            f"{sweep_dir} (written before this one began): "
            + ", ".join(str(p.parent.relative_to(sweep_dir)) for p in earlier[:3])
            + (", ..." if len(earlier) > 3 else "")
        )
    for path in find_named(sweep_dir, "summary.json"):
        if LEARNERS_DIR in path.relative_to(sweep_dir).parts[:-1] or path in earlier:
            continue  # a learner array task's own record (hydra/launcher=slurm), not a run
        try:
            summary = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            warnings.append(f"skipped {path}: unreadable ({type(e).__name__}: {e})")
            continue
        if not (
            isinstance(summary, dict)
            and isinstance(summary.get("config"), dict)
            and isinstance(summary.get("stages"), dict)
            and all(isinstance(stage, dict) for stage in summary["stages"].values())
        ):
            warnings.append(f"skipped {path}: not a lipt summary (no config or stages)")
            continue
        accuracy = summary.get("test_accuracy")
        if accuracy is not None and not finite(accuracy):
            warnings.append(f"skipped {path}: its test_accuracy is {accuracy!r}, not a number")
            continue
        runs.append(Run(path, summary, flatten(summary["config"])))
    for hydra_dir in find_named(sweep_dir, ".hydra"):
        job_dir = hydra_dir.parent
        if not hydra_dir.is_dir() or (job_dir / "summary.json").exists():
            continue
        if since is None or modified(hydra_dir, gone=-math.inf) >= since - CLOCK_SLACK_S:
            warnings.append(f"skipped {job_dir}: no summary.json (the run failed or is running)")
    return runs, warnings


def written_before(sweep_dir: Path, since: float) -> list[Path]:
    """The summary.json files under `sweep_dir` written before `since` (CLOCK_SLACK_S aside)."""
    return [
        path
        for path in find_named(sweep_dir, "summary.json")
        if modified(path, gone=since) < since - CLOCK_SLACK_S
    ]


def modified(path: Path, gone: float) -> float:
    """`path`'s modification time; `gone` for one removed since it was found (a running sweep's
    job folder, which is then neither an earlier multirun's run nor a job to warn of)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return gone
