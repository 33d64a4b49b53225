"""Stage 3 and the whole pipeline (`train.py`): pre-train, select, train on the subset, test.

`run` reads as a run goes, one named step each: a SLURM attempt, a finished run kept as it is, the
run's parts (lipt.stages.build.build_parts: the data module, the models' factories, the strategy,
the selector, the cleaning method, built once and handed down), where to resume from
(lipt.stages.resume: what an earlier attempt left, read and checked once), label cleaning, the
training set (lipt.stages.training_set: a subset selected or kept, or the whole pool under
dynamic pruning), the initial model, the training plan (lipt.stages.training_plan: what trains,
for how long, on which Trainer with which callbacks), the fit and the test, and
summary.json built from the stages' results.

Under DDP, Lightning re-runs the entry script in every extra rank with the same run directory:
rank 0 pre-trains and selects before the trainer starts, writes subset.npz, and the extra ranks
read it from there instead of recomputing it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
from torch import Tensor, nn

from lipt.core.artifacts import write_json
from lipt.core.console import share_text, shown
from lipt.core.errors import UserError
from lipt.core.host import core_ticks, host, load_average, other_cores_busy
from lipt.core.job import (
    is_ddp_child,
    run_dir,
)
from lipt.core.requeue import RequeueOnSignal, in_slurm_job, restarted_by_slurm
from lipt.data import DataModule
from lipt.report.pictures import log_to_wandb
from lipt.stages.build import Parts, build_parts
from lipt.stages.clean import clean_pool
from lipt.stages.dynamic import describe
from lipt.stages.results import Trained, with_cleaning
from lipt.stages.resume import Resume, finished_summary, resume_of
from lipt.stages.run import Run
from lipt.stages.summary import subset_class_counts, summary_payload
from lipt.stages.training_plan import TrainingPlan, check_whole_pool_validation, training_plan
from lipt.stages.training_set import TrainingSet, training_set_of

log = logging.getLogger(__name__)


def slurm_attempt(run: Run) -> tuple[RequeueOnSignal | None, Run]:
    """In a SLURM job: the time-limit signal is noted from now on, and a requeued attempt
    resumes from its own folder's last checkpoint (lipt.core.requeue)."""
    requeue = RequeueOnSignal() if in_slurm_job() else None
    if run.settings.ckpt_path is None and restarted_by_slurm():
        run = replace(run, settings=replace(run.settings, ckpt_path="last"))
    return requeue, run


def initial_model(run: Run, parts: Parts, training_set: TrainingSet, resume: Resume) -> nn.Module:
    """The common initial model (paper, appendix A), or the one pre-trained in this run
    (init_from=pretrained). Extra DDP ranks keep the init: DDP copies rank 0's weights to them
    when fit starts."""
    settings = run.settings
    model = parts.initial_model(settings.seed)
    if settings.init_from == "pretrained" and not is_ddp_child() and resume.checkpoint is None:
        pretrained = training_set.pretrained
        if pretrained is None or not pretrained.trained:  # pretrain=none: the init
            raise UserError(
                "init_from=pretrained needs a model pre-trained in this run: use a pretrain "
                "other than none and budget=lipt or a selector that ranks with a model"
            )
        model = pretrained.model
    return model


def fit_and_test(run: Run, dm: DataModule, plan: TrainingPlan, resume: str | None) -> Trained:
    """Main training as planned, then the test split: what stages.train records."""
    # Shuffling and augmentation draw from the global RNG, whatever the stages before left in it.
    L.seed_everything(run.settings.seed, workers=True, verbose=False)
    subset_size = plan.subset_size
    processes = plan.trainer.world_size
    pool, steps = len(dm.pool_indices), plan.module.total_steps
    line = describe_training(run, subset_size, pool, plan.epochs, processes, steps, resume)
    dynamic, reselect, module, trainer = plan.dynamic, plan.reselect, plan.module, plan.trainer
    log.info(line if dynamic is None else f"{line}; {describe(dynamic.callback.method)}")
    started = time.perf_counter()
    trainer.fit(module, datamodule=dm, ckpt_path=resume)
    # The fit's wall time, before the test pass, and earlier attempts' checkpointed seconds: the
    # module's own clock starts after the set-up, under DDP after the other processes started.
    seconds = module.seconds_before + time.perf_counter() - started
    samples = module.total_samples_seen()
    # The trained weights' validation accuracy: what hyper-parameters are chosen on (never
    # test). A fit whose last validation came before its last step validates them again:
    # check_val_every_n_epoch > 1, a stop mid-epoch, a resumed fit with nothing left to run.
    if len(dm.val_indices) and module.validated_at_step != trainer.global_step:
        trainer.validate(module, datamodule=dm, verbose=False)
    val_metric = trainer.callback_metrics.get("val/acc")
    val_accuracy = None if val_metric is None else float(val_metric)
    test_accuracy = float(trainer.test(module, datamodule=dm, verbose=False)[0]["test/acc"])
    # Without re-selection an epoch is a shuffled pass over the subset without repeats: a step
    # budget under one epoch sees `samples` distinct images (exactly so on one device).
    unique = min(samples, subset_size) if reselect is None else len(reselect.unique)
    return Trained(
        seconds=seconds,
        samples=samples,
        unique_samples=unique if dynamic is None else dynamic.callback.unique_samples(),
        test_accuracy=test_accuracy,
        val_accuracy=val_accuracy,
        reselections=None if reselect is None else reselect.reselections,
        reselect_seconds=None if reselect is None else reselect.seconds,
        reselect_profiles=None if reselect is None else reselect.profiles,
        dynamic=None if dynamic is None else dynamic.callback.ledger(samples, run.main_epochs),
    )


def describe_training(
    run: Run,
    train_size: int,
    pool_size: int,
    epochs: int,
    processes: int = 1,
    steps: int | None = None,
    resumed: str | None = None,
) -> str:
    """The line that opens main training: the model, its epochs (and the optimiser steps a
    step budget stops at) and images, where it starts (`resumed`: the checkpoint a resumed
    fit continues from), and on how many devices (`processes`: the trainer's world size, every
    node's)."""
    share = f"{share_text(train_size / pool_size, 0)} of the pool" if pool_size else "the pool"
    init = "pre-trained" if run.settings.init_from == "pretrained" else "initial"
    start = f"resumed from {shown(Path(resumed))}" if resumed else f"from the {init} model"
    strategy = run.node("trainer").get("strategy")
    where = f", {processes} devices ({strategy})" if processes > 1 else ""
    model = str(run.node("model")["_target_"]).rsplit(".", 1)[-1]
    length = f"{epochs} epoch{'s' * (epochs != 1)}"
    if steps is not None:  # a step budget: the epochs it spans, the last one cut short
        length = f"{steps:,} optimiser step{'s' * (steps != 1)} in {length}"
    return f"training: {model}, {length} on {train_size:,} images ({share}), {start}{where}"


def run(run: Run) -> dict[str, Any]:
    """`train.py`, on the run's typed settings (lipt.run.config.validate builds them): returns
    summary.json's payload."""
    requeue, run = slurm_attempt(run)
    out = run_dir(run.folder)
    finished = finished_summary(run, out)
    if finished is not None:
        return finished
    machine_before = (core_ticks(), load_average())  # was the machine shared? (summary.json)
    parts = build_parts(run)  # each built once, handed down
    dm = parts.dm
    check_whole_pool_validation(run, len(dm.pool_indices))  # before any stage trains
    resume = resume_of(run, dm, out)  # checked before cleaning re-merges a soup
    # Label cleaning (the `clean` group) changes the pool or its labels before selection.
    cleaned = clean_pool(run, parts, out, resume=run.settings.ckpt_path == "last")
    training_set = training_set_of(run, parts, out, resume, cleaned)
    subset = training_set.subset
    initial = training_set.initial_indices  # a resumed run's re-selected subset: the first one
    class_counts = None if initial is None else subset_class_counts(dm, initial)
    model = initial_model(run, parts, training_set, resume)
    whole = len(dm.pool_indices) if cleaned is None else int(cleaned.stats["pool"])
    plan = training_plan(run, parts, out, model, subset, training_set.dynamic, whole, requeue)
    trained = fit_and_test(run, dm, plan, resume.checkpoint)
    trainer = plan.trainer
    stages = with_cleaning(training_set.stages(trained), cleaned)
    summary = summary_payload(
        run, dm, trained.test_accuracy, plan.subset_size, stages, class_counts
    )
    summary["val_accuracy"] = trained.val_accuracy
    summary["host"] = host()
    summary["other_cores_busy"] = other_cores_busy(machine_before[0], core_ticks())
    summary["load_average"] = [machine_before[1], load_average()]
    if trainer.is_global_zero:
        write_json(out / "summary.json", summary)
    log_the_run(trainer, dm, initial, out, summary)  # the subset summary.json counts
    return summary


def log_the_run(
    trainer: L.Trainer, dm: DataModule, subset: Tensor | None, out: Path, summary: dict[str, Any]
) -> None:
    """The summary into every logger, so a dashboard can compare the runs of a sweep."""
    metrics = run_metrics(summary)
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            # Its HPARAMS table holds the metrics given beside the settings (it logs them too);
            # its hparams.yaml was written when the fit started, with the model's alone.
            logger.log_hyperparams(summary["config"], metrics)
            if trainer.is_global_zero:
                save_hparams_to_yaml(Path(logger.log_dir) / "hparams.yaml", logger.hparams)
        else:
            logger.log_hyperparams(summary["config"])
            logger.log_metrics(metrics)
        if trainer.is_global_zero and type(logger).__name__ == "WandbLogger":
            log_to_wandb(logger, dm, subset, out)
        logger.save()
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            # End this job's wandb run: the next job of a multirun (same process) would log into
            # it instead of starting its own.
            logger.experiment.finish()


def run_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers, flat: test and validation accuracy, sizes, the wrong labels
    counted and every stage's figures, nested ones by path (wrong_labels/given,
    stages/select/diagnostics/<name>, stages/train/reselect_profiles/<epoch>/<name>); a figure
    the summary holds as null is left out."""
    # Beside `stages`, what a dashboard compares runs on; the config goes in as hyper-parameters,
    # the machine (host, load_average, slurm) not at all.
    figures = (
        "test_accuracy",
        "val_accuracy",
        "train_size",
        "dataset_train_size",
        "subset_size",
        "other_cores_busy",
    )
    metrics = {key: float(summary[key]) for key in figures if summary.get(key) is not None}

    def flatten(path: str, value: Any) -> None:
        if isinstance(value, dict):
            for name, inner in value.items():
                flatten(f"{path}/{name}", inner)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[path] = float(value)  # labels (stages/train/dynamic/method) are no metric

    flatten("wrong_labels", summary.get("wrong_labels"))
    flatten("stages", summary["stages"])
    return metrics
