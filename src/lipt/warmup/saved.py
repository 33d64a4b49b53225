"""Where a full warm-up keeps its progress: a Lightning checkpoint after every epoch, named by
what its weights depend on, so a run killed mid-warm-up and run again in its folder goes on
from its last epoch instead of starting over, and a finished one is not trained twice."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from lipt.core.settings import MODEL_RUN_KEYS
from lipt.data import DataModule
from lipt.jigsaw.checkpoints import TRAINER_KEYS_OUTSIDE_RECIPE
from lipt.jigsaw.context import PretrainContext, data_split
from lipt.models.classifier import Classifier

WARMUP_DIR = "warmup"


def warmup_checkpoint(
    ctx: PretrainContext, dm: DataModule, module: Classifier, seed: int, epochs: int
) -> Path:
    """`<run>/warmup/full_<digest>.ckpt`: the digest of `warmup_recipe`, so a checkpoint of
    other settings is never resumed from."""
    recipe = json.dumps(warmup_recipe(ctx, dm, module, seed, epochs), sort_keys=True, default=str)
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:16]
    return Path(ctx.run_dir()) / WARMUP_DIR / f"full_{digest}.ckpt"


def warmup_recipe(
    ctx: PretrainContext, dm: DataModule, module: Classifier, seed: int, epochs: int
) -> dict[str, Any]:
    """What a warm-up's weights depend on: its seed and epochs, the data, its split and
    inputs, the model, the optimiser and schedule, and the trainer keys that change steps."""
    return {
        "seed": int(seed),
        "epochs": int(epochs),
        "data": dm.data_name,
        "split": data_split(dm),
        "batch_size": dm.batch_size,
        "resident": bool(dm.is_resident),
        "inputs": [dm.image_size, list(dm.mean), list(dm.std), dm.crop_padding, bool(dm.flip)],
        "model": {k: v for k, v in ctx.model_config.items() if k not in MODEL_RUN_KEYS},
        "optimizer": ctx.optimizer,
        "scheduler": callable_name(module.make_scheduler),
        "loss": [module.loss_norm, module.schedule_over],
        "trainer": {
            k: v for k, v in ctx.trainer_config.items() if k not in TRAINER_KEYS_OUTSIDE_RECIPE
        },
    }


def callable_name(fn: Any) -> Any:
    """A schedule (a function or torch class, maybe a functools.partial) as plain values."""
    if isinstance(fn, functools.partial):
        return [callable_name(fn.func), list(fn.args), dict(sorted(fn.keywords.items()))]
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
