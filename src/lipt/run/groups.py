"""Each config group's node against its option's declaration: the parameters of the option's
`_target_` (lipt.core.schema.parameters) and, for the groups with lipt keys beside them, the
fields of lipt.core.settings. Imports the targets, so torch: lipt.run.config calls it in its
deep checks only.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from lipt.core.errors import UserError
from lipt.core.schema import check_mapping, parameters
from lipt.core.settings import (
    Checked,
    DatasetSettings,
    ModelOptions,
    OptimizerOptions,
    RunSettings,
    SelectorSettings,
    TrainerOptions,
)

# Parameters lipt passes itself when it calls a group's target, never set from the config.
CALL_ARGUMENTS = {"selector": ("inputs", "budget", "generator")}
# Targets lipt calls with what only the run has: their nodes are partials (`_partial_: true`).
CALLED_WITH = {
    "selector": "(inputs, budget, generator=...)",
    "optimizer": "the model's parameters",
    "scheduler": "(optimizer, clock)",
    "dataset.load": "no arguments when the data is read",
}
# lipt's own keys beside the target's parameters, by group.
OPTIONS: dict[str, type[Checked]] = {"model": ModelOptions, "selector": SelectorSettings}
# Narrower ranges lipt needs for some of a library target's parameters, where it has them
# (the schedules span trainer.max_epochs; a learning rate of 0 trains nothing).
NARROWED: dict[str, type[Checked]] = {"trainer": TrainerOptions, "optimizer": OptimizerOptions}
# Groups whose node holds one target per entry (logger: csv, wandb, ...).
MULTI = ("logger", "callbacks")
NOT_SETTINGS = ("hydra", "dataset")  # Hydra's own; dataset.*: lipt.core.settings.DatasetSettings
# Groups whose values others interpolate: checked first.
SOURCES = ("optimizer", "scheduler", "trainer", "model")


def declared_keys(group: str, node: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The keys an option of `group` may have, with their annotations, and whether undeclared
    keys pass (its target takes **kwargs)."""
    declared: dict[str, Any] = {}
    open_keys = False
    if "_target_" in node:
        target = _target(group, str(node["_target_"]))
        found, open_keys = parameters(target, skip=CALL_ARGUMENTS.get(group, ()))
        declared = dict(found)  # parameters' answer is cached: not ours to change
    if group in OPTIONS:
        declared.update(OPTIONS[group].keys())
    if group in NARROWED:
        declared.update((k, v) for k, v in NARROWED[group].keys().items() if k in declared)
    return declared, open_keys


@functools.cache  # a failed import costs ms of file lookups; a sweep's precheck asks often
def locate(path: str) -> Any:
    """The object a dotted `_target_` path names (the longest importable module, then
    attributes), without Hydra's logging of a failure. A module of the path that is there but
    fails to import (a dependency of its own missing, a syntax error) raises its own error: a
    shorter path would only report the attribute as missing."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is None or module == e.name or module.startswith(f"{e.name}."):
                continue  # this part of the path is no module: an attribute, or not there
            raise
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(f"No module named {parts[0]!r}", name=parts[0])


def _target(where: str, path: str) -> Any:
    try:
        return locate(path)
    except Exception as e:
        group, _, name = where.partition(".")
        if group in MULTI:
            other = " or choose logger=csv" if group == "logger" else ""
            raise UserError(
                f"{group}={name} cannot be used ({type(e).__name__}: {path}); install its "
                f"package{other}"
            ) from e
        why = str(e).splitlines()[0] if str(e) else ""
        raise UserError(
            f"{where}._target_={path} cannot be imported ({type(e).__name__}: {why}); give an "
            "importable function or class (its module on PYTHONPATH)"
        ) from e


def check_node(group: str, node: Mapping[str, Any]) -> None:
    """One option's node: every key declared, every value of its declared type and range. The
    message starts with the option, as `--help` lists it."""
    declared, open_keys = declared_keys(group, node)
    try:
        check_mapping(group, node, declared, open_keys)
    except UserError as e:
        name = node.get("name")
        raise UserError(f"{group}={name}: {e}" if isinstance(name, str) else str(e)) from e


def check_node_target(where: str, node: Mapping[str, Any]) -> None:
    declared, open_keys = parameters(_target(where, str(node["_target_"])))
    check_mapping(where, node, declared, open_keys)


def as_typed(value: Any) -> str:
    """A value as a command line gives it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_no_settings(group: str, node: Mapping[str, Any]) -> None:
    """An option with no `_target_` (clean=none, selector=none) calls nothing, so nothing reads
    a key beside its `name` label: one set there would be silently ignored."""
    name = node.get("name")
    option = f"{group}={name}" if isinstance(name, str) else f"this {group}"
    for key, value in node.items():
        if key != "name":
            raise UserError(
                f"{group}.{key}={as_typed(value)} is ignored: {option} takes no settings; choose a "
                f"{group} option that takes {group}.{key}, or drop it"
            )


# Trainer arguments lipt passes every Trainer it builds itself (lipt.stages.build.build_trainer:
# main training's, the learners' and the warm-up's), each with where to set it instead. Checked
# before the Trainer's own types, which would refuse a list of callbacks in pydantic's words.
SET_BY_LIPT = {
    "default_root_dir": "every trainer writes into the run folder; set hydra.run.dir instead",
    "logger": "the logger group chooses the loggers; use logger=none|csv|tensorboard|wandb",
    "plugins": "lipt sets the plugins (atomic checkpoint writes); drop it",
    "callbacks": "the callbacks group chooses main training's callbacks; add one with "
    "+callbacks.<name>._target_=..., or drop one with callbacks.<name>=null",
}


def check_set_by_lipt(trainer: Mapping[str, Any]) -> None:
    for key, fix in SET_BY_LIPT.items():
        if key in trainer:
            raise UserError(f"trainer.{key}={as_typed(trainer[key])} is ignored: {fix}")


def check_groups(cfg: DictConfig, values: Mapping[str, Any]) -> None:
    """Every group node of the resolved config `values` (`cfg`: the same, unresolved)."""
    # The groups other groups interpolate (pretrain.optim.lr is ${optimizer.lr}) come first, so a
    # bad value is named where the user set it.
    order = sorted(values, key=lambda g: SOURCES.index(g) if g in SOURCES else len(SOURCES))
    settings = RunSettings.keys()  # top-level keys that hold a mapping: paths, protocol
    for group in order:
        node = values[group]
        if group in NOT_SETTINGS or not isinstance(node, Mapping) or group not in cfg:
            continue
        if group in MULTI:
            for name, entry in node.items():
                if entry is not None and not isinstance(entry, Mapping):  # null turns one off
                    raise UserError(
                        f"{group}.{name}={entry} is not a {group.rstrip('s')}: give a node with "
                        "_target_ or remove it"
                    )
                if isinstance(entry, Mapping) and "_target_" in entry:
                    check_node_target(f"{group}.{name}", entry)
            continue
        if "_target_" not in node and group not in settings:
            check_no_settings(group, node)
        if group == "trainer":
            check_set_by_lipt(node)
        if "_target_" in node and group in CALLED_WITH:
            check_partial(group, node)
        if "_target_" in node or group in OPTIONS or group in NARROWED:
            check_node(group, node)
    dataset = values.get("dataset")
    if isinstance(dataset, Mapping):
        load = dataset.get("load")
        if isinstance(load, Mapping) and "_target_" in load:
            check_partial("dataset.load", load)
            check_node_target("dataset.load", load)
        # the data module takes the keys but the reader's (lipt.core.settings.DatasetSettings)
        module = DatasetSettings.module_node(dataset)
        module.pop("load", None)  # checked above, against the reader's own target
        check_data_module(module)


def check_partial(where: str, node: Mapping[str, Any]) -> None:
    """A target lipt calls itself, with what only the run has (CALLED_WITH), is configured as a
    partial: without `_partial_: true` Hydra would call it on its keys alone."""
    if node.get("_partial_") is not True:
        raise UserError(
            f"{where}._target_={node['_target_']} is called by lipt with {CALLED_WITH[where]}, "
            f"so {where} needs `_partial_: true` beside its _target_; add it to its config file"
        )


def check_data_module(node: Mapping[str, Any]) -> None:
    """The `dataset` node against its data module: lipt's `DataModule` or a subclass of it,
    whose pool, subsets and resident batches the stages use. A subclass that hands **kwargs on
    takes lipt's keys beside its own, and no others; `batch_size` is the top level's."""
    from lipt.data import DataModule  # torch, as every target here

    path = str(node["_target_"])
    target = _target("dataset", path)
    if isinstance(target, type) and not issubclass(target, DataModule):
        raise UserError(
            f"dataset._target_={path} is not a lipt.data.DataModule; subclass it (its `load` "
            "reads your data: lipt.data.Splits), or use lipt.PoolDataModule from Python"
        )
    declared, open_keys = parameters(target)
    if open_keys and isinstance(target, type):
        declared = {**parameters(DataModule)[0], **declared}
    declared = {k: v for k, v in declared.items() if k != "batch_size"}  # the top level's
    check_mapping("dataset", node, declared, open_keys and not isinstance(target, type))
