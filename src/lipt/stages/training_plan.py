"""Main training's plan: what trains (the classifier around the initial model), for how many
epochs or optimiser steps, on which Trainer with which callbacks and loggers. Built once from
the run and what the stages before it made; lipt.stages.train fits it.

How long it trains is the `budget` option's arithmetic (lipt.budget): a subset for
`trainer.max_epochs`; the whole pool on a step budget (a share of the schedule: `full_schedule`,
or a subset's steps: `full_steps`), which the schedule spans and StopAtStep
(lipt.models.schedules) ends; InfoBatch's fewer epochs; dynamic pruning's epochs of a shrinking
pool.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn

from lipt.budget import PoolSizes, Schedule
from lipt.budget.modes import epoch_steps
from lipt.core.errors import UserError
from lipt.core.host import trainer_world_size
from lipt.core.requeue import RequeueOnSignal
from lipt.data import DataModule
from lipt.data.seen import SeenSamples
from lipt.models.classifier import Classifier
from lipt.models.schedules import StopAtStep
from lipt.selection.reselection import Reselection
from lipt.stages.build import Parts, build_callbacks, build_loggers, build_trainer, progress_bars
from lipt.stages.dynamic import DynamicSetup
from lipt.stages.resume import RunRecord
from lipt.stages.run import Run
from lipt.stages.select import reselection


@dataclass
class TrainingPlan:
    """What Trainer.fit runs: `module` for `epochs` (what the stage line announces; a step
    budget's StopAtStep may end the last one early), on `trainer`: the `trainer` group's, with
    lipt's callbacks and the `callbacks` and `logger` groups', and the settings the plan
    changes (max_epochs, dataloaders reloaded each epoch under re-selection or pruning)."""

    module: Classifier
    epochs: int
    subset_size: int  # the images an epoch trains on before any pruning: the subset, or the pool
    trainer: L.Trainer  # the `trainer` group's, with the callbacks and loggers
    reselect: Reselection | None
    dynamic: DynamicSetup | None


def main_schedule(run: Run, dm: DataModule, pool_before_cleaning: int) -> Schedule:
    """Main training's epochs, and the optimiser steps a step budget stops at: the budget's
    arithmetic on this pool (a saved subset trains as budget=subset does), counting the steps
    as the `trainer` node takes them (its processes and gradient accumulation).

    Raises:
        UserError: for a step budget on a trainer whose number of processes the node does not
            tell.
    """
    return schedule_of(run, len(dm.pool_indices), pool_before_cleaning)


def schedule_of(run: Run, pool: int, pool_before_cleaning: int) -> Schedule:
    """`main_schedule` on a pool of `pool` rows (`pool_before_cleaning` as read)."""
    check_countable_steps(run)
    budget = run.main_budget
    settings, trainer = run.settings, run.node("trainer")
    world_size = trainer_world_size(trainer)
    sizes = PoolSizes(
        pool=pool,
        pool_before_cleaning=pool_before_cleaning,
        batch_size=settings.batch_size,
        max_epochs=run.main_epochs,
        fraction=float(settings.fraction),
        world_size=world_size or 1,
        accumulate=int(trainer.get("accumulate_grad_batches", 1)),
        limit_batches=batch_limit(trainer),
    )
    schedule = budget.schedule(sizes)
    if schedule.steps is None:
        return schedule
    steps, most = schedule.steps, trainer.get("max_steps")
    if type(most) is int and 0 < most < steps:  # -1, Lightning's default: no limit
        # Lightning stops at trainer.max_steps first (debug=fdr's smoke run): the schedule ends
        # there, as Lightning's own step estimate ends an epoch budget's.
        steps = most
    # The Trainer runs the epochs the steps span on this pool, no more (budget=full_steps
    # counts a subset's epochs): what the stage line and the bar announce, and a fit resumed
    # from the budget's last checkpoint (killed in the test pass) has no epoch left to start,
    # where it trained a batch past the budget before StopAtStep ended it.
    batches = epoch_batches(trainer, sizes.pool, sizes.batch_size)
    per_epoch = max(1, math.ceil(batches / sizes.accumulate))
    return Schedule(min(schedule.epochs, math.ceil(steps / per_epoch)), steps)


def batch_limit(trainer: Mapping[str, Any]) -> int | float | None:
    """trainer.limit_train_batches as Lightning reads it: a count of batches (an int, or a
    whole float above 1: 10.0 is 10 batches), a share of them (a float up to 1), replaced by
    trainer.overfit_batches above 0; None where the node sets neither."""
    overfit = trainer.get("overfit_batches")
    if isinstance(overfit, (int, float)) and not isinstance(overfit, bool) and overfit > 0:
        # Lightning hands overfit_batches to the limit as given: a float above 1 is then no
        # share of the epoch and cuts nothing
        return None if isinstance(overfit, float) and overfit > 1 else overfit
    limit = trainer.get("limit_train_batches")
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        return None
    return int(limit) if isinstance(limit, float) and limit > 1 and limit.is_integer() else limit


def epoch_batches(trainer: Mapping[str, Any], rows: int, batch_size: int) -> int:
    """The training batches of an epoch of `rows` rows on each of the `trainer` node's
    processes (DDP's sampler pads the last), as Lightning counts them: up to
    trainer.limit_train_batches (a count, or a share of them)."""
    world_size = trainer_world_size(trainer) or 1
    return epoch_steps(rows, batch_size, world_size, limit=batch_limit(trainer))  # 1 batch a step


def check_countable_steps(run: Run) -> None:
    """Refuse a step budget on a trainer whose number of processes its node does not tell:
    the budget counts each process's optimiser steps (lipt.run.rules asks it before any work)."""
    budget, trainer = run.budget, run.node("trainer")
    if run.main_budget.counts_steps and trainer_world_size(trainer) is None:
        raise UserError(
            f"budget={budget.name} counts optimiser steps, and trainer.devices="
            f"{trainer.get('devices')} on accelerator {trainer.get('accelerator', 'auto')} does "
            "not say how many processes take them: give trainer.devices as a number"
        )


def batches_between_validations(trainer: Mapping[str, Any]) -> int | None:
    """N where the `trainer` node validates every N training batches of each epoch (an
    integer trainer.val_check_interval above 1, with check_val_every_n_epoch not null), which
    Lightning refuses for an epoch of fewer batches; None where it validates otherwise."""
    every = trainer.get("val_check_interval")
    if isinstance(every, bool) or not isinstance(every, int) or every <= 1:
        return None  # a share of an epoch (0.5, 1.0), or every batch
    return None if trainer.get("check_val_every_n_epoch", 1) is None else every


def validations_per_epoch(trainer: Mapping[str, Any], batches: int) -> int:
    """The validations Lightning runs in an epoch of `batches` training batches under the
    `trainer` node's val_check_interval: every N batches (an int; across epochs where
    check_val_every_n_epoch is null), every share of them (a float, at least a batch apart);
    one where it validates at an epoch's end, or by the clock (a time, which no count tells)."""
    every = trainer.get("val_check_interval")
    if isinstance(every, bool) or not isinstance(every, (int, float)) or every < 0:
        return 1
    if isinstance(every, float):
        every = max(1, int(batches * every))  # Lightning's val_check_batch
    return max(1, batches // every) if every >= 1 else 1


def check_validated_within(run: Run, epochs: int, pool: int) -> None:
    """Refuse `optimized_metric` where main training's `epochs` on a pool of `pool` rows end
    before its first validation (every trainer.check_val_every_n_epoch epochs, the first at
    epoch N, where a step budget stops in it too): a step budget's epochs, which lipt.run.rules
    bounds from the config alone, as this pool's size makes them.

    Raises:
        UserError: naming the epochs and the validation period, before main training.
    """
    every = run.unvalidated_period(epochs)
    if every is None:
        return
    raise UserError(
        f"optimized_metric={run.settings.optimized_metric} needs a validation result, but "
        f"trainer.check_val_every_n_epoch={every} validates nothing in the {epochs} epoch"
        f"{'s' * (epochs != 1)} budget={run.budget.name} trains on this pool ({pool:,} images); "
        f"set trainer.check_val_every_n_epoch={epochs} or less"
    )


def check_validation_fits(run: Run, rows: int) -> None:
    """Refuse an epoch Lightning refuses (with a traceback, when the fit starts, or mid-run at
    the first pruned epoch that short): one that a trainer.limit_train_batches share leaves no
    batch of, and a validation every N batches of an epoch that has fewer. `rows` images an
    epoch, as few as a pruning budget keeps of them (`fewest_rows`), split between the
    trainer's processes, in batches of batch_size, up to trainer.limit_train_batches.

    Raises:
        UserError: naming the epoch's batches and the ways to train or validate within them.
    """
    trainer = run.node("trainer")
    every, limit = batches_between_validations(trainer), batch_limit(trainer)
    share = isinstance(limit, float) and limit > 0  # 0 trains nothing, as Lightning allows
    if every is None and not share:
        return
    pruning = run.budget.pruning(float(run.settings.fraction)) if run.prunes else None
    batch_size = run.settings.batch_size
    if pruning is None:
        kept = rows
    else:  # over the epochs the budget trains (InfoBatch's: those `fraction` buys)
        sizes = PoolSizes(rows, rows, batch_size, run.main_epochs, float(run.settings.fraction))
        kept = pruning.fewest_rows(rows, run.main_budget.schedule(sizes).epochs)
    batches = epoch_batches(trainer, kept, batch_size)
    selected = run.budget.trains_subset and run.settings.subset_path is None
    again = f" (ckpt_path=last hydra.run.dir={run.folder} keeps its subset)" if selected else ""
    prunes = f"as few as {kept:,} of the {rows:,} images budget={run.budget.name} prunes it to,"
    images = f"{rows:,} images" if pruning is None else prunes
    if share and batches == 0:
        unlimited = {**trainer, "limit_train_batches": None, "overfit_batches": None}
        whole = epoch_batches(unlimited, kept, batch_size)
        key = (
            "overfit_batches" if limit == trainer.get("overfit_batches") else "limit_train_batches"
        )
        least = math.ceil(1000 / whole) / 1000  # int(whole x least) >= 1, unlike 1 / whole
        count = f"a number of batches (+trainer.{key}=1)"
        fix = f"+trainer.{key}={least} or more, or {count}" if least < 1 else count
        raise UserError(
            f"trainer.{key}={limit} trains int({limit} x {whole}) = 0 of main "
            f"training's {whole} batch{'es' * (whole != 1)} an epoch ({images} in batches of "
            f"{batch_size}); give {fix}{again}"
        )
    if every is not None and every > batches:
        raise UserError(
            f"trainer.val_check_interval={every} validates every {every} batches of an epoch, "
            f"but main training's epoch has {batches} ({images} in batches of {batch_size}); "
            "give a smaller number, a share of an epoch (+trainer.val_check_interval=0.5), or "
            f"+trainer.check_val_every_n_epoch=null{again}"
        )


def check_whole_pool_validation(run: Run, pool: int) -> None:
    """`check_validation_fits` for a budget that trains the whole pool of `pool` rows, pruned or
    not, as soon as the data is read: before cleaning and pre-training (training_plan checks
    the pool cleaning leaves again)."""
    if run.settings.stage == "train" and not run.trains_subset:
        check_validation_fits(run, pool)


def training_plan(
    run: Run,
    parts: Parts,
    out: Path,
    model: nn.Module,
    subset: tuple[Tensor, Tensor] | None,
    dynamic: DynamicSetup | None,
    pool_before_cleaning: int,
    requeue: RequeueOnSignal | None,
) -> TrainingPlan:
    """The plan for `model` on the data module's training set (`subset` of the pool, None: the
    whole pool), built in the order the objects consume nothing random."""
    settings, dm = run.settings, parts.dm
    size = len(dm.pool_indices) if subset is None else len(subset[0])
    check_validation_fits(run, size)
    # Dynamic pruning's weights restore a full epoch's loss sum: mean over the batch, and a
    # schedule over epochs, whose lengths vary (lipt.models.classifier.Classifier).
    dynamic_optim: dict[str, Any] = (
        {"loss_norm": "batch", "schedule_over": "epochs"} if dynamic is not None else {}
    )
    schedule = main_schedule(run, dm, pool_before_cleaning)
    steps, epochs = schedule.steps, schedule.epochs
    check_validated_within(run, epochs, len(dm.pool_indices))
    module = parts.classifier(model, total_steps=steps, **dynamic_optim)
    reselect = reselection(run, parts, out, subset)
    callbacks: list[L.Callback] = [
        # One rolling checkpoint, rewritten (atomically) every epoch: what ckpt_path=last resumes.
        # At epochs' ends only, not after a mid-epoch validation (trainer.val_check_interval
        # < 1): a fit resumed mid-epoch would not train what an uninterrupted one does.
        ModelCheckpoint(
            dirpath=out / "checkpoints",
            filename="last",
            save_top_k=1,
            save_last=False,
            enable_version_counter=False,
            save_on_train_epoch_end=True,
        ),
        # The run's settings and data, in each checkpoint: a resume with others is refused.
        RunRecord(run, dm),
    ]
    if settings.record_seen:
        callbacks.append(SeenSamples(out))
    if requeue is not None:
        callbacks.append(requeue)
    trainer_settings: dict[str, Any] = {}
    if reselect is not None:
        callbacks.append(reselect)
        trainer_settings["reload_dataloaders_every_n_epochs"] = settings.reselect_every
    if dynamic is not None:
        callbacks.append(dynamic.callback)
        trainer_settings["reload_dataloaders_every_n_epochs"] = 1  # each epoch asks its plan
    if steps is not None:
        # Not Lightning's max_steps: a fit with max_steps that resumes from an epoch's end
        # counts that epoch twice and stops one epoch short (Lightning 2.6).
        callbacks.append(StopAtStep(steps))
    if epochs != run.main_epochs:
        trainer_settings["max_epochs"] = epochs
    loggers = build_loggers(run)
    # The `callbacks` group: those the run has what they need for.
    # An early stop's patience, in epochs: as many validations as an unpruned epoch holds.
    node = run.node("trainer")
    checks = validations_per_epoch(node, epoch_batches(node, size, settings.batch_size))
    callbacks += build_callbacks(run, loggers, progress_bars(run), len(dm.val_indices) > 0, checks)
    trainer = build_trainer(run, logger=loggers, callbacks=callbacks, **trainer_settings)
    if steps is not None:  # the Trainer takes the steps the budget counted
        assert trainer.world_size == trainer_world_size(node), trainer.world_size
        assert trainer.accumulate_grad_batches == int(node.get("accumulate_grad_batches", 1))
    return TrainingPlan(module, epochs, size, trainer, reselect, dynamic)
