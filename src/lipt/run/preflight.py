"""The checks of a composed config that need the libraries: the Trainer, the loggers, the
pre-training parts, the selector and the data files. `lipt.run.config.validate` runs them after its
cheap checks, before any stage starts, so a setting read only by main training fails before
minutes of pre-training.

Each check builds or binds the real object (the Trainer from `cfg.trainer`, the parts of
pre-training, the selector's partial, the logger class's signature) rather than re-implementing
its rules.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lipt.run import console
from lipt.run.errors import UserError
from lipt.run.training_groups import check_callbacks, check_optimizer
from lipt.run.selector import selector_settings

# Rows, classes and features of the tiny pool the selector is tried on.
DRY_RUN_ROWS, DRY_RUN_FEATURES = 64, 8


def _cause(e: BaseException) -> str:
    """The innermost message, on one line: Hydra wraps the library's own error."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Building a Trainer logs the device banner; it is logged again when the stage builds it."""
    names = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
    with console.loggers_at(logging.ERROR, *names), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def check_trainer(cfg: DictConfig) -> None:
    """Build the Trainer of `cfg.trainer` (no logger, no checkpoints, in a scratch folder)."""
    from hydra.utils import instantiate

    with tempfile.TemporaryDirectory() as scratch, _quiet():
        try:
            instantiate(
                cfg.trainer, logger=False, enable_checkpointing=False, default_root_dir=scratch
            )
        except Exception as e:  # Lightning raises TypeError, ValueError, Misconfiguration...
            raise UserError(f"trainer settings are invalid: {_cause(e)}; fix trainer.*") from e


def check_loggers(cfg: DictConfig) -> None:
    """Each logger class imports and accepts the configured keys."""
    import importlib

    for name, node in (cfg.get("logger") or {}).items():
        if node is None or "_target_" not in node:
            continue
        module, _, attr = str(node._target_).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except Exception as e:
            raise UserError(
                f"logger={name} cannot be used ({_cause(e)}); install its package "
                "or choose logger=csv"
            ) from e
        kwargs = {str(k): v for k, v in node.items() if k != "_target_"}
        try:
            inspect.signature(cls).bind(**kwargs)
        except TypeError as e:
            raise UserError(f"logger.{name} settings are invalid: {e}") from e


# The groups built with lipt.run.build.build_part before or during pre-training, and main
# training's dynamic pruning.
PARTS = ("pretrain", "augment", "prune", "merge", "dynamic")


def check_parts(cfg: DictConfig) -> None:
    """Build each part once: a key its class does not take (an experiment's `pretrain.epochs`
    reaching pretrain=jigsaw) or a value it refuses fails now, not when its stage starts."""
    from lipt.run.build import build_part

    for group in PARTS:
        node = cfg.get(group)
        if node is None or "_target_" not in node:
            continue
        try:
            build_part(node)
        except Exception as e:  # Hydra wraps the TypeError or ValueError of the part's own init
            name = node.get("name", node._target_)
            raise UserError(
                f"{group}={name} settings are invalid: {_cause(e)}; fix {group}.*"
            ) from e


def check_selector(cfg: DictConfig) -> None:
    """Instantiate the selector's partial, bind its keys, and run it once on a tiny pool, so a
    bad value (an unknown `greedy` mode, a negative `eta`) fails now, not after pre-training."""
    import torch

    from lipt.run.build import build_selector
    from lipt.selection import PoolOutputs, SelectionInputs, select_balanced

    node = cfg.get("selector")
    if node is None or selector_settings(node).is_full:
        return
    name = node.get("name")
    for key, kind in (("balance", bool), ("needs_model", bool)):
        if key in node and not isinstance(node[key], kind):
            raise UserError(f"selector.{key}={node[key]!r} is invalid: use true or false")
    try:
        fn = build_selector(node)
        inspect.signature(fn.func).bind_partial(*fn.args, **fn.keywords)
    except Exception as e:
        raise UserError(f"selector={name} settings are invalid: {_cause(e)}") from e
    classes = int(cfg.dataset.num_classes)
    g = torch.Generator().manual_seed(0)

    def outputs(n: int) -> PoolOutputs:
        return PoolOutputs(
            logits=torch.randn(n, classes, generator=g),
            embeddings=torch.relu(torch.randn(n, DRY_RUN_FEATURES, generator=g)),
            targets=torch.arange(n) % classes,
            indices=torch.arange(n),
        )

    rows = max(DRY_RUN_ROWS, 4 * classes)
    inputs = SelectionInputs(
        pool=outputs(rows),
        val=outputs(rows // 2),
        classifier_weight=torch.randn(classes, DRY_RUN_FEATURES, generator=g),
        classifier_bias=torch.zeros(classes),
    )
    budget = rows // 4
    try:
        if node.get("balance", False):
            select_balanced(fn, inputs, budget, generator=g)
        else:
            fn(inputs, budget, generator=g)
    except UserError as e:
        raise UserError(f"selector={name}: {e}") from e
    except (TypeError, ValueError) as e:
        raise UserError(f"selector={name} settings are invalid: {_cause(e)}") from e


def check_readable(path: Path, key: str) -> None:
    """`path` opens for reading (a file) or lists (a folder)."""
    try:
        if path.is_dir():
            next(iter(os.scandir(path)), None)
        else:
            with open(path, "rb") as f:
                f.read(1)
    except OSError as e:
        raise UserError(f"{key}={path} is not readable ({e.strerror}); fix its permissions") from e


def check_data_files(cfg: DictConfig) -> None:
    """The data set's files are where its reader will look, and readable."""
    from lipt.data.sources import expected_files

    load = cfg.dataset.get("load")
    if load is None or "_target_" not in load:
        return
    settings: dict[str, Any] = {str(k): v for k, v in load.items() if k not in ("_target_",)}
    settings.pop("_partial_", None)
    for path in expected_files(str(load._target_), settings):
        check_readable(path, "dataset file")


def preflight(cfg: DictConfig) -> None:
    """The library-backed checks, in order of cost."""
    check_data_files(cfg)
    check_loggers(cfg)
    if "trainer" in cfg:  # main training, and pretrain=full's warm-up and the learners
        check_trainer(cfg)
    check_optimizer(cfg)
    check_callbacks(cfg)
    check_parts(cfg)
    check_selector(cfg)
