"""The stages' builder: a run's parts, instantiated from its resolved group nodes
(lipt.stages.run.Run): data module, models, Lightning module, trainer, loggers, callbacks, the
selector, label cleaning's method and pre-training's parts. Each group's option names its class
or function with `_target_` (Hydra's `instantiate`, on plain values: the composed config stays
above, in lipt.run.config).

`build_parts` is the composition root: a stage builds its `Parts` once, before any work, and
hands them down; the stages below call them and build none of their own. Main training's
loggers, callbacks and Trainer are built once too, by its plan (lipt.stages.training_plan).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import lightning as L
import torch
from hydra.utils import instantiate
from torch import nn

from lipt.cleaning import JigsawCleaning, KFoldCleaning
from lipt.core import console
from lipt.core.artifacts import AtomicCheckpointIO
from lipt.core.job import sweep_dir_of_job
from lipt.core.settings import MODEL_RUN_KEYS, DatasetSettings, SelectorSettings
from lipt.data import DataModule
from lipt.jigsaw.context import PretrainContext, Strategy
from lipt.models.classifier import QUIET_TRAINER, Classifier
from lipt.models.options import apply_speed_options
from lipt.models.schedules import LEARNER_SCHEDULES
from lipt.selection import Selection, Selector
from lipt.stages.run import Run

# A `clean` option's method (lipt.cleaning): lipt's jigsaw finder or cleanlab's K folds.
CleaningMethod = JigsawCleaning | KFoldCleaning


@dataclass(frozen=True)
class Parts:
    """A run's parts, built once from its group nodes before any stage works (`build_parts`)
    and handed down: the stages call these and build none of their own."""

    dm: DataModule  # set up: the splits and the pool
    initial_model: Callable[[int], nn.Module]  # seed -> the common initial model
    classifier: Callable[..., Classifier]  # (model, **overrides) -> the Lightning module
    quiet_trainer: Callable[..., L.Trainer]  # (**overrides) -> an inner stage's trainer
    device: torch.device  # where held-out scoring runs
    pretrain: Strategy  # the `pretrain` option
    context: PretrainContext  # what `pretrain` needs of the run
    selector: Selector | None  # the `selector` function, its keys bound (None: selector=none)
    cleaning: CleaningMethod | None  # the `clean` option's method (None: clean=none)


def build_parts(run: Run, dm: DataModule | None = None) -> Parts:
    """The run's parts, each built once (`dm`: the data module, where the caller has one)."""
    dm = build_datamodule(run) if dm is None else dm

    def classifier(model: nn.Module, **overrides: Any) -> Classifier:
        return build_classifier(run, model, **overrides)  # a test may wrap it

    trainer = functools.partial(quiet_trainer, run)
    device = scoring_device(run)
    clean = run.node("clean")
    selector = None if run.selector is None else build_selector(run.node("selector"))
    context = PretrainContext(
        data_name=dm.data_name,
        num_classes=run.dataset.num_classes,
        model_config=run.node("model"),
        pretrain_name=run.pretrain_name,
        run_seed=run.settings.seed,
        fraction=float(run.settings.fraction),
        main_epochs=run.main_epochs,
        device=device,
        run_dir=lambda: run.folder,
        classifier=classifier,
        optimizer=optimizer_settings(run),
        trainer=trainer,
        trainer_config=run.node("trainer"),
        augment=build_part(run.node("augment")),
        prune=build_part(run.node("prune")),
        merge=build_part(run.node("merge")),
    )
    return Parts(
        dm=dm,
        initial_model=functools.partial(build_model, run),
        classifier=classifier,
        quiet_trainer=trainer,
        device=device,
        pretrain=build_part(run.node("pretrain")),
        context=context,
        selector=selector,
        cleaning=build_part(clean) if "_target_" in clean else None,
    )


def build_datamodule(run: Run) -> DataModule:
    """The `dataset` node's data module (`_target_`, lipt.data.DataModule), set up: its keys
    less the label and the reader's, which `load` has taken already."""
    node = DatasetSettings.module_node(run.node("dataset"))
    dm = instantiate(node, batch_size=run.settings.batch_size, _convert_="all")
    if dm.device is None:  # no trainer yet (jigsaw learners, scoring): where the trainer says
        dm.device = str(scoring_device(run))
    dm.setup()
    return cast(DataModule, dm)


def build_model(run: Run, seed: int) -> nn.Module:
    """The seeded random init: the same seed gives the same weights on every rank and job."""
    model_node = run.node("model")
    node = {k: v for k, v in model_node.items() if k not in MODEL_RUN_KEYS}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = instantiate(node)
    return apply_speed_options(
        model,
        bool(model_node.get("channels_last", False)),
        bool(model_node.get("compile", False)),
    )


# Keys of a selector config that are lipt's (SelectorSettings), not the selector function's.
RESERVED_SELECTOR_KEYS = tuple(SelectorSettings.keys())


def build_selector(node: Mapping[str, Any]) -> functools.partial[Selection]:
    """The `selector` node's function, its keys bound (`_partial_: true`), lipt's own left out."""
    return cast(functools.partial[Selection], build_part(node, RESERVED_SELECTOR_KEYS))


def build_part(node: Mapping[str, Any], reserved: Sequence[str] = ()) -> Any:
    """The object a group's resolved node names with `_target_` (a functools.partial with
    `_partial_: true`), the `reserved` keys (lipt's own, not the target's) left out. Every group
    is chosen this way: selector, pretrain, merge, prune, augment, model, dataset, trainer. The
    node holds plain values (Run.node): resolved with the whole config, it saw the top-level
    keys it interpolates (gradmatch's batch_size: ${batch_size})."""
    kept = {k: v for k, v in node.items() if k not in reserved}
    return instantiate(kept, _convert_="all")


def scoring_device(run: Run) -> torch.device:
    """Where held-out scoring of jigsaw soups runs: the GPU unless the trainer is told CPU."""
    accelerator = str(run.node("trainer").get("accelerator", "auto"))
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def optimizer_settings(run: Run, **overrides: Any) -> dict[str, Any]:
    """The `optimizer` group's node, resolved, with the `overrides` that are not None (a jigsaw
    learner's lr and weight decay, pretrain.optim)."""
    settings = run.node("optimizer")
    return {**settings, **{k: v for k, v in overrides.items() if v is not None}}


def build_classifier(
    run: Run,
    model: nn.Module,
    lr: float | None = None,
    weight_decay: float | None = None,
    scheduler: str | None = None,
    **options: Any,
) -> Classifier:
    """The Lightning module with the groups `optimizer` and `scheduler` (functools.partials).
    A jigsaw learner passes its own `lr`, `weight_decay` and schedule name (pretrain.optim);
    `options` are the Classifier's (dynamic pruning's loss_norm and schedule_over)."""
    settings = optimizer_settings(run, lr=lr, weight_decay=weight_decay)
    optimizer = instantiate(settings, _convert_="all")
    if scheduler is None:
        schedule = build_part(run.node("scheduler"))
    else:
        schedule = LEARNER_SCHEDULES[scheduler]
    return Classifier(
        model,
        num_classes=run.dataset.num_classes,
        optimizer=optimizer,
        scheduler=schedule,
        **options,
    )


def build_callbacks(
    run: Run,
    loggers: Sequence[Any],
    bars: bool,
    validation: bool = True,
    validations_per_epoch: int = 1,
) -> list[L.Callback]:
    """Main training's `callbacks` group, beside lipt's own (the rolling last.ckpt, re-selection,
    dynamic pruning). Left out where the run lacks what they need: a progress bar when bars are
    off (piped output, CI, a multirun job), a learning-rate monitor without a logger, one that
    monitors a validation metric without a validation split. An early stop's patience is in
    epochs (the group's default, the run's epochs, never stops a run): Lightning counts it in
    validations, so it is multiplied by the `validations_per_epoch` of a trainer that
    validates within epochs (trainer.val_check_interval)."""
    from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ProgressBar

    callbacks = []
    for node in run.node("callbacks").values():
        if node is None or "_target_" not in node:
            continue
        if not validation and str(node.get("monitor", "")).startswith("val/"):
            continue
        callback = build_part(node)
        if isinstance(callback, ProgressBar) and not bars:
            continue
        if isinstance(callback, LearningRateMonitor) and not loggers:
            continue
        if isinstance(callback, EarlyStopping) and not callback._check_on_train_epoch_end:
            callback.patience *= validations_per_epoch  # (checked once an epoch where true)
        callbacks.append(callback)
    return callbacks


def build_loggers(run: Run) -> list:
    """The `logger` group's loggers; a wandb run of a multirun is grouped by its sweep."""
    loggers = []
    for node in run.node("logger").values():
        if node is None or "_target_" not in node:
            continue
        extra = {}
        if "group" in node and node["group"] is None and (group := sweep_name()) is not None:
            extra["group"] = group
        logger = instantiate(node, **extra)
        # Lightning's WandbLogger always hands wandb.init `anonymous=None`, which wandb >= 0.19
        # answers with a deprecation notice on the terminal; unset, it says nothing.
        init = getattr(logger, "_wandb_init", None)
        if isinstance(init, dict) and init.get("anonymous", "") is None:
            del init["anonymous"]
        loggers.append(logger)
    return loggers


def sweep_name() -> str | None:
    """The sweep folder (relative to the working directory when below it) inside a Hydra
    multirun, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    sweep = sweep_dir_of_job()
    return None if sweep is None else console.shown(sweep)  # multirun/<stage>/<date>/<time>


def build_trainer(run: Run, **overrides: Any) -> L.Trainer:
    """The trainer from `trainer.*`, with `overrides` winning (e.g. a learner's max_epochs)."""
    node = run.node("trainer")
    kwargs = {
        "default_root_dir": str(run.folder),
        "plugins": [AtomicCheckpointIO()],
        **overrides,
    }
    if kwargs.get("enable_progress_bar", node.get("enable_progress_bar")) is None:
        kwargs["enable_progress_bar"] = console.bars_enabled()  # null: a bar on a terminal only
    return instantiate(node, **kwargs)


def progress_bars(run: Run) -> bool:
    """Whether main training's trainer draws a progress bar (trainer.enable_progress_bar, null:
    on a terminal only)."""
    setting = run.node("trainer").get("enable_progress_bar")
    return console.bars_enabled() if setting is None else bool(setting)


# What makes a trainer one process on one device, whatever main training's spans: inner stages
# run in rank 0 alone, so a trainer of several (trainer.num_nodes=2) waited for ranks that never
# came, the other nodes' ranks waiting for rank 0's subset.
ONE_PROCESS = {"devices": 1, "num_nodes": 1, "strategy": "auto"}


def quiet_trainer(run: Run, **overrides: Any) -> L.Trainer:
    """A single-device trainer for inner stages (warm-up, learners, cleaning's folds):
    QUIET_TRAINER's settings, `overrides` winning."""
    return build_trainer(run, **{**ONE_PROCESS, **QUIET_TRAINER, **overrides})
