"""Paired differences against a baseline for a sweep's report: each group's test accuracy minus
the baseline's, seed by seed (`python -m lipt.report.sweep SWEEP --baseline approach=random`).

A sweep's seeds share everything but the choice under test (the same split, initial model and
batch order for a given seed), so a seed's difference to the baseline is less noisy than the
difference of two means: the std of the paired differences is the spread of the effect, not of
the seeds. A group is paired with the baseline group whose other group keys are equal (the same
fraction, say), run by run on the seeds both have. Where the baseline sits at other values of a
key that is not a group key (table 1's GraNd at 20% against random at 10%) the pairing follows
the group keys only, as the table's rows do.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lipt.core.errors import UserError

# The keys a default baseline is looked for in, in order, and its value there.
DEFAULT_KEYS = ("approach", "selector.name")
DEFAULT_VALUE = "random"


@dataclass(frozen=True)
class Baseline:
    key: str  # a group key, e.g. "approach"
    value: str  # its value in the baseline's runs, as text ("random")

    def matches(self, config: Mapping[str, Hashable]) -> bool:
        return str(config.get(self.key)) == self.value

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


def parse_baseline(
    text: str | None, configs: Sequence[Mapping[str, Hashable]], keys: Sequence[str]
) -> Baseline | None:
    """`KEY=VALUE`, `none` (no paired table) or None (the default: approach=random, else
    selector.name=random, where a group key has that value; else no paired table)."""
    if text is None:
        for key in DEFAULT_KEYS:
            if key in keys and any(str(c.get(key)) == DEFAULT_VALUE for c in configs):
                return Baseline(key, DEFAULT_VALUE)
        return None
    if text == "none":
        return None
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise UserError(f"--baseline {text!r}: write KEY=VALUE (e.g. approach=random) or none")
    if key not in keys:
        raise UserError(
            f"--baseline: {key} is not a group key of this sweep "
            f"(the group keys: {', '.join(keys) or 'none'})"
        )
    baseline = Baseline(key, value)
    if not any(baseline.matches(c) for c in configs):
        seen = sorted({str(c.get(key)) for c in configs})
        raise UserError(f"--baseline: no run has {baseline} (its values here: {', '.join(seen)})")
    return baseline


def _seed_order(seed: Hashable) -> tuple[int, Any]:
    return (0, seed) if isinstance(seed, int | float) else (1, str(seed))


def paired_rows(
    runs: Sequence[tuple[Mapping[str, Hashable], float | None]],
    keys: Sequence[str],
    baseline: Baseline,
) -> list[dict[str, Any]]:
    """`runs`: each run's flattened config and test accuracy in % (None: it did not train).
    One row per group other than the baseline's, in the order the runs give: the group keys,
    `pairs` (seeds both have), `diff_mean`, `diff_std` (points; std ddof=1, None for fewer than
    2 pairs) and `per_seed` {seed: difference}. A group with no baseline counterpart or no
    common seed has pairs 0 and None figures."""
    assert baseline.key in keys, (baseline, keys)
    others = [k for k in keys if k != baseline.key]
    # (other keys' values, seed) -> the baseline's accuracies; a seed run twice (two sweeps of
    # one experiment in the folder) counts by its mean, as one pair
    base: dict[tuple[tuple[Hashable, ...], Hashable], list[float]] = {}
    groups: dict[tuple[Hashable, ...], dict[Hashable, list[float]]] = {}
    for config, accuracy in runs:
        if accuracy is None:
            continue
        seed = config.get("seed")
        if baseline.matches(config):
            base.setdefault((tuple(config.get(k) for k in others), seed), []).append(accuracy)
        else:
            by_seed = groups.setdefault(tuple(config.get(k) for k in keys), {})
            by_seed.setdefault(seed, []).append(accuracy)
    rows = []
    for values, by_seed in groups.items():
        group = dict(zip(keys, values, strict=True))
        other_values = tuple(group[k] for k in others)
        per_seed = {
            seed: statistics.mean(by_seed[seed]) - statistics.mean(base[(other_values, seed)])
            for seed in sorted(by_seed, key=_seed_order)
            if (other_values, seed) in base
        }
        diffs = list(per_seed.values())
        rows.append(
            {
                **group,
                "pairs": len(diffs),
                "diff_mean": statistics.mean(diffs) if diffs else None,
                "diff_std": statistics.stdev(diffs) if len(diffs) > 1 else None,
                "per_seed": per_seed,
            }
        )
    return rows
