"""Turn config nodes into objects: data module, models, Lightning module, trainer, loggers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from lipt.artifacts import AtomicCheckpointIO
from lipt.data import DataModule
from lipt.models.options import apply_speed_options
from lipt.module import Classifier
from lipt.run_lock import lock_run_dir


def run_dir(cfg: DictConfig) -> Path:
    """The run folder, created and locked for this process (lipt.run_lock): a second run
    pointed at it is refused. Extra DDP ranks share their rank 0's folder and lock."""
    path = Path(str(cfg.paths.output_dir))
    path.mkdir(parents=True, exist_ok=True)
    if not is_ddp_child():
        lock_run_dir(path)
    return path


def is_ddp_child() -> bool:
    """True in the extra processes Lightning's DDP launcher starts by re-running the script."""
    return os.environ.get("LOCAL_RANK", "0") != "0" or os.environ.get("NODE_RANK", "0") != "0"


def build_datamodule(cfg: DictConfig) -> DataModule:
    d = cfg.dataset
    dm = DataModule(
        load=instantiate(d.load),
        num_classes=d.num_classes,
        channels=d.channels,
        image_size=d.image_size,
        mean=list(d.mean),
        std=list(d.std),
        val_size=d.val_size,
        split_seed=d.split_seed,
        batch_size=cfg.batch_size,
        num_workers=d.num_workers,
        crop_padding=d.crop_padding,
        flip=d.flip,
        eval_batch_size=d.get("eval_batch_size", 256),
        resident=d.get("resident", False),
    )
    dm.setup()
    return dm


def build_model(cfg: DictConfig, seed: int) -> nn.Module:
    """The seeded random init: the same seed gives the same weights on every rank and job."""
    # channels_last and compile are how the model runs, not constructor arguments.
    node = {k: v for k, v in cfg.model.items() if k not in ("channels_last", "compile")}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = instantiate(node)
    return apply_speed_options(
        model, bool(cfg.model.get("channels_last", False)), bool(cfg.model.get("compile", False))
    )


# Keys of a selector config that are lipt's, not the selector function's.
RESERVED_SELECTOR_KEYS = ("name", "balance", "needs_model", "repeats")


def build_selector(node: DictConfig) -> Any:
    """The `selector` group's function (a functools.partial), lipt's own keys left out. The node
    is resolved in place first: a copy of it alone cannot see top-level keys (gradmatch's
    batch_size: ${batch_size})."""
    resolved = OmegaConf.to_container(node, resolve=True)
    assert isinstance(resolved, dict)
    return instantiate({k: v for k, v in resolved.items() if k not in RESERVED_SELECTOR_KEYS})


def build_classifier(cfg: DictConfig, model: nn.Module, **optim: Any) -> Classifier:
    settings = {**OmegaConf.to_container(cfg.optim, resolve=True), **optim}  # type: ignore[dict-item]
    return Classifier(model, num_classes=cfg.dataset.num_classes, **settings)


def build_loggers(cfg: DictConfig) -> list:
    """The `logger` group's loggers; a wandb run of a multirun is grouped by its sweep."""
    loggers = []
    for node in (cfg.get("logger") or {}).values():
        if node is None or "_target_" not in node:
            continue
        extra = {}
        if "group" in node and node.group is None and (group := sweep_name()) is not None:
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
    from lipt.console import shown
    from lipt.jigsaw import sweep_dir_of_job

    sweep = sweep_dir_of_job()
    return None if sweep is None else shown(sweep)  # multirun/<stage>/<date>/<time>


def build_trainer(cfg: DictConfig, **overrides: Any) -> L.Trainer:
    """The trainer from `cfg.trainer`, with `overrides` winning (e.g. a learner's max_epochs)."""
    kwargs = {
        "default_root_dir": str(run_dir(cfg)),
        "plugins": [AtomicCheckpointIO()],
        **overrides,
    }
    if kwargs.get("enable_progress_bar", cfg.trainer.get("enable_progress_bar")) is None:
        from lipt import console

        kwargs["enable_progress_bar"] = console.bars_enabled()  # null: a bar on a terminal only
    return instantiate(cfg.trainer, **kwargs)


def quiet_trainer(cfg: DictConfig, **overrides: Any) -> L.Trainer:
    """A single-device trainer for inner stages (warm-up, learners): no logger, no checkpoints,
    no progress bar clutter."""
    settings = dict(
        devices=1,
        strategy="auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    settings.update(overrides)
    return build_trainer(cfg, **settings)


def state_dict_cpu(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
