"""lipt's selectors by the names of their configs (`SELECTORS`), and a selector a caller gives,
by name or as a function, resolved and checked before any model runs (`selector_of`: lipt's own
with its knobs bound held to their ranges, a user's to its signature), with what it needs of the
data: a model to rank the pool (`needs_model`), a validation split to match (`check_held_out`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from lipt.core.schema import check_mapping, parameters
from lipt.core.settings import matches_validation
from lipt.selection.ccs import select_ccs
from lipt.selection.common import Selector
from lipt.selection.contract import selector_name
from lipt.selection.coverage import select_coverage
from lipt.selection.craig import select_craig
from lipt.selection.glister import select_glister
from lipt.selection.gradmatch import select_gradmatch
from lipt.selection.scores import (
    select_el2n,
    select_grand,
    select_random,
    select_uncertainty,
)

# The selectors by the names of their configs (configs/selector/); `random_balanced` is
# `random` with `balance=True`.
SELECTORS: dict[str, Selector] = {
    "random": select_random,
    "uncertainty": select_uncertainty,
    "el2n": select_el2n,
    "grand": select_grand,
    "glister": select_glister,
    "gradmatch": select_gradmatch,
    "craig": select_craig,
    "ccs": select_ccs,
    "coverage": select_coverage,
}
# What the selection passes a selector itself; its other parameters are its settings.
SELECTOR_CALL = ("inputs", "budget", "generator")
# Selectors that use labels only: the pool is never run through a model for them.
LABELS_ONLY: tuple[Callable[..., Any], ...] = (select_random,)


def selector_of(selector: str | Selector) -> Selector:
    if isinstance(selector, str):
        if selector not in SELECTORS:
            raise ValueError(f"unknown selector {selector!r}; one of {sorted(SELECTORS)}")
        return SELECTORS[selector]
    if not callable(selector):
        raise ValueError(f"selector must be a name or a function, not {type(selector).__name__}")
    if isinstance(selector, functools.partial) and selector.func in SELECTORS.values():
        # lipt's own selector with its knobs bound: held to the ranges its config's keys are
        # (lipt.core.schema), before any model runs rather than after the pass over the pool
        declared, open_keys = parameters(selector.func, skip=SELECTOR_CALL)
        name = selector.func.__name__
        if selector.args:
            raise ValueError(f"bind {name}'s settings by keyword: functools.partial({name}, k=v)")
        knobs = {
            k: v.item() if isinstance(v, np.generic) else v for k, v in selector.keywords.items()
        }
        check_mapping(name, knobs, declared, open_keys)
    elif isinstance(selector, functools.partial):
        # a user's own with its settings bound: a misspelt one fails at its call, after the
        # pass over the pool, unless held to its signature now
        try:
            inspect.signature(selector.func).bind_partial(*selector.args, **selector.keywords)
        except TypeError as e:
            raise ValueError(f"{selector_name(selector)}'s bound settings: {e}") from e
        except ValueError:
            pass  # a builtin without a signature: its call says
    return selector


def matches_held_out(selector: Selector) -> bool:
    """True for selectors whose target is the validation split: GLISTER, and GradMatch with
    `target="val"` (also inside a functools.partial)."""
    fn = getattr(selector, "func", selector)
    if fn not in (select_glister, select_gradmatch):
        return False
    keywords = getattr(selector, "keywords", {})
    return matches_validation(fn.__name__.removeprefix("select_"), keywords.get("target"))


def check_held_out(selector: Selector, data: Any, val: Iterable[Any] | None) -> None:
    """A selector that matches the validation split needs one (else the pool would silently
    stand in for it): `val` batches, or a data module's non-empty validation split.

    Raises:
        ValueError: no validation rows to match.
    """
    if not matches_held_out(selector) or val is not None:
        return
    if len(getattr(data, "val_indices", ())) > 0:
        return
    fn = getattr(selector, "func", selector)
    name = getattr(fn, "__name__", "the selector").removeprefix("select_")
    raise ValueError(
        f"{name} matches the validation split, which is empty here: give the data a "
        "validation split (PoolDataModule(..., val_size=0.1)) or val= batches of (x, y, idx)"
    )


def needs_model(selector: Selector) -> bool:
    """False for selectors that use labels only (random, also inside a functools.partial)."""
    fn = getattr(selector, "func", selector)
    return fn not in LABELS_ONLY
