"""Jigsaw learner checkpoints: what a learner file holds, which recipe it must match to be
merged, where a run or a multirun's jobs keep them, and training a learner only when no finished
checkpoint of it is there (a killed run, a sweep whose other jobs died, resumes).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from lipt.core import console
from lipt.core.artifacts import LEARNERS_DIR, load_checkpoint, save_checkpoint
from lipt.core.errors import UserError
from lipt.core.job import sweep_dir_of_job
from lipt.data import DataModule
from lipt.jigsaw.context import PretrainContext, pool_labels_digest
from lipt.jigsaw.learner import Learner, learner_shards, train_learner
from lipt.jigsaw.merge import check_shards_held_out
from lipt.jigsaw.parts import JigsawSettings
from lipt.jigsaw.weights import is_finite_state_dict
from lipt.models.classifier import QUIET_TRAINER

log = logging.getLogger(__name__)


# `trainer` keys that leave a learner's weights as they are: those its single-device quiet
# trainer overrides (QUIET_TRAINER; max_epochs is pretrain.local_epochs) and those that say where
# it runs, how exactly it computes or what it logs. Every other key (precision, max_steps,
# gradient_clip_val, accumulate_grad_batches, limit_train_batches, ...) is part of the recipe.
TRAINER_KEYS_OUTSIDE_RECIPE = frozenset(
    {
        *QUIET_TRAINER,
        "max_epochs",
        "devices",
        "strategy",
        "callbacks",
        "accelerator",
        "num_nodes",
        "plugins",
        "default_root_dir",
        "sync_batchnorm",
        "use_distributed_sampler",
        "deterministic",
        "benchmark",
        "log_every_n_steps",
        "limit_test_batches",
        "limit_predict_batches",
        "val_check_interval",
        "check_val_every_n_epoch",
        "profiler",
    }
)


def recipe(
    ctx: PretrainContext, settings: JigsawSettings, dm: DataModule, seed: int
) -> dict[str, Any]:
    """What makes learners of one soup: a learner checkpoint must match it to be merged."""
    return {
        "data": dm.data_name,
        "pool_size": len(dm.pool_indices),
        "labels": pool_labels_digest(dm),
        "seed": int(seed),
        "model": ctx.model_config,
        "num_learners": int(settings.num_learners),
        "batches_per_learner": int(settings.batches_per_learner),
        "local_epochs": int(settings.local_epochs),
        "batch_size": dm.batch_size,
        "optim": {**ctx.optimizer, **settings.learner_optim()},
        "trainer": {
            k: v for k, v in ctx.trainer_config.items() if k not in TRAINER_KEYS_OUTSIDE_RECIPE
        },
        # The data set's own augmentation and normalisation, under `augment`'s.
        "inputs": {
            "image_size": dm.image_size,
            "mean": list(dm.mean),
            "std": list(dm.std),
            "crop_padding": dm.crop_padding,
            "flip": bool(dm.flip),
        },
        "augment": dataclasses.asdict(ctx.augment),
        "prune": {"method": type(ctx.prune).__name__, **dataclasses.asdict(ctx.prune)},
    }


def recipe_difference(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """The recipe keys whose values differ, a nested one as `trainer.max_steps`."""
    names = []
    for key, value in expected.items():
        theirs = got.get(key)
        if theirs == value:
            continue
        if isinstance(value, dict) and isinstance(theirs, dict):
            inner = sorted(set(value) | set(theirs))
            names += [f"{key}.{k}" for k in inner if value.get(k) != theirs.get(k)]
        else:
            names.append(key)
    return sorted(names)


def learner_file(learner: int) -> str:
    return f"learner_{learner}.ckpt"


def learner_payload(
    ctx: PretrainContext, settings: JigsawSettings, dm: DataModule, seed: int, learner: Learner
) -> dict[str, Any]:
    """A learner checkpoint: tensors and plain values only (torch.load(weights_only=True))."""
    assert learner.state_dict is not None
    return {
        "state_dict": learner.state_dict,
        "model": ctx.model_config,
        "data": dm.data_name,
        "num_classes": ctx.num_classes,
        "pretrain": "jigsaw",
        "seed": int(seed),
        "learner": learner.id,
        "status": learner.status,
        "density": float(learner.density),
        "samples": int(learner.samples),
        "seconds": float(learner.seconds),
        "init_digest": learner.init_digest,
        "shard": learner.shard.clone(),
        "recipe": recipe(ctx, settings, dm, seed),
    }


class OtherRecipeError(UserError):
    """A learner checkpoint made by another recipe than this run's (`diff`: the settings that
    differ)."""

    def __init__(self, path: Path, diff: list[str]) -> None:
        super().__init__(
            f"{path} was trained with other settings ({', '.join(diff)}) than this merge; use "
            "a fresh pretrain.learner_dir or the same overrides as the learner jobs"
        )
        self.path, self.diff = path, diff


def load_learner(path: Path, learner: int, shard: Tensor, expected: dict[str, Any]) -> Learner:
    """Learner `learner` from its checkpoint; "missing" when absent or unreadable, "diverged"
    when its weights are not finite.

    Raises:
        UserError: the checkpoint was made by another recipe (seed, data, n, M, K, ...).
    """
    if not path.is_file():
        return Learner(learner, shard, status="missing", error=f"no checkpoint at {path}")
    try:
        payload = load_checkpoint(path)
    except UserError as e:
        return Learner(learner, shard, status="missing", error=str(e))
    if payload.get("recipe") != expected or int(payload.get("learner", -1)) != learner:
        diff = recipe_difference(expected, payload.get("recipe") or {}) or ["learner"]
        raise OtherRecipeError(path, diff)
    result = Learner(
        id=learner,
        shard=payload["shard"],
        state_dict=payload["state_dict"],
        init_digest=str(payload.get("init_digest", "")),
        density=float(payload.get("density", 1.0)),
        samples=int(payload.get("samples", 0)),
        seconds=float(payload.get("seconds", 0.0)),
    )
    if payload.get("status") == "diverged":
        result.status, result.error = "diverged", f"diverged in training ({path})"
    elif not is_finite_state_dict(payload["state_dict"]):
        result.status, result.error = "diverged", f"non-finite weights in {path}"
    return result


def train_or_reuse(
    ctx: PretrainContext,
    settings: JigsawSettings,
    dm: DataModule,
    init: nn.Module,
    seed: int,
    learner: int,
    shard: Tensor,
    folder: Path,
    shared: bool = False,
) -> Learner:
    """Learner `learner` from its checkpoint in `folder` when an earlier attempt (a killed run,
    a sweep whose other jobs died) finished it with this recipe; else trained now, and its
    checkpoint written at once, so that a run killed later keeps it. Another recipe's
    checkpoint is replaced in a run's own folder; in a folder other runs or the jobs of a
    multirun share (`shared`: pretrain.learner_dir, <sweep dir>/learners) it is their work,
    and refused.

    Raises:
        UserError: `shared`, and the folder holds this learner of another recipe.
    """
    path = folder / learner_file(learner)
    if path.is_file():
        saved = saved_learner(ctx, settings, dm, seed, learner, shard, path, shared)
        if saved.status != "missing":
            if saved.status == "ok":  # as the merge: a diverged one is left out of it
                check_shards_held_out([saved], dm)
            log.info("jigsaw learner %d (%s) reused from %s", learner, saved.status, path)
            saved.reused = True
            return saved
    trained = train_learner(ctx, settings, dm, init, seed, learner, shard)
    if shared and path.is_file():  # another run sharing the folder wrote it as this one trained
        saved = saved_learner(ctx, settings, dm, seed, learner, shard, path, shared)
        if saved.status != "missing":
            return trained  # the same recipe's: this run's is the same learner; theirs is kept
    if trained.state_dict is not None:  # diverged ones too: the merge reports them
        save_checkpoint(path, learner_payload(ctx, settings, dm, seed, trained))
        # (the log file only: the terminal has the learners' bar and the soup's line)
        console.detail.info("jigsaw learner %d (%s) written to %s", learner, trained.status, path)
    return trained


def saved_learner(
    ctx: PretrainContext,
    settings: JigsawSettings,
    dm: DataModule,
    seed: int,
    learner: int,
    shard: Tensor,
    path: Path,
    shared: bool,
) -> Learner:
    """The learner saved at `path` if this recipe's; a "missing" one where another recipe's
    is to be replaced (a run's own folder).

    Raises:
        UserError: `shared`, and `path` holds another recipe's learner: other runs' work.
    """
    try:
        return load_learner(path, learner, shard, recipe(ctx, settings, dm, seed))
    except OtherRecipeError as e:
        if shared:
            raise UserError(
                f"{path} was trained with other settings ({', '.join(e.diff)}) than this "
                "run's, by another run or job that shares the folder; give each setting "
                "its own pretrain.learner_dir (or hydra.sweep.dir), and in a learner "
                "multirun sweep only pretrain.learners"
            ) from e
        log.warning("jigsaw learner %d is trained again: %s", learner, e)
        return Learner(learner, shard, status="missing")


def learner_dir(ctx: PretrainContext, settings: JigsawSettings, shared: bool) -> Path:
    """`pretrain.learner_dir`, else <run dir>/learners; for `shared` (a multirun job training
    some learners) <sweep dir>/learners, the one folder all jobs of the sweep write to."""
    explicit = settings.learner_dir
    if explicit:
        return Path(str(explicit)).expanduser()
    if shared:
        sweep = sweep_dir_of_job()
        if sweep is not None:
            return sweep / LEARNERS_DIR
    return ctx.run_dir() / LEARNERS_DIR


def load_learners(
    ctx: PretrainContext, settings: JigsawSettings, dm: DataModule, seed: int, folder: Path
) -> list[Learner]:
    """Learners 0..n-1 from their checkpoints in `folder` (see `load_learner`)."""
    expected = recipe(ctx, settings, dm, seed)
    shards = learner_shards(settings, dm, seed)  # for the report of missing learners
    return [
        load_learner(folder / learner_file(i), i, shards[i], expected) for i in range(len(shards))
    ]
