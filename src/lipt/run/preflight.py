"""The checks of a composed config that need the libraries: the Trainer, the loggers, the
pre-training parts, the selector and the data files. `lipt.run.config.validate` runs them after its
cheap checks, before any stage starts, so a setting read only by main training fails before
minutes of pre-training.

Each check builds or binds the real object (the Trainer from `cfg.trainer`, the loggers, the
parts of pre-training, the selector's partial) rather than re-implementing its rules.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from lipt.core import console
from lipt.core.errors import UserError
from lipt.core.settings import SelectorSettings
from lipt.stages.run import Run

if TYPE_CHECKING:
    from lipt.data.datamodule import DataModule  # torch: imported where a dry run builds


def resolved(node: Any) -> Any:
    """A composed node as plain values, its interpolations resolved against the whole config
    (gradmatch's batch_size: ${batch_size}): what lipt.stages.build.build_part takes."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def innermost(e: BaseException) -> str:
    """The innermost message of a library's refusal, on one line: Hydra wraps the library's own
    error (a TypeError of a key it does not take, a ValueError of a value it refuses)."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# Rows, classes and features of the tiny pool the selector is tried on.
DRY_RUN_ROWS, DRY_RUN_FEATURES = 64, 8


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Building a Trainer logs the device banner; it is logged again when the stage builds it."""
    names = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
    with console.loggers_at(logging.ERROR, *names), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def refused_as(what: str, fix: str | None) -> Iterator[None]:
    """A library's refusal in the block as one line: `what` settings are invalid, fix `fix`.*"""
    try:
        yield
    except UserError:
        raise
    except Exception as e:  # Hydra wraps the part's own TypeError, ValueError, Misconfiguration
        tail = "" if fix is None else f"; fix {fix}.*"
        raise UserError(f"{what} settings are invalid: {innermost(e)}{tail}") from e


def check_trainer(cfg: DictConfig) -> None:
    """Build the Trainer of `cfg.trainer` (no logger, no checkpoints, in a scratch folder).
    Submitting to SLURM, a GPU this host lacks is the nodes' (a login node has none): the rest
    of trainer.* is built on the CPU here, and the jobs' GPUs are held to what they ask of
    SLURM (lipt.run.slurm.check_job_gpus)."""
    import torch
    from hydra.utils import instantiate

    from lipt.run.slurm import submits_to_slurm

    node = cfg.trainer
    gpu = str(node.get("accelerator")) in ("gpu", "cuda")
    if gpu and not torch.cuda.is_available() and submits_to_slurm():
        node = OmegaConf.merge(node, {"accelerator": "cpu", "devices": 1})
    with tempfile.TemporaryDirectory() as scratch, _quiet(), refused_as("trainer", "trainer"):
        instantiate(node, logger=False, enable_checkpointing=False, default_root_dir=scratch)


def check_optimizer(cfg: DictConfig) -> None:
    """Build the `optimizer` on one parameter and the `scheduler` on it, and step both once:
    a value the optimiser or the schedule refuses fails now, not when training starts."""
    import torch

    from lipt.models.schedules import Clock, is_torch_scheduler
    from lipt.stages.build import build_part

    parameter = torch.nn.Parameter(torch.zeros(1))
    with refused_as("optimizer", "optimizer"):
        optimizer = build_part(resolved(cfg.optimizer))([parameter])
    with refused_as("scheduler", "scheduler"):
        make = build_part(resolved(cfg.scheduler))
        clock = Clock(total_steps=lambda: 10)
        schedule = make(optimizer) if is_torch_scheduler(make) else make(optimizer, clock)
        parameter.grad = torch.zeros(1)
        optimizer.step()
        if isinstance(schedule, torch.optim.lr_scheduler.ReduceLROnPlateau):
            schedule.step(0.0)  # it steps on the monitored metric (lipt.models.classifier)
        elif schedule is not None:
            schedule.step()


# Keys of a logger's node that name the folder it writes (Lightning's and wandb's).
LOGGER_DIRS = ("save_dir", "dir", "log_dir", "root_dir")


def check_loggers(cfg: DictConfig) -> None:
    """Build each logger in a scratch folder, and TensorBoard's writer, which takes the keys its
    class does not (made at the first metric otherwise: after pre-training). wandb's extra keys
    are wandb.init's: bound to its signature, not called (that would start a run)."""
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    from lipt.stages.build import build_part

    for name, node in (cfg.get("logger") or {}).items():
        if node is None or "_target_" not in node:
            continue
        where = f"logger.{name}"
        with tempfile.TemporaryDirectory() as scratch, refused_as(where, where):
            folders = {key: scratch for key in LOGGER_DIRS if key in node}
            logger = build_part({**resolved(node), **folders})
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.close()
            if isinstance(logger, WandbLogger):
                import wandb

                inspect.signature(wandb.init).bind(**logger._wandb_init)


def check_written_folders(cfg: DictConfig) -> None:
    """Each folder a run writes that a user may name takes files: the loggers', a checkpoint
    callback's and the learners'."""
    keys = ["pretrain.learner_dir"]
    for group, named in (("logger", LOGGER_DIRS), ("callbacks", ("dirpath",))):
        for name, node in (cfg.get(group) or {}).items():
            keys += [f"{group}.{name}.{key}" for key in named if key in (node or {})]
    for key in keys:
        folder = OmegaConf.select(cfg, key)
        problem = None if folder is None else unwritable(Path(str(folder)))
        if problem is not None:
            raise UserError(f"{key}={folder} cannot be written ({problem}); choose a writable one")


def unwritable(folder: Path) -> str | None:
    """Why files cannot be made in `folder` (None when they can): it, or the nearest folder
    above it that exists (the one it would be created in), takes a new file. A probe file is
    made and removed: permission bits alone do not tell (root, read-only mounts)."""
    probe = folder.expanduser().absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a folder"
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".lipt-probe-")
    except OSError as e:
        return f"{probe} is not writable: {e.strerror}"
    os.close(fd)
    os.unlink(name)
    return None


# The groups built with lipt.stages.build.build_part before or during pre-training and label
# cleaning (the budget is built with the run's settings, lipt.run.config).
PARTS = ("pretrain", "augment", "prune", "merge", "clean")


def check_parts(cfg: DictConfig) -> None:
    """Build each part and callback once: a key its class does not take (an experiment's
    `pretrain.epochs` reaching pretrain=jigsaw) or a value it refuses fails now, not when its
    stage starts; what a callback monitors must be a metric the Lightning module logs."""
    from lipt.models.classifier import LOGGED_METRICS
    from lipt.stages.build import build_part

    for group in PARTS:
        node = cfg.get(group)
        if node is not None and "_target_" in node:
            with refused_as(f"{group}={node.get('name', node._target_)}", group):
                build_part(resolved(node))
    for name, node in (cfg.get("callbacks") or {}).items():
        if node is None or "_target_" not in node:
            continue
        with refused_as(f"callbacks.{name}", f"callbacks.{name}"):
            build_part(resolved(node))
        monitor = node.get("monitor")
        if monitor is not None and monitor not in LOGGED_METRICS:
            raise UserError(
                f"callbacks.{name}.monitor={monitor} is not a metric the model logs; use one "
                f"of {', '.join(LOGGED_METRICS)}"
            )


def check_selector(cfg: DictConfig) -> None:
    """Instantiate the selector's partial, bind its keys, and run it once on a tiny pool, so a
    bad value (an unknown `greedy` mode, a negative `eta`) fails now, not after pre-training."""
    import torch

    from lipt.selection import PoolOutputs, SelectionInputs, select_balanced
    from lipt.stages.build import build_selector

    node = cfg.get("selector")
    if SelectorSettings.of(node) is None:  # selector=none
        return
    name = node.get("name")
    with refused_as(f"selector={name}", None):
        fn = build_selector(resolved(node))
        inspect.signature(fn.func).bind_partial(*fn.args, **fn.keywords)
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
        raise UserError(f"selector={name} settings are invalid: {innermost(e)}") from e


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


# Checks that only build objects from settings, with the settings they read: within one
# process (a sweep's dry run, the config fuzz test) a setting already built is not built again.
# The checks that look at files run every time.
BUILDS: tuple[tuple[Callable[[DictConfig], None], tuple[str, ...]], ...] = (
    (lambda cfg: check_trainer(cfg) if "trainer" in cfg else None, ("trainer",)),
    (lambda cfg: check_loggers(cfg), ("logger",)),
    (lambda cfg: check_optimizer(cfg), ("optimizer", "scheduler")),
    (lambda cfg: check_parts(cfg), (*PARTS, "callbacks")),
    (lambda cfg: check_selector(cfg), ("selector", "dataset.num_classes")),
)
_BUILT: set[tuple[int, str]] = set()


def settings_of(cfg: DictConfig, keys: Sequence[str]) -> str:
    """The resolved values of `keys`, as one string (a cache key)."""
    values = {key: resolved(OmegaConf.select(cfg, key)) for key in keys}
    return json.dumps(values, sort_keys=True, default=str)


def preflight(cfg: DictConfig) -> None:
    """The library-backed checks, in order of cost."""
    check_data_files(cfg)
    check_written_folders(cfg)
    for number, (check, keys) in enumerate(BUILDS):
        done = (number, settings_of(cfg, keys))
        if done not in _BUILT:
            check(cfg)
            _BUILT.add(done)


def reads_saved_inputs(run: Run) -> bool:
    """Whether the run reads what an earlier stage saved: train.py's `subset_path`, select.py's
    `ckpt_path`."""
    settings = run.settings
    subset = settings.stage == "train" and settings.subset_path is not None
    return subset or (settings.stage == "select" and settings.ckpt_path is not None)


def check_saved_inputs(run: Run, dm: DataModule) -> None:
    """What a run reads that an earlier stage saved, checked as the run checks it, on the data
    module `dm` built for it: train.py's `subset_path` against this data, split, fraction and
    selector; select.py's `ckpt_path` against this data, split and model."""
    from lipt.stages.build import build_parts
    from lipt.stages.pretrain import load_pretrained
    from lipt.stages.select import load_checked_subset

    settings = run.settings
    assert reads_saved_inputs(run), "no saved input to check"
    if settings.stage == "train":
        load_checked_subset(dm, Path(str(settings.subset_path)), run)
    else:
        with _quiet():
            load_pretrained(run, build_parts(run, dm), Path(str(settings.ckpt_path)))


def build_everything(run: Run, loaded: dict[str, Any]) -> None:
    """`dry_run=true`: past the checks above, build what the run builds first (the data module,
    its data read and split, labels replaced, as the run sets it up; the model and its
    Lightning module) without training or writing anything; a step budget's epochs on the pool
    as read are held to `optimized_metric`'s validations; a saved subset or pre-trained model
    the run reads is checked against them (`check_saved_inputs`). `loaded` holds the settings
    of the data and models this dry run built already (a data module is checked, not kept: its
    pool's size is)."""
    from lipt.stages.build import build_classifier, build_datamodule, build_model
    from lipt.stages.training_plan import (
        check_validated_within,
        check_whole_pool_validation,
        schedule_of,
    )

    def key(*values: Any) -> str:
        return json.dumps(values, sort_keys=True, default=str)

    data = key(run.node("dataset"), run.settings.batch_size)
    seed = run.settings.seed
    model = key(run.node("model"), run.node("optimizer"), run.node("scheduler"), seed)
    try:
        saved = reads_saved_inputs(run)
        if data not in loaded or saved:
            # the split and the labels: what only the data can refute
            dm = build_datamodule(run)
            loaded[data] = len(dm.pool_indices)
        metric, pool = run.settings.optimized_metric, loaded[data]
        if "_target_" not in run.node("clean"):  # the pool main training reads, as read
            if metric is not None:  # a step budget's epochs on this pool
                check_validated_within(run, schedule_of(run, pool, pool).epochs, pool)
            check_whole_pool_validation(run, pool)  # the whole pool's epochs, or pruned ones
        if model not in loaded:
            with _quiet():
                loaded[model] = build_classifier(run, build_model(run, seed))
        if saved:
            check_saved_inputs(run, dm)
    except UserError:
        raise
    except Exception as e:  # a file that does not parse, a model that cannot be built
        raise UserError(f"the run cannot be built: {innermost(e)}") from e
