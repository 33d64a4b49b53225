"""Every setting's type and range, declared once: as the type annotation of the parameter or
field that takes it.

A config group's option names a `_target_` (a lipt function or dataclass, a Lightning class);
the annotations of its parameters are the option's schema. Bounds ride along in `Annotated`:
``eta: Annotated[float, Range(0, low_open=True)] = 0.1``. lipt's own keys that no target takes
(the top level, `dataset.*`, a selector's `balance`) are declared the same way, as typed fields
of lipt.core.settings. `check_value` holds a config value against such an annotation and raises a
one-line `UserError` naming the key, the value and what is allowed; `parameters` reads a
target's annotations. Pure Python: the pure rooms may annotate with `Range` freely.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from lipt.core.errors import UserError


@dataclass(frozen=True)
class Range:
    """Bounds of a number: [low, high], each end open or closed, None for unbounded."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        if not math.isfinite(value):  # nan and inf are no setting's value
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            if self.low is None:
                return ""
            return f"{'>' if self.low_open else '>='} {_number(self.low)}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {_number(self.high)}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{_number(self.low)}, {_number(self.high)}{right}"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


# The bounds most keys need.
POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
SHARE = Range(0, 1, low_open=True)  # (0, 1]: a share of a whole, never nothing
UNIT = Range(0, 1)  # [0, 1]
BELOW_ONE = Range(0, 1, high_open=True)  # [0, 1): a momentum, a drop ratio
OPEN_UNIT = Range(0, 1, low_open=True, high_open=True)  # (0, 1)
COUNT = Range(1)  # a positive integer

# Keys of a config node that are Hydra's (instantiation), not the target's.
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_convert_", "_recursive_", "_args_"})


def _strip(annotation: Any) -> tuple[Any, list[Range]]:
    """The type under `Annotated`, and its Range bounds."""
    if typing.get_origin(annotation) is Annotated:
        base, *meta = typing.get_args(annotation)
        inner, ranges = _strip(base)
        return inner, ranges + [m for m in meta if isinstance(m, Range)]
    return annotation, []


def _union_members(annotation: Any) -> tuple[Any, ...] | None:
    origin = typing.get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return typing.get_args(annotation)
    return None


def _is_typed_dict(annotation: Any) -> bool:
    return isinstance(annotation, type) and typing.is_typeddict(annotation)


def fields_of(annotation: Any) -> dict[str, Any] | None:
    """The declared keys of a TypedDict or dataclass type (None for any other type)."""
    if _is_typed_dict(annotation):
        return typing.get_type_hints(annotation, include_extras=True)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        hints = typing.get_type_hints(annotation, include_extras=True)
        return {f.name: hints[f.name] for f in dataclasses.fields(annotation) if f.init}
    return None


def conforms(value: Any, annotation: Any) -> bool:
    """Whether a config value (plain Python: lists, dicts, scalars) fits `annotation`."""
    base, ranges = _strip(annotation)
    if not _fits_type(value, base):
        return False
    return all(value in r for r in ranges) if value is not None or not ranges else True


def _fits_type(value: Any, annotation: Any) -> bool:
    if annotation in (Any, object, inspect.Parameter.empty):
        return True
    if annotation is None or annotation is type(None):
        return value is None
    members = _union_members(annotation)
    if members is not None:
        return any(conforms(value, m) for m in members)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if annotation in (Path, PathLike) or origin is PathLike:
        return isinstance(value, str | Path)
    declared = fields_of(annotation)
    if declared is not None:
        return isinstance(value, Mapping) and _problem(value, declared, "", True) is None
    if origin in (list, Sequence, tuple) or annotation in (list, tuple, Sequence):
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(map(conforms, value, args))
        item = args[0] if args else Any
        return all(conforms(v, item) for v in value)
    if origin in (dict, Mapping) or annotation in (dict, Mapping):
        if not isinstance(value, Mapping):
            return False
        key_type, item = args if len(args) == 2 else (Any, Any)
        return all(conforms(k, key_type) and conforms(v, item) for k, v in value.items())
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True  # a TypeVar, a Callable, a forward reference a library left unresolved


def describe(annotation: Any) -> str:
    """What `annotation` allows, in a user's words: "an integer >= 1", "true or false"."""
    base, ranges = _strip(annotation)
    bounds = " ".join(str(r) for r in ranges if str(r))
    members = _union_members(base)
    if members is not None:
        words = [describe(m) for m in members if m is not type(None)]
        text = " or ".join(dict.fromkeys(words))
        return f"{text} or null" if type(None) in members else text
    if base is None or base is type(None):
        return "null"
    if typing.get_origin(base) is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(base))
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if base in names:
        return f"{names[base]} {bounds}".strip()
    if base in (Path, PathLike):
        return "a path"
    declared = fields_of(base)
    if declared is not None:
        return "a mapping of " + ", ".join(declared)
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin in (list, Sequence, tuple) or base in (list, tuple, Sequence):
        return f"a list of {_plural(describe(args[0]))}" if args else "a list"
    if origin in (dict, Mapping) or base in (dict, Mapping):
        return "a mapping"
    return f"a {getattr(base, '__name__', str(base))}"


def _plural(text: str) -> str:
    for one, many in (("an integer", "integers"), ("a number", "numbers"), ("a string", "strings")):
        if text.startswith(one):
            return many + text[len(one) :]
    return text


def check_value(key: str, value: Any, annotation: Any) -> None:
    """Raise UserError when `value` does not fit `annotation`, naming `key` and what fits."""
    if isinstance(value, Mapping):  # a nested node: name the nested key that is wrong
        base = _strip(annotation)[0]
        for member in _union_members(base) or (base,):
            declared = fields_of(member)
            if declared is not None:
                check_mapping(key, value, declared, open_keys=False)
                return
    if not conforms(value, annotation):
        raise UserError(f"{key}={_shown(value)} is invalid: use {describe(annotation)}")


def _shown(value: Any) -> str:
    return repr(value) if not isinstance(value, list | dict) else str(value)


def _problem(node: Mapping[str, Any], declared: Mapping[str, Any], prefix: str, closed: bool):
    try:
        check_mapping(prefix, node, declared, open_keys=not closed)
    except UserError as e:
        return str(e)
    return None


def check_mapping(
    prefix: str, node: Mapping[str, Any], declared: Mapping[str, Any], open_keys: bool
) -> None:
    """Each key of `node` fits its declaration; an undeclared key is refused unless `open_keys`
    (a target taking **kwargs). Hydra's instantiation keys are not settings."""
    where = f"{prefix}." if prefix else ""
    for key, value in node.items():
        if key in HYDRA_KEYS:
            continue
        if key not in declared:
            if open_keys:
                continue
            allowed = ", ".join(k for k in declared) or "none"
            raise UserError(
                f"{where}{key} is not a setting here; remove it (settings of "
                f"{prefix or 'the config'}: {allowed})"
            )
        check_value(f"{where}{key}", value, declared[key])


# Parameters a target is called with by lipt, not set from the config (a selector's pool, budget
# and generator; a pre-training's context).
@functools.cache
def parameters(target: Callable[..., Any], skip: Sequence[str] = ()) -> tuple[dict[str, Any], bool]:
    """The annotated parameters of `target` (a function, a class, a dataclass) that a config may
    set, and whether it takes **kwargs (then undeclared keys pass through). An annotation that
    does not resolve here (a library's forward reference) declares nothing: `Any`."""
    call = target.__init__ if isinstance(target, type) else target  # type: ignore[misc]
    hints = _hints(target, call)
    declared, open_keys = {}, False
    for name, p in inspect.signature(call).parameters.items():
        if name == "self" or name in skip or p.kind == p.VAR_POSITIONAL:
            continue
        if p.kind == p.VAR_KEYWORD:
            open_keys = True
            continue
        declared[name] = hints.get(name, Any)
    return declared, open_keys


def _hints(target: Any, call: Callable[..., Any]) -> dict[str, Any]:
    if isinstance(target, type) and dataclasses.is_dataclass(target):
        return typing.get_type_hints(target, include_extras=True)  # the fields, via the MRO
    try:
        return typing.get_type_hints(call, include_extras=True)
    except Exception:  # one name that does not resolve: resolve the others one by one
        pass
    namespace = getattr(inspect.unwrap(call), "__globals__", {})
    hints = {}
    for name, annotation in getattr(call, "__annotations__", {}).items():
        try:
            hints[name] = typing.get_type_hints(
                _Holder(name, annotation), globalns=namespace, include_extras=True
            )[name]
        except Exception:
            continue
    return hints


class _Holder:
    """An object with one annotation, for get_type_hints to resolve on its own."""

    def __init__(self, name: str, annotation: Any) -> None:
        self.__annotations__ = {name: annotation}


def unannotated(target: Callable[..., Any], skip: Sequence[str] = ()) -> list[str]:
    """Parameters of `target` a config may set that declare no type (lipt's own must declare)."""
    call = target.__init__ if isinstance(target, type) else target  # type: ignore[misc]
    params = inspect.signature(call).parameters.values()
    return [
        p.name
        for p in params
        if p.name != "self"
        and p.name not in skip
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and p.annotation is inspect.Parameter.empty
    ]
