"""Stage 3 and the whole pipeline (`train.py`): pre-train, select, train on the subset, test.

Read top to bottom as a run goes: where to resume from, the subset (selected by lipt.stages.select's
own `select_subset`, or loaded), main training, and summary.json built from the stages' results.

Under DDP, Lightning re-runs the entry script in every extra rank with the same run directory:
rank 0 pre-trains and selects before the trainer starts, writes subset.npz, and the extra ranks
read it from there instead of recomputing it.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from torch import Tensor, nn

from lipt.builder.objects import (
    build_callbacks,
    build_classifier,
    build_datamodule,
    build_loggers,
    build_model,
    build_trainer,
    progress_bars,
)
from lipt.core import console
from lipt.core.artifacts import check_subset, load_subset, write_json
from lipt.core.errors import UserError
from lipt.core.host import core_ticks, host, load_average, other_cores_busy
from lipt.core.job import is_ddp_child, run_dir, sweep_dir_of_job, wait_for_file
from lipt.core.seeding import reselect_seed
from lipt.core.settings import Run
from lipt.data import DataModule
from lipt.dynamic.plan import infobatch_epochs
from lipt.jigsaw.checkpoints import LEARNERS_DIR
from lipt.jigsaw.context import Pretrained
from lipt.report.pictures import log_to_wandb
from lipt.stages.clean import clean_pool
from lipt.stages.dynamic import DynamicSetup, describe, dynamic_pruning
from lipt.stages.requeue import RequeueOnSignal, in_slurm_job, restarted_by_slurm
from lipt.stages.reselect import Reselect, latest_subset
from lipt.stages.results import Selected, Trained
from lipt.stages.seen import SeenSamples
from lipt.stages.select import (
    STAGES_FILE,
    SUBSET_FILE,
    choose_subset,
    chosen_selector,
    ranking_models,
    schedule_steps,
    select_subset,
    subset_meta,
    subset_steps,
    with_cleaning,
    write_selection,
)
from lipt.stages.summary import subset_class_counts, summary_payload

log = logging.getLogger(__name__)


def resume_path(run: Run, out: Path) -> str | None:
    ckpt = run.settings.ckpt_path
    if not ckpt:
        return None
    if ckpt == "last":
        last = out / "checkpoints" / "last.ckpt"
        if last.is_file():
            return str(last)
        if (out / SUBSET_FILE).is_file() or any((out / LEARNERS_DIR).glob("learner_*.ckpt")):
            return None  # killed before main training: its saved learners and subset are reused
        if sweep_dir_of_job() is not None:
            log.info("resuming a sweep: this job never started, so it starts now")
            return None
        raise UserError(
            f"ckpt_path=last but {last} does not exist; pass hydra.run.dir=<the run to resume>"
        )
    if not Path(str(ckpt)).is_file():
        raise UserError(f"ckpt_path={ckpt} does not exist; give a Lightning checkpoint or 'last'")
    return str(ckpt)


def load_checked_subset(dm: DataModule, path: Path) -> tuple[Tensor, Tensor]:
    indices, weights, meta = load_subset(path)
    expected = {"dataset": dm.data_name, "dataset_train_size": len(dm.train_source)}
    check_subset(path, indices, weights, meta, expected, len(dm.train_source), dm.val_indices)
    return indices, weights


@dataclass
class TrainingSet:
    """What main training trains on: the subset (None: the whole pool), and what stages 1 and
    2 made in this run for it (None: it was loaded, or not needed). `earlier_stages`: a resumed
    run's stages.pretrain and stages.select, as the attempt that selected recorded them."""

    subset: tuple[Tensor, Tensor] | None
    selected: Selected | None = None
    pretrained: Pretrained | None = None
    pretrain_stats: dict[str, Any] | None = None
    earlier_stages: dict[str, dict[str, Any]] | None = None
    score_stats: dict[str, Any] | None = None  # dynamic=lipt: the pool's pass through the soup


def earlier_stages(out: Path) -> dict[str, dict[str, Any]] | None:
    path = out / STAGES_FILE
    return json.loads(path.read_text()) if path.is_file() else None  # None: an older run


def obtain_subset(
    run: Run, dm: DataModule, out: Path, resume: str | None, made: Pretrained | None = None
) -> TrainingSet:
    """The subset to train on: given (subset_path), none (selector=full), the one a resumed or
    restarted run already chose, or selected now exactly as select.py selects (`made`: the
    model pre-trained in this run already, by label cleaning)."""
    settings, selector = run.settings, chosen_selector(run)
    if settings.subset_path:
        return TrainingSet(load_checked_subset(dm, Path(settings.subset_path)))
    if selector.is_full:
        return TrainingSet(None)
    saved = out / SUBSET_FILE
    if resume is not None and saved.is_file():
        # A resumed run trains on what the first attempt chose (re-selected ones included).
        completed = int(torch.load(resume, map_location="cpu", weights_only=True)["epoch"]) + 1
        subset = load_checked_subset(dm, latest_subset(out, completed) or saved)
        return TrainingSet(subset, earlier_stages=earlier_stages(out))
    if settings.ckpt_path == "last" and saved.is_file():
        # Killed after selection, before main training saved an epoch: keep the subset; the
        # pre-trained model (init_from=pretrained) is merged again from the saved learners.
        subset = load_checked_subset(dm, saved)
        log.info("resuming: the subset in %s is kept (not selected again)", saved)
        earlier = earlier_stages(out)
        if settings.init_from != "pretrained" or not selector.needs_model or is_ddp_child():
            return TrainingSet(subset, earlier_stages=earlier)
        ranking = ranking_models(run, dm, made)
        return TrainingSet(subset, None, ranking.pretrained, ranking.pretrain_stats, earlier)
    if is_ddp_child():  # extra DDP ranks read what rank 0 chose (under srun: is choosing)
        wait_for_file(saved)
        return TrainingSet(load_checked_subset(dm, saved))
    selected = select_subset(run, dm, made)
    write_selection(run, dm, out, selected)
    subset = (selected.indices, selected.weights)
    return TrainingSet(subset, selected, selected.pretrained, selected.pretrain_stats)


def reselect_quietly(
    run: Run, dm: DataModule, model: nn.Module, seed: int, profile: dict[str, float]
) -> tuple[Tensor, Tensor]:
    with console.no_bars():  # Lightning's own bar is live during training
        return choose_subset(run, dm, [model], seed, profile=profile)


def run(run: Run) -> dict[str, Any]:
    """`train.py`, on the run's typed settings (lipt.run.config.validate builds them): returns
    summary.json's payload."""
    # In a SLURM job: the time-limit signal is noted from now on, and a requeued attempt
    # resumes from its own folder's last checkpoint (lipt.stages.requeue).
    requeue = RequeueOnSignal() if in_slurm_job() else None
    if run.settings.ckpt_path is None and restarted_by_slurm():
        run = replace(run, settings=replace(run.settings, ckpt_path="last"))
    settings = run.settings
    out = run_dir(run)
    finished = out / "summary.json"
    if settings.ckpt_path == "last" and finished.is_file() and not is_ddp_child():
        # Resuming a sweep re-runs its every job: one that finished keeps its results as they
        # are (a second test pass would overwrite its stage timings with a resume's).
        console.stage(f"{console.shown(out)} finished already: its summary.json stands")
        summary: dict[str, Any] = json.loads(finished.read_text())
        return summary
    ticks, load_before = core_ticks(), load_average()  # was the machine shared? (summary.json)
    dm = build_datamodule(run)
    resume = resume_path(run, out)
    # Label cleaning (the `clean` group) changes the pool or its labels before selection.
    cleaned = clean_pool(run, dm, out, resume=settings.ckpt_path == "last")
    made = None if cleaned is None else cleaned.pretrained
    training_set = obtain_subset(run, dm, out, resume, made)
    dynamic: DynamicSetup | None = None
    if run.dynamic_enabled:  # the whole pool (selector=full), pruned anew every epoch
        dynamic = dynamic_pruning(run, dm, out, resume, made)
        training_set.pretrained = dynamic.pretrained
        training_set.pretrain_stats = dynamic.pretrain_stats
        training_set.score_stats = dynamic.score_stats
        if resume is not None:
            training_set.earlier_stages = earlier_stages(out)
    subset = training_set.subset
    pretrained = training_set.pretrained or made  # made: by label cleaning
    if pretrained is not None and not pretrained.trained:
        pretrained = None  # pretrain=none: the init, not a pre-trained model
    if subset is None:
        dm.set_subset(None)
    else:
        dm.set_subset(*subset)
    class_counts = None if subset is None else subset_class_counts(dm, subset[0])

    # Main training starts from the common initial model (paper, appendix A) unless asked.
    # Extra DDP ranks keep the init: DDP copies rank 0's weights to them when fit starts.
    model = build_model(run, settings.seed)
    if settings.init_from == "pretrained" and not is_ddp_child() and resume is None:
        if pretrained is None:
            raise UserError(
                "init_from=pretrained needs a model pre-trained in this run: use a pretrain "
                "other than none and a selector that ranks with a model"
            )
        model = pretrained.model
    # Dynamic pruning's weights restore a full epoch's loss sum: mean over the batch, and a
    # schedule over epochs, whose lengths vary (lipt.models.classifier.Classifier).
    dynamic_optim: dict[str, Any] = (
        {"loss_norm": "batch", "schedule_over": "epochs"} if dynamic is not None else {}
    )
    # A step budget (the whole pool on `fraction` of the schedule, or a subset's steps): the
    # cosine spans it and StopAtStep ends the fit there, with max_epochs the epochs it needs.
    selector = chosen_selector(run)
    step_budget: int | None = None
    epochs = run.main_epochs
    if selector.is_full and selector.match_subset_steps:
        step_budget = subset_steps(run, len(dm.pool_indices))  # approach=full_steps
    if selector.budget_steps and subset is None:  # the whole pool on `fraction` of the schedule
        # The steps are the whole pool's before cleaning dropped any: a cleaned pool trains as
        # many as full_schedule does at this budget (the same spend, cleaning on top), over
        # more of its epochs.
        whole = len(dm.pool_indices) if cleaned is None else int(cleaned.stats["pool"])
        budget_batches = math.ceil(whole / settings.batch_size)
        step_budget = schedule_steps(settings.fraction, epochs, budget_batches)
        per_epoch = math.ceil(len(dm.pool_indices) / settings.batch_size)
        epochs = math.ceil(step_budget / per_epoch)
    module = build_classifier(run, model, total_steps=step_budget, **dynamic_optim)
    callbacks: list[L.Callback] = [
        # One rolling checkpoint, rewritten (atomically) every epoch: what ckpt_path=last resumes.
        ModelCheckpoint(
            dirpath=out / "checkpoints",
            filename="last",
            save_top_k=1,
            save_last=False,
            enable_version_counter=False,
        )
    ]
    if settings.record_seen:
        callbacks.append(SeenSamples(out))
    if requeue is not None:
        callbacks.append(requeue)
    extra: dict[str, Any] = {}
    reselect = None
    if settings.reselect_every > 0 and subset is not None and settings.subset_path is None:
        reselect = Reselect(
            settings.reselect_every,
            dm,
            lambda module, epoch, profile: reselect_quietly(
                run, dm, cast(nn.Module, module.model), reselect_seed(settings.seed, epoch), profile
            ),
            out,
            subset_meta(run, dm),
        )
        callbacks.append(reselect)
        extra["reload_dataloaders_every_n_epochs"] = settings.reselect_every
    if dynamic is not None:
        callbacks.append(dynamic.callback)
        extra["reload_dataloaders_every_n_epochs"] = 1  # each epoch's loader asks for its plan
    if step_budget is not None:
        # Not Lightning's max_steps: a fit with max_steps that resumes from an epoch's end
        # counts that epoch twice and stops one epoch short (Lightning 2.6).
        callbacks.append(StopAtStep(step_budget))
        extra["max_epochs"] = epochs
    if run.budget_epochs:  # selector=infobatch: the epochs `fraction` of the cost buys
        epochs = extra["max_epochs"] = infobatch_epochs(float(settings.fraction), epochs)
    loggers = build_loggers(run)
    # The `callbacks` group: those the run has what they need for.
    callbacks += build_callbacks(run, loggers, progress_bars(run), len(dm.val_indices) > 0)
    trainer = build_trainer(run, logger=loggers, callbacks=callbacks, **extra)
    # Shuffling and augmentation draw from the global RNG, whatever the stages before left in it.
    L.seed_everything(settings.seed, workers=True, verbose=False)
    train_size = len(dm.pool_indices) if subset is None else len(subset[0])
    line = console.describe_training(run, train_size, len(dm.pool_indices), epochs)
    console.stage(line if dynamic is None else f"{line}; {describe(dynamic.callback.method)}")
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    samples = module.total_samples_seen()
    epochs_trained = int(trainer.current_epoch)  # after fit: the epochs completed
    train_seconds = module.seconds_trained()  # a resumed run's earlier attempts included
    # The last epoch's validation accuracy: what hyper-parameters are chosen on (never test).
    val_metric = trainer.callback_metrics.get("val/acc")
    val_accuracy = None if val_metric is None else float(val_metric)
    test_accuracy = float(trainer.test(module, datamodule=dm, verbose=False)[0]["test/acc"])
    subset_size = len(dm.pool_indices) if subset is None else len(subset[0])
    unique = subset_size if reselect is None else len(reselect.unique)
    trained = Trained(
        seconds=train_seconds,
        samples=samples,
        unique_samples=unique if dynamic is None else dynamic.callback.unique_samples(),
        test_accuracy=test_accuracy,
        val_accuracy=val_accuracy,
        reselections=None if reselect is None else reselect.reselections,
        reselect_seconds=None if reselect is None else reselect.seconds,
        reselect_profiles=None if reselect is None else reselect.profiles,
        dynamic=None if dynamic is None else dynamic.callback.ledger(samples, epochs_trained),
    )
    stages = with_cleaning(training_stages(training_set, trained), cleaned)
    summary = summary_payload(run, dm, test_accuracy, subset_size, stages, class_counts)
    summary["val_accuracy"] = val_accuracy
    summary["host"] = host()
    summary["other_cores_busy"] = other_cores_busy(ticks, core_ticks())
    summary["load_average"] = [load_before, load_average()]
    if trainer.is_global_zero:
        write_json(out / "summary.json", summary)
    for logger in trainer.loggers:  # so a dashboard can compare runs of a sweep
        logger.log_hyperparams(summary["config"])
        logger.log_metrics(run_metrics(summary))
        if trainer.is_global_zero and type(logger).__name__ == "WandbLogger":
            log_to_wandb(logger, dm, None if subset is None else subset[0], out)
        logger.save()
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            # End this job's wandb run: the next job of a multirun (same process) would log into
            # it instead of starting its own.
            logger.experiment.finish()
    return summary


class StopAtStep(L.Callback):
    """Ends the fit once `steps` optimiser steps are done (a step budget, mid-epoch too)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.steps:
            trainer.should_stop = True


def training_stages(training_set: TrainingSet, trained: Trained) -> dict[str, dict[str, Any]]:
    """summary.json's stages: pretrain and select when they ran in this run (a resumed run: as
    the attempt that ran them recorded them; re-merging a soup on resume is not its cost), then
    train."""
    if training_set.earlier_stages is not None:
        return {**training_set.earlier_stages, "train": trained.stats()}
    stages: dict[str, dict[str, Any]] = {}
    if training_set.pretrain_stats is not None:
        stages["pretrain"] = training_set.pretrain_stats
    if training_set.selected is not None:
        stages["select"] = training_set.selected.stats()
    if training_set.score_stats is not None:
        stages["score"] = training_set.score_stats
    return {**stages, "train": trained.stats()}


def run_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers, flat: test accuracy, sizes and every stage's figures, nested ones
    by path (stages/select/diagnostics/<name>, stages/train/reselect_profiles/<epoch>/<name>)."""
    metrics = {
        key: float(summary[key])
        for key in ("test_accuracy", "subset_size", "train_size")
        if summary.get(key) is not None
    }

    def flatten(path: str, value: Any) -> None:
        if isinstance(value, dict):
            for name, inner in value.items():
                flatten(f"{path}/{name}", inner)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[path] = float(value)  # labels (stages/train/dynamic/method) are no metric

    flatten("stages", summary["stages"])
    return metrics
