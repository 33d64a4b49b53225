"""Every check that spans several keys, in one place. A single key's type and range is pydantic's,
on its declaration (lipt.core.schema); what a library refuses is found by building the object
(lipt.run.preflight). Each rule raises one UserError that names the keys and the fix.

`check_settings` needs only the run's typed settings (no torch); `check_groups_together` reads
group keys whose own types lipt.run.groups has checked. A sweep's every job meets both before its
first job starts (lipt.run.precheck).

A setting this run would not read is refused, not ignored, where a user must have set it. A key
of another stage (train.py's reselect_every in select.py, pre-training's keys beside a saved
subset) passes: one list of overrides is often given to pretrain.py, select.py and train.py.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

from lipt.core.budget import PoolSizes
from lipt.core.errors import UserError
from lipt.core.settings import DatasetSettings
from lipt.data.batch_transforms import RANDAUGMENT_CHANNELS
from lipt.run.groups import as_typed
from lipt.stages.run import Run

NO_PRETRAINING = "lipt.warmup.NoPretraining"
JIGSAW_PRETRAINING = "lipt.jigsaw.strategy.JigsawPretraining"
JIGSAW_CLEANING = "lipt.cleaning.JigsawCleaning"
LINEAR_SCHEDULE = "lipt.models.schedules.linear"


def check_settings(run: Run) -> None:
    """The rules across the top level, `dataset.*`, the selector and the budget."""
    for rule in (
        _dataset,
        _reader,
        _selector,
        _budget,
        _reselect,
        _main_training,
        _init_from,
        _optimized_metric,
    ):
        rule(run)


def check_groups_together(run: Run) -> None:
    """The rules across group keys: pre-training's, label cleaning's, the schedule's, a step
    budget's trainer, the model's shapes and what the callbacks monitor."""
    for rule in (_learner_jobs, _jigsaw, _clean, _schedule, _steps, _model, _trainer, _callbacks):
        rule(run)


def _dataset(run: Run) -> None:
    dataset = run.dataset
    noise = dataset.label_noise
    if noise is not None and noise["rate"] > 0 and dataset.train_labels is not None:
        raise UserError(
            "dataset.label_noise.rate > 0 and dataset.train_labels both replace the labels; "
            "set one of them (dataset.label_noise.rate=0 keeps the given labels)"
        )
    pairs, classes = None if noise is None else noise["pairs"], dataset.num_classes
    if pairs is not None and (
        len(pairs) != classes or max(pairs) >= classes or any(p == c for c, p in enumerate(pairs))
    ):
        raise UserError(
            f"dataset.label_noise.pairs={pairs} is invalid: give each of the {classes} classes "
            f"another class in 0..{classes - 1}"
        )
    for key in ("mean", "std"):
        if len(getattr(dataset, key)) != dataset.channels:
            raise UserError(
                f"dataset.{key}={getattr(dataset, key)} is invalid: give one value per channel "
                f"({dataset.channels}, dataset.channels)"
            )


def _reader(run: Run) -> None:
    """A reader's key (`dataset.resize`, `num_train`, ...) reaches the reader only where
    `dataset.load` takes it (the configs interpolate it there): set beside a reader that takes
    no such key, nothing reads it. `name` is the data set's label."""
    node, load = run.node("dataset"), run.dataset.load
    for key in DatasetSettings.READER_KEYS:
        if key != "name" and node.get(key) is not None and key not in load:
            raise UserError(
                f"dataset.{key}={as_typed(node[key])} is ignored: dataset={run.dataset.name}'s "
                f"reader ({load.get('_target_')}) takes no {key}; drop it"
            )


def _selector(run: Run) -> None:
    selector, settings = run.selector, run.settings
    if selector is not None and selector.needs_held_out and run.dataset.val_size == 0:
        raise UserError(
            f"selector={selector.name} matches the validation split, but dataset.val_size=0; "
            "set dataset.val_size > 0 (or use gradmatch's selector.target=train)"
        )
    if settings.stage == "select" and selector is None:
        raise UserError("selector=none selects nothing; choose a selector, e.g. selector=glister")
    repeats = 1 if selector is None else selector.repeats
    if selector is None or repeats == 1 or settings.stage == "pretrain":
        return  # pretrain.py selects nothing: a selector there only labels the run
    if not selector.needs_model:
        raise UserError(
            f"selector.repeats={repeats} averages the ranks of several models, but "
            f"selector={selector.name} ranks with none; drop selector.repeats"
        )
    if settings.stage == "select" and settings.ckpt_path is not None:
        raise UserError(
            f"selector.repeats={repeats} needs {repeats} pre-trained models, but ckpt_path gives "
            "one; drop ckpt_path to pre-train them here, or drop selector.repeats"
        )


def _budget(run: Run) -> None:
    """A subset needs a selector (or a saved subset), the whole pool takes none, and lipt's
    pruning needs the jigsaw ensemble. select.py selects and pretrain.py pre-trains, whatever
    main training would spend."""
    budget, selector, settings = run.budget, run.selector, run.settings
    if settings.stage in ("select", "pretrain"):
        return  # main training's budget: train.py's alone
    if budget.trains_subset and selector is None and settings.subset_path is None:
        raise UserError(
            f"budget={budget.name} trains a subset, but selector=none chooses none; choose a "
            "selector (e.g. selector=glister) or a saved subset (subset_path=...)"
        )
    if not budget.trains_subset and selector is not None and settings.subset_path is None:
        raise UserError(
            f"budget={budget.name} trains the whole pool, so selector={selector.name} cannot "
            f"choose a subset; drop budget={budget.name} (a selector trains its subset) or use "
            "selector=none"
        )
    no_pretraining = run.node("pretrain").get("_target_") == NO_PRETRAINING
    if run.prunes and budget.needs_ensemble and no_pretraining:
        raise UserError(
            f"budget={budget.name} scores epoch 0 with the jigsaw ensemble, but pretrain=none "
            "trains none; use pretrain=jigsaw (the default), or budget=infobatch or "
            "budget=full_schedule to train without pre-training"
        )


def _reselect(run: Run) -> None:
    """Re-selection re-runs the selector during main training, on the subset this run selected
    (lipt.stages.select.reselection): never on a saved subset or on the whole pool, and every R
    epochs but not after the last, so a period of the run's epochs or more re-selects never."""
    settings, budget = run.settings, run.budget
    every, stage = settings.reselect_every, settings.stage
    if every == 0 or stage != "train":  # train.py's key, in a pipeline's shared overrides
        return
    if settings.subset_path is not None:
        raise UserError(
            f"reselect_every={every} re-runs the selector during training, but subset_path "
            "trains a saved subset, never re-selected; drop subset_path or use reselect_every=0"
        )
    if not budget.trains_subset:
        approach = run.config.get("approach")
        # an approach pins its budget: the fix is another approach, not another group option
        instead = (
            f"an approach that trains its subset (e.g. +approach=coverage in place of "
            f"+approach={approach})"
            if isinstance(approach, str)
            else f"a selector, which trains its subset (e.g. selector=coverage in place of "
            f"budget={budget.name})"
        )
        raise UserError(
            f"budget={budget.name} trains the whole pool, so reselect_every={every} has no "
            f"subset to re-select; choose {instead}, or use reselect_every=0"
        )
    trainer = run.node("trainer")
    epochs, max_steps = trainer.get("max_epochs"), trainer.get("max_steps")
    if type(max_steps) is int and max_steps > 0:
        return  # ended by its steps (debug=fdr's smoke run): its epochs do not bound it
    if type(epochs) is int and 1 <= epochs <= every:  # an ill-typed one: the trainer's check
        key = _reselect_key(run)
        below = f"a {key} below {epochs} (e.g. {max(1, epochs // 10)}), " if epochs > 1 else ""
        raise UserError(
            f"{key}={every} re-selects after every {every} epochs, but "
            f"trainer.max_epochs={epochs} ends the run first, so the subset is never "
            f"re-selected; use {below}more trainer.max_epochs, or {key}=0"
        )


def _reselect_key(run: Run) -> str:
    """The key a user sets reselect_every by: an experiment's period for the job's approach
    (`reselect_every: ${oc.select:protocol.reselect_every.${approach},0}`), else its own."""
    approach = run.config.get("approach")
    periods = (run.config.get("protocol") or {}).get("reselect_every") or {}
    if isinstance(approach, str) and periods.get(approach) == run.settings.reselect_every:
        return f"protocol.reselect_every.{approach}"
    return "reselect_every"


def _main_training(run: Run) -> None:
    """A saved subset is what select.py makes, and pretrain.py resumes from no checkpoint (it
    reuses the jigsaw learners its run folder holds)."""
    settings, stage = run.settings, run.settings.stage
    if stage != "train" and settings.subset_path is not None:
        raise UserError(
            f"subset_path={settings.subset_path} is main training's, which {stage}.py does not "
            "run; drop subset_path (train.py subset_path=... trains it)"
        )
    if stage == "pretrain" and settings.ckpt_path is not None:
        raise UserError(
            f"ckpt_path={settings.ckpt_path} is ignored: pretrain.py resumes from no checkpoint "
            "(run again in the same folder, it reuses the jigsaw learners and a full warm-up's "
            "epochs saved there); drop ckpt_path"
        )


def pretrains(run: Run) -> bool:
    """Whether the run pre-trains a model (what init_from=pretrained starts from): pretrain.py
    always; else false when pre-training is none, or when neither the selector (a subset it
    selects, select.py without ckpt_path), the budget's pruning (budget=lipt) nor label cleaning
    (clean=lipt's soup) asks for one. K-fold cleaning (clean=cleanlab, warmup) trains folds,
    not a pre-trained model."""
    settings, selector = run.settings, run.selector
    if run.node("pretrain").get("_target_") == NO_PRETRAINING:
        return False
    if settings.stage == "pretrain" or run.node("clean").get("_target_") == JIGSAW_CLEANING:
        return True
    ranks = selector is not None and selector.needs_model
    if settings.stage == "select":
        return ranks and settings.ckpt_path is None
    return (ranks and settings.subset_path is None) or (run.prunes and run.budget.needs_ensemble)


def _init_from(run: Run) -> None:
    settings = run.settings
    if settings.stage == "train" and settings.init_from == "pretrained" and not pretrains(run):
        raise UserError(
            "init_from=pretrained needs a model pre-trained in this run: use a pretrain "
            "other than none and budget=lipt or a selector that ranks with a model"
        )


def _optimized_metric(run: Run) -> None:
    """`optimized_metric` names a number train.py's summary.json will hold (its values:
    lipt.core.settings.RunSettings)."""
    metric, stage = run.settings.optimized_metric, run.settings.stage
    if metric is None:
        return
    if stage != "train":
        raise UserError(f"optimized_metric is train.py's; drop it for {stage}.py")
    trainer = run.node("trainer")
    limit = trainer.get("limit_val_batches")
    for key, value, empty in (
        ("dataset.val_size", run.dataset.val_size, no_validation_rows(run)),
        ("trainer.limit_val_batches", limit, type(limit) in (int, float) and limit == 0),
    ):
        if empty:
            raise UserError(
                f"optimized_metric={metric} needs a validation result, but {key}={value} "
                f"validates nothing; set a larger {key}"
            )
    _validated_within(run, epochs_at_most(run))


def _validated_within(run: Run, epochs: int | None) -> None:
    """Refuse `optimized_metric` where main training's `epochs` (at most; None: the config does
    not tell) end before its first validation: every trainer.check_val_every_n_epoch epochs,
    the first at epoch N, where a step budget stops in it too (lipt.stages.training_plan checks
    a step budget's epochs again once the pool is read)."""
    every = None if epochs is None else run.unvalidated_period(epochs)
    if epochs is None or every is None:
        return
    metric, fewer = run.settings.optimized_metric, epochs != run.main_epochs
    trains = f" in the {epochs} epoch{'s' * (epochs != 1)} budget={run.budget.name} trains"
    raise UserError(
        f"optimized_metric={metric} needs a validation result, but "
        f"trainer.check_val_every_n_epoch={every} validates nothing{trains if fewer else ''}; "
        f"set a smaller trainer.check_val_every_n_epoch{f' ({epochs} or less)' if fewer else ''}"
    )


def epochs_at_most(run: Run) -> int | None:
    """The most epochs main training runs, as far as the config tells before the data is read
    (None: it does not; an ill-typed trainer.max_epochs is the trainer's check, after this
    one): the budget's epochs (InfoBatch's, those `fraction` buys), a step budget's those its
    steps span: at most ceil(fraction x max_epochs) for full_schedule on the pool as read, at
    most trainer.max_epochs for full_steps (its steps depend on the pool's size:
    lipt.stages.training_plan checks them once the data is read)."""
    epochs = run.node("trainer").get("max_epochs")
    if type(epochs) is not int or epochs < 1:
        return None
    budget = run.main_budget
    fraction = float(run.settings.fraction)
    if not budget.counts_steps:  # epochs that no pool size changes
        sizes = PoolSizes(
            pool=1, pool_before_cleaning=1, batch_size=1, max_epochs=epochs, fraction=fraction
        )
        return budget.schedule(sizes).epochs
    if getattr(budget, "steps", None) != "schedule":
        return epochs  # full_steps: min(max_epochs, what its steps span)
    # full_schedule: round(fraction x E x S) steps of S an epoch span ceil(fraction x E) epochs
    # at most, where cleaning leaves the pool as read; a cleaned pool's epochs are more
    return math.ceil(fraction * epochs) if "_target_" not in run.node("clean") else None


def no_validation_rows(run: Run) -> bool:
    """Whether the validation split is empty: val_size=0, or a share that rounds to no row of
    a data set whose size the config gives (synthetic data's num_train)."""
    share, rows = run.dataset.val_size, run.dataset.num_train
    return share == 0 or (0 < share < 1 and rows is not None and round(share * rows) == 0)


def _learner_jobs(run: Run) -> None:
    """`pretrain.learners` picks the learners of one job of a pretrain.py learner sweep."""
    learners, stage = run.node("pretrain").get("learners"), run.settings.stage
    if learners is not None and stage != "pretrain":
        raise UserError(
            f"pretrain.learners={learners} trains some learners in the jobs of a pretrain.py -m "
            f"sweep; drop it for {stage}.py (null: the run trains and merges them all)"
        )


def _jigsaw(run: Run) -> None:
    """pretrain=jigsaw's keys with one another and with the groups augment, prune and merge."""
    pretrain, augment = run.node("pretrain"), run.node("augment")
    if "num_learners" not in pretrain:
        return  # another pre-training
    n, learners = pretrain["num_learners"], pretrain.get("learners")
    if pretrains(run) and no_validation_rows(run):  # every merge scores its soup there
        raise UserError(
            f"pretrain=jigsaw scores its soup on the validation split, but dataset.val_size="
            f"{run.dataset.val_size} leaves it empty; set a larger dataset.val_size"
        )
    if learners is not None:
        ids = list(learners) if not isinstance(learners, int) else [learners]
        if not ids or not all(0 <= i < n for i in ids) or len(set(ids)) != len(ids):
            raise UserError(
                f"pretrain.learners={learners!r} is invalid: use null (all learners), an id in "
                f"0..{n - 1}, or a list of distinct ids; sweep them with "
                f"'pretrain.learners=range({n})'"
            )
    merge_from = pretrain.get("merge_from")
    if merge_from is not None:
        if learners is not None:
            raise UserError(
                "pretrain.merge_from merges saved learners and pretrain.learners trains some: "
                "set only one of them"
            )
        if not Path(str(merge_from)).expanduser().is_dir():
            raise UserError(
                f"pretrain.merge_from={merge_from} is not a folder; give the folder holding "
                "learner_<i>.ckpt (e.g. <sweep dir>/learners)"
            )
        _merge_from_seeds(run, str(merge_from))
    _learner_batches(run, pretrain)
    min_learners = pretrain.get("min_learners")
    if min_learners is not None and min_learners > n:
        raise UserError(
            f"pretrain.min_learners={min_learners} is invalid: use null (half) or 1..{n} "
            "(pretrain.num_learners)"
        )
    channels = run.dataset.channels
    if "num_ops" in augment and pretrains(run) and channels not in RANDAUGMENT_CHANNELS:
        raise UserError(  # as lipt.data.DataModule refuses it, here before any work
            f"augment=randaugment takes grey (1) or RGB (3) images, but dataset.channels="
            f"{channels}; use augment=none"
        )
    if "num_ops" in augment and augment["magnitude"] >= augment["num_magnitude_bins"]:
        raise UserError(  # augment=randaugment
            f"augment.magnitude={augment['magnitude']} is invalid: use "
            f"0..{augment['num_magnitude_bins'] - 1} (below augment.num_magnitude_bins)"
        )
    prune = run.node("prune")
    low, high = prune.get("density_low"), prune.get("density_high")
    if low is not None and high is not None and low > high:
        raise UserError(
            f"prune.density_low={low!r}, prune.density_high={high!r} are invalid: densities are "
            "kept fractions with 0 < density_low <= density_high <= 1 (paper: 0.85, 0.95)"
        )
    ratios = run.node("merge").get("ratios")
    if ratios is not None and not isinstance(ratios, int | str) and max(ratios, default=0) <= 0:
        raise UserError(
            f"merge.ratios={list(ratios)} is invalid: a list of ratios needs one above 0 "
            "(or a number of grid steps, or running_mean)"
        )


def _learner_batches(run: Run, pretrain: dict) -> None:
    """The learners' trainers take trainer.limit_train_batches too: a share that leaves a
    learner's M minibatches none would fail every learner, and the run would end saying that
    no learner was left to merge."""
    limit, m = run.node("trainer").get("limit_train_batches"), pretrain.get("batches_per_learner")
    if not (isinstance(limit, float) and isinstance(m, int) and pretrains(run)):
        return
    if 0 < limit < 1 and int(limit * m) == 0:
        share = f", or a share of {math.ceil(100 / m) / 100} or more" if m > 1 else ""
        raise UserError(
            f"trainer.limit_train_batches={limit} trains int({limit} x {m}) = 0 of a jigsaw "
            f"learner's pretrain.batches_per_learner={m} minibatches an epoch; give a number of "
            f"batches (+trainer.limit_train_batches=1){share}"
        )


def _merge_from_seeds(run: Run, merge_from: str) -> None:
    """`selector.repeats` merges each of its models from the saved learners of its own seed:
    the folder must hold them all (the check the run makes before its first merge)."""
    from lipt.core.seeding import repeat_seed  # torch, as check_groups imported it
    from lipt.jigsaw.strategy import check_seed_folders

    selector, settings = run.selector, run.settings
    if selector is None or settings.stage == "pretrain" or not pretrains(run):
        return  # pretrain.py, a saved subset or ckpt_path: no models of other seeds are merged
    seeds = [repeat_seed(settings.seed, r) for r in range(selector.repeats)]
    check_seed_folders(merge_from, seeds, settings.seed)


def _clean(run: Run) -> None:
    """The `clean` group cleans the pool before selection, lipt's with a pre-trained soup."""
    node, settings = run.node("clean"), run.settings
    if "_target_" not in node:
        return
    name = node.get("name")
    if settings.stage == "pretrain":
        raise UserError(
            f"clean={name} cleans the pool before selection, which pretrain.py does not run; "
            f"use select.py clean={name} (or drop clean)"
        )
    if settings.subset_path is not None:
        raise UserError(
            f"clean={name} cleans the pool before selection, but subset_path skips selection; "
            "drop subset_path or use clean=none"
        )
    if settings.stage == "select" and node.get("action") == "relabel":
        raise UserError(  # subset.npz holds rows, not labels: train.py would train the old ones
            f"clean.action=relabel changes labels, which select.py's subset.npz does not keep; "
            f"run train.py clean={name} clean.action=relabel (it cleans, selects and trains), "
            "or use clean.action=drop"
        )
    if node["_target_"] != JIGSAW_CLEANING:
        return
    pretrain = run.node("pretrain")
    if pretrain.get("_target_") != JIGSAW_PRETRAINING:
        # pretrain=full's one model, trained on every item, would judge its own labels
        raise UserError(
            f"clean={name} finds label issues with the jigsaw stage's soup and learners, but "
            f"pretrain={pretrain.get('name')} trains neither; use pretrain=jigsaw (the "
            "default) or clean=cleanlab"
        )
    if settings.stage == "select" and settings.ckpt_path is not None:
        raise UserError(
            f"clean={name} pre-trains the soup it cleans with in this run; drop ckpt_path"
        )


def _schedule(run: Run) -> None:
    """A decay to zero over the budget needs the budget's end in steps; a clock ends the run
    wherever the learning rate then is."""
    max_time = run.node("trainer").get("max_time")
    if run.node("scheduler").get("_target_") == LINEAR_SCHEDULE and max_time is not None:
        raise UserError(
            f"scheduler=linear decays to zero over the run's steps, but trainer.max_time="
            f"{max_time} ends it by the clock; drop trainer.max_time or use "
            "scheduler=cosine|constant"
        )


def _steps(run: Run) -> None:
    """A step budget counts the trainer's processes: the node must tell how many; and a step
    budget ends the fit itself, where the trainer's least epochs or steps would not let it."""
    from lipt.stages.training_plan import check_countable_steps  # Lightning

    check_countable_steps(run)
    budget, trainer = run.budget, run.node("trainer")
    if not run.main_budget.counts_steps:
        return
    for key in ("min_epochs", "min_steps"):
        least = trainer.get(key)
        if least is not None and least != 0:  # 0: no least, Lightning's own
            raise UserError(
                f"trainer.{key}={as_typed(least)} may keep training past the optimiser steps "
                f"budget={budget.name} stops at (Lightning ignores a stop before it), beyond "
                f"the schedule's end; drop trainer.{key}"
            )


def _model(run: Run) -> None:
    """The model's head and first layer fit the data (the model configs interpolate them), and
    its images are no smaller than the model's `min_image_size` (where it declares one), which
    would otherwise fail in a pooling layer at the first batch, after every earlier stage."""
    model, dataset = run.node("model"), run.dataset
    for key, data_key in (("num_classes", "num_classes"), ("in_channels", "channels")):
        if key in model and model[key] != getattr(dataset, data_key):
            raise UserError(
                f"model.{key}={model[key]} does not fit dataset.{data_key}="
                f"{getattr(dataset, data_key)}; drop model.{key} (it follows the data set)"
            )
    from lipt.run.groups import locate

    target = model.get("_target_")
    try:  # one that cannot be imported is lipt.run.groups' to refuse, with its own error
        least = getattr(locate(str(target)), "min_image_size", None) if target else None
    except (ImportError, AttributeError):
        least = None
    if isinstance(least, int) and dataset.image_size < least:
        raise UserError(
            f"dataset.image_size={dataset.image_size} is smaller than {target}'s smallest "
            f"input, {least}x{least} (its pooling leaves nothing of a smaller image); use "
            f"dataset.image_size={least} or more, or a model without pooling (model=resnet18)"
        )


def _trainer(run: Run) -> None:
    trainer = run.node("trainer")
    strategy = str(trainer.get("strategy", "auto"))
    if any(word in strategy for word in ("spawn", "fork", "notebook")):
        raise UserError(  # the spawned ranks train and return; the model here is no trainer's
            f"trainer.strategy={strategy} trains in processes started from this one, whose "
            "trained model and counts lipt does not get back (the run would end in a traceback "
            "after training); use trainer.strategy=ddp"
        )
    if trainer.get("enable_checkpointing") is False:  # Lightning refuses it beside a checkpoint
        raise UserError(
            "trainer.enable_checkpointing=false: main training keeps a rolling last.ckpt, which "
            "ckpt_path=last resumes from; drop trainer.enable_checkpointing"
        )
    every = trainer.get("val_check_interval")
    if isinstance(every, int | float) and (every < 0 or (type(every) is int and every == 0)):
        raise UserError(  # Lightning fails on it mid-fit, after every earlier stage
            f"trainer.val_check_interval={every} validates never: give a number of batches "
            "(1 or more), a share of an epoch in [0, 1], or drop it (once an epoch)"
        )
    _half_precision_on_cpu(trainer)


def _half_precision_on_cpu(trainer: dict) -> None:
    """float16 on the CPU: Lightning trains bfloat16 instead and says so in a warning only,
    while the run's records would name float16."""
    precision = str(trainer.get("precision", "32-true"))
    if precision not in ("16", "16-mixed"):
        return
    from lightning.pytorch.accelerators import CUDAAccelerator  # torch, as check_groups imported

    accelerator = str(trainer.get("accelerator", "auto"))
    if accelerator == "cpu" or (accelerator == "auto" and not CUDAAccelerator.is_available()):
        raise UserError(
            f"trainer.precision={precision}: float16 mixed precision needs a GPU, and on the CPU "
            "Lightning would train bfloat16 under this name; use trainer.precision=bf16-mixed, "
            "or a GPU"
        )


def _callbacks(run: Run) -> None:
    """A callback that keeps or stops on a metric the model logs reads it the right way up:
    the lowest loss and the highest accuracy are the best (mode, the class's default where
    unset). A metric the model does not log is lipt.run.preflight's to refuse."""
    from lipt.models.classifier import LOGGED_METRICS  # torch, as check_groups imported it
    from lipt.run.groups import locate

    for name, node in (run.node("callbacks") or {}).items():
        if not isinstance(node, dict) or "_target_" not in node:
            continue
        monitor, mode = str(node.get("monitor")), node.get("mode")
        if monitor not in LOGGED_METRICS:
            continue
        if mode is None:
            parameter = inspect.signature(locate(str(node["_target_"]))).parameters.get("mode")
            if parameter is None or not isinstance(parameter.default, str):
                continue
            mode = parameter.default
        best = "min" if "loss" in monitor else "max" if "acc" in monitor else None
        if best is not None and mode != best:
            worst = "highest" if best == "min" else "lowest"
            raise UserError(
                f"callbacks.{name}.monitor={monitor} with mode={mode} takes the {worst} "
                f"{monitor} for the best; set callbacks.{name}.mode={best}"
            )
