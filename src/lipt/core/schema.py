"""Every setting's type and range is declared once, as the annotation of the parameter or field
that takes it (bounds from lipt.core.bounds); pydantic v2 checks config values against them.

A config group's option names a `_target_` (a lipt function or dataclass, a Lightning class):
the annotations of its parameters (`parameters`) are the option's schema. lipt's own keys that no
target takes (the top level, `dataset.*`, a selector's `balance`) are typed fields of
lipt.core.settings. `check_mapping` turns a node and its declarations into a pydantic
`TypeAdapter` of a TypedDict and validates the node as JSON in strict mode: config values are
JSON-like (Hydra parsed them), so `5` is no float's `5.0` trouble, `true` is no integer and a list
fills a tuple. pydantic's first error becomes one `UserError` line that names the key as the
config spells it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import typing_extensions
from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from lipt.core.errors import UserError

# Keys of a config node that are Hydra's (instantiation), not the target's.
HYDRA_KEYS = frozenset({"_target_", "_partial_", "_convert_", "_recursive_", "_args_"})


def fields_of(annotation: Any) -> dict[str, Any] | None:
    """The declared keys of a TypedDict or dataclass type (None for any other type)."""
    if isinstance(annotation, type) and typing_extensions.is_typeddict(annotation):
        return typing.get_type_hints(annotation, include_extras=True)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        hints = typing.get_type_hints(annotation, include_extras=True)
        return {f.name: hints[f.name] for f in dataclasses.fields(annotation) if f.init}
    return None


def check_mapping(
    prefix: str, node: Mapping[str, Any], declared: Mapping[str, Any], open_keys: bool
) -> None:
    """Each key of `node` fits its declaration; an undeclared key is refused unless `open_keys`
    (a target taking **kwargs). Hydra's instantiation keys are not settings; a declared key the
    node lacks is not checked (the target's default applies) unless it is declared Required."""
    values = {k: v for k, v in node.items() if k not in HYDRA_KEYS}
    try:
        text = json.dumps(values, default=_jsonable)  # nan stays NaN: refused below
    except (TypeError, ValueError) as e:
        raise UserError(f"{prefix or 'the config'} holds a value that is no setting: {e}") from e
    try:
        _adapter(tuple(declared.items()), open_keys).validate_json(text, strict=True)
    except ValidationError as e:
        raise UserError(_one_line(prefix, values, declared, e)) from e


_typed_dict: Any = typing_extensions.TypedDict  # called with a dict built here: mypy cannot follow
_CONFIG = ConfigDict(arbitrary_types_allowed=True, allow_inf_nan=False)


def _jsonable(value: Any) -> Any:
    """A value json cannot write, as it reads: numpy's scalars (np.float32(0.5), which the
    Python API is given) as the Python numbers they hold, anything else as pydantic writes it."""
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item) and getattr(value, "ndim", 1) == 0:
        return item()
    return to_jsonable_python(value)


def _adapter(declared: tuple[tuple[str, Any], ...], open_keys: bool) -> TypeAdapter[Any]:
    try:
        return _cached_adapter(declared, open_keys)
    except TypeError:  # an annotation that cannot be hashed: build it uncached
        return _cached_adapter.__wrapped__(declared, open_keys)


@functools.cache
def _cached_adapter(declared: tuple[tuple[str, Any], ...], open_keys: bool) -> TypeAdapter[Any]:
    fields = {name: _checkable(annotation) for name, annotation in declared}
    node = _typed_dict("Node", fields, total=False)
    node.__pydantic_config__ = ConfigDict(
        arbitrary_types_allowed=True, allow_inf_nan=False, extra="allow" if open_keys else "forbid"
    )
    return TypeAdapter(node)


def _checkable(annotation: Any) -> Any:
    """`annotation`, or Any where pydantic cannot check it (a library's TypeVar, a protocol).
    Required (a key the node must have: lipt.core.settings) stays around what is checked."""
    if typing_extensions.get_origin(annotation) is typing_extensions.Required:
        return typing_extensions.Required[_checkable(typing_extensions.get_args(annotation)[0])]
    for config in (_CONFIG, None):  # a TypedDict or dataclass carries its own config
        try:
            TypeAdapter(annotation, config=config)
            return annotation
        except Exception:
            continue
    return Any


def _one_line(
    prefix: str, values: Mapping[str, Any], declared: Mapping[str, Any], error: ValidationError
) -> str:
    """pydantic's first error as a user's one line: the key, its value and what would fit (the
    messages of a union's members joined)."""
    errors = error.errors()
    first = errors[0]
    path, value = _key_path(values, first["loc"], first["type"] == "missing")
    key = ".".join([prefix, *path] if prefix else path)
    if first["type"] == "extra_forbidden":
        allowed = ", ".join(declared) if len(path) == 1 else ""
        return f"{key} is not a setting here; remove it" + (
            f" (settings of {prefix or 'the config'}: {allowed or 'none'})"
            if len(path) == 1
            else ""
        )
    if first["type"] == "missing":
        # Absent from the composed config, so Hydra takes it only with `+`; all missing keys are
        # named at once (a config file of one's own may lack several).
        paths = [_key_path(values, e["loc"], True)[0] for e in errors if e["type"] == "missing"]
        keys = [".".join([prefix, *p] if prefix else p) for p in paths]
        them = "it" if len(keys) == 1 else "them"
        return (
            f"{_and(keys)} must be set; pass {' '.join(f'+{k}=...' for k in keys)}, or add "
            f"{them} to the config file"
        )
    same = [e["msg"] for e in errors if _key_path(values, e["loc"], False)[0] == path]
    should = "Input should be "
    if all(m.startswith(should) for m in same):  # "a valid integer or less than 1"
        same = [should + " or ".join(dict.fromkeys(m.removeprefix(should) for m in same))]
    wanted = " or ".join(dict.fromkeys(same))
    return f"{key}={_shown(value)} is invalid: {wanted[:1].lower()}{wanted[1:]}"


def _key_path(values: Any, loc: tuple[Any, ...], missing: bool) -> tuple[list[str], Any]:
    """The keys of `loc` that name a node's keys (pydantic adds a union member's tag), down to
    the first list, and the value found there."""
    path: list[str] = []
    for part in loc[:-1] if missing else loc:
        if not isinstance(values, Mapping) or part not in values:
            break
        path.append(str(part))
        values = values[part]
    return ([*path, str(loc[-1])] if missing else path), values


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _shown(value: Any) -> str:
    return repr(value) if not isinstance(value, list | dict) else str(value)


@functools.cache
def parameters(target: Callable[..., Any], skip: Sequence[str] = ()) -> tuple[dict[str, Any], bool]:
    """The annotated parameters of `target` (a function, a class, a dataclass) that a config may
    set, and whether it takes **kwargs (then undeclared keys pass through). `skip`: those lipt
    passes itself (a selector's pool, budget and generator). An annotation that does not resolve
    here (a library's forward reference) declares nothing: Any."""
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
        holder = type("Holder", (), {"__annotations__": {name: annotation}})
        try:
            hints[name] = typing.get_type_hints(holder, globalns=namespace, include_extras=True)[
                name
            ]
        except Exception:
            continue
    return hints
