"""What the run needs to know of the chosen selector, read from the `selector` node here alone.

Elsewhere `selector.name` is only a label (messages, subset files, reports): the checks and the
stages ask a `SelectorSettings` instead. No torch, no Lightning, no omegaconf: lipt.run.config
uses it before anything heavy is imported, on the composed config or on its resolved values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The options that train on the whole pool: full, and the whole pool pruned anew each epoch by
# the `dynamic` option of the same name, on `fraction` of the full run's cost: infobatch
# (dynamic=infobatch, for fewer epochs) and lipt (dynamic=lipt: the jigsaw soup scores the pool).
PRUNING = ("infobatch", "lipt")
WHOLE_POOL = ("full", *PRUNING)


@dataclass(frozen=True)
class SelectorSettings:
    label: str  # selector.name, for messages
    is_full: bool  # selector=full or infobatch: no selection, main training takes the whole pool
    needs_model: bool  # the selector ranks the pool with a (pre-)trained model
    needs_held_out: bool  # it matches the validation split (GLISTER; GradMatch target=val)
    match_subset_steps: bool  # the full-data run takes the subset run's steps (full_steps)
    budget_epochs: bool  # selector=infobatch: the epochs `fraction` of the full run's cost buys
    budget_steps: bool  # selector=full: the steps `fraction` of the full run's cost buys
    prunes_with: str | None  # selector=infobatch|lipt: the `dynamic` option that must prune
    balance: bool = False  # per-class budgets (lipt.selection.select_balanced)
    repeats: int = 1  # rank with this many seeds' models and average


def selector_settings(node: Mapping[str, Any]) -> SelectorSettings:
    """The settings of a `selector` config node (composed, or resolved to plain values)."""
    name = node.get("name")
    is_full = name in WHOLE_POOL
    return SelectorSettings(
        label=str(name),
        is_full=is_full,
        needs_model=not is_full and bool(node.get("needs_model", True)),
        needs_held_out=name == "glister" or (name == "gradmatch" and node.get("target") == "val"),
        match_subset_steps=bool(node.get("match_subset_steps", False)),
        budget_epochs=bool(node.get("budget_epochs", False)),
        budget_steps=bool(node.get("budget_steps", False)),
        prunes_with=str(name) if name in PRUNING else None,
        balance=bool(node.get("balance", False)),
        repeats=int(node.get("repeats", 1)),
    )
