"""The settings a run's results depend on (`RESULT_SETTINGS`), as an earlier attempt's records
hold them: `settled` reads them from a resolved config in one spelling each, so a resume, a
finished summary, a kept subset and label cleaning's clean.json are compared with this run's on
what they computed, not on how a key was spelt or where its work ran."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lipt.core.host import trainer_world_size
from lipt.core.schema import HYDRA_KEYS
from lipt.report.sweep_runs import flatten

# The processes main training runs on (trainer.devices x num_nodes, however spelt): a step's
# batches are theirs together, and a step budget's steps were counted on them, so another number
# resumed the schedule past its end (a cosine over 160 steps run for 256 on one device after two).
PROCESSES = "trainer.processes"

# The Trainer's arguments beside max_epochs that change what main training computes (how many
# batches a step takes, where the fit ends, gradient clipping, the arithmetic's precision), with
# the value Lightning gives each one the `trainer` node leaves out: a resume that adds one
# (+trainer.accumulate_grad_batches=2 after a run without it) changes it as much as one that
# sets another value.
TRAINER_DEFAULTS: dict[str, Any] = {
    "accumulate_grad_batches": 1,
    "gradient_clip_val": None,
    "gradient_clip_algorithm": None,
    "limit_train_batches": None,
    "max_steps": -1,
    "min_epochs": None,
    "min_steps": None,
    "precision": "32-true",
}
# The settings a run's results depend on, as summary.json's `config` records them: a finished
# run's summary stands for a resume only where they are this run's. Others (loggers, folders,
# workers, progress bars) may change between attempts.
RESULT_SETTINGS = (
    "seed",
    "fraction",
    "reselect_every",
    "init_from",
    "subset_path",
    "batch_size",
    "selector",
    "budget",
    "pretrain",
    "augment",
    "prune",
    "merge",
    "clean",
    "model",
    "optimizer",
    "scheduler",
    "trainer.max_epochs",
    # where the fit ends (patience, min_delta, what it watches); a run with callbacks=none has
    # no such keys, which the comparison passes over
    "callbacks.early_stopping",
    *(f"trainer.{key}" for key in TRAINER_DEFAULTS),
    PROCESSES,
    # The data set's every key: its split and labels, and what main training's images are
    # (image_size, mean and std, crop_padding and flip, the data path `resident`, whose
    # augmentation draws its own stream, the reader's arguments)
    "dataset",
)
# Of those, how the work runs and where its inputs and learners are kept, not what it computes:
# they may change between attempts too (saved learners are checked by their own recipe, the
# data by its name, DATA_KEY). dataset._target_ is lipt's DataModule, whose short name would
# take DATA_KEY's place.
PASSED_OVER = (
    "model.channels_last",
    "model.compile",
    "pretrain.num_threads",
    "pretrain.learner_dir",
    "pretrain.merge_from",
    "dataset._target_",
    "dataset.data_dir",
    "dataset.download",
    "dataset.load.data_dir",
    "dataset.load.download",
    "dataset.eval_batch_size",
)
# Passed over on the resident path only: on the DataLoader path the workers draw the
# augmentation, so their number changes the run's results.
WORKERS = "dataset.num_workers"


def settled(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `RESULT_SETTINGS` of a resolved config, by dotted key, less `PASSED_OVER` and
    Hydra's instantiation keys but `_target_`, by its last name: what a group's option is
    (scheduler=linear, not cosine, when every other key is equal), where a `_target_` moved to
    another module by a new lipt version is no other setting."""
    settings: dict[str, Any] = {}
    dataset = config.get("dataset")
    resident = not isinstance(dataset, Mapping) or dataset.get("resident", True) is not False
    unread = unvalidated_callbacks(config)
    for key, value in flatten(config).items():
        last = key.rpartition(".")[2]
        if key in PASSED_OVER or (last in HYDRA_KEYS and last != "_target_"):
            continue
        if any(key.startswith(f"{callback}.") for callback in unread):
            continue
        if key == WORKERS and resident:
            continue
        if not any(key == s or key.startswith(f"{s}.") for s in RESULT_SETTINGS):
            continue
        if last == "_target_":  # scheduler._target_: lipt.models.schedules.cosine -> cosine
            settings[key.rpartition(".")[0]] = str(value).rpartition(".")[2]
        else:
            settings[key] = value
    trainer = config.get("trainer")
    if isinstance(trainer, Mapping):
        for key, default in TRAINER_DEFAULTS.items():  # left out (or null): Lightning's value
            value = same_as_lightning(key, settings.get(f"trainer.{key}"))
            settings[f"trainer.{key}"] = default if value is None else value
        processes = trainer_world_size(trainer)  # None: `auto` on an accelerator it cannot count
        settings[PROCESSES] = processes or f"{trainer.get('devices')} x {trainer.get('num_nodes')}"
    return settings


def unvalidated_callbacks(config: Mapping[str, Any]) -> list[str]:
    """`callbacks.<name>` of the callbacks that watch a validation metric in a run without a
    validation split (dataset.val_size=0): main training leaves them out (build_callbacks), so
    their settings change nothing it computes."""
    dataset, callbacks = config.get("dataset"), config.get("callbacks")
    if not isinstance(dataset, Mapping) or dataset.get("val_size") != 0:
        return []
    if not isinstance(callbacks, Mapping):
        return []
    return [
        f"callbacks.{name}"
        for name, node in callbacks.items()
        if isinstance(node, Mapping) and str(node.get("monitor", "")).startswith("val/")
    ]


# Spellings Lightning takes for one setting: precision's aliases, and values that mean "off".
PRECISION_ALIASES = {"32": "32-true", "64": "64-true", "16": "16-mixed", "bf16": "bf16-mixed"}
# (values, of types) that mean "off": limit_train_batches=1 (an int) is one batch an epoch
NO_LIMIT = {
    "gradient_clip_val": ((0, 0.0), (int, float)),
    "limit_train_batches": ((1.0,), (float,)),
}


def same_as_lightning(key: str, value: Any) -> Any:
    """`value` of trainer.`key` in the one spelling Lightning reads it as: precision 32 is
    "32-true", a clip of 0 no clipping (None), a limit of 1.0 of the batches no limit (None);
    None stays None (the key is left out)."""
    if value is None:
        return None
    if key == "precision":
        return PRECISION_ALIASES.get(str(value), str(value))
    off, types = NO_LIMIT.get(key, ((), ()))
    if type(value) in types and value in off:
        return None
    return value


# The key the data set's name goes by in a record (as in subset.npz's meta): it digests an
# ImageFolder tree's files, so it changes with them.
DATA_KEY = "dataset"
