"""What the run needs to know of the chosen selector, read from the `selector` node here alone.

Elsewhere `selector.name` is only a label (messages, subset files, reports): the checks and the
stages ask a `SelectorSettings` instead. No torch, no Lightning, no omegaconf: lipt.run.config
uses it before anything heavy is imported, on the composed config or on its resolved values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SelectorSettings:
    label: str  # selector.name, for messages
    needs_model: bool  # the selector ranks the pool with a (pre-)trained model
    needs_held_out: bool  # it matches the validation split (GLISTER; GradMatch target=val)
    balance: bool = False  # per-class budgets (lipt.selection.select_balanced)
    repeats: int = 1  # rank with this many seeds' models and average


def selector_settings(node: Mapping[str, Any] | None) -> SelectorSettings | None:
    """The settings of a `selector` config node (composed, or resolved to plain values); None
    for selector=none, which selects nothing (its node has no `_target_`)."""
    if node is None or "_target_" not in node:
        return None
    name = node.get("name")
    return SelectorSettings(
        label=str(name),
        needs_model=bool(node.get("needs_model", True)),
        needs_held_out=name == "glister" or (name == "gradmatch" and node.get("target") == "val"),
        balance=bool(node.get("balance", False)),
        repeats=int(node.get("repeats", 1)),
    )
