"""Where a run resumes from, read once from its folder before any stage and handed down.

A run resumes (`ckpt_path=last`, or a checkpoint) from what an earlier attempt left in its
folder: summary.json, where it finished (it stands: `finished_summary`); checkpoints/last.ckpt,
main training's last epoch; subset.npz and the subsets re-selected after it (subsets/), what main
training trains on; stages.json, what the stages before main training cost then. Each is checked
here, before any work: a checkpoint main training cannot resume from, a finished summary, a
checkpoint or a subset of a run with other settings than this run's (`RESULT_SETTINGS`, the
data set), is refused in one line (`refuse_other_settings`). Main training's checkpoints record
the settings (`RunRecord`). Label cleaning's files are read back by lipt.stages.clean, where the
cleaning method says whether they may be.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from torch import Tensor

from lipt.core import console
from lipt.core.artifacts import check_lightning_checkpoint, load_subset
from lipt.core.errors import UserError
from lipt.core.host import trainer_world_size
from lipt.core.job import is_ddp_child, logged_before_this_process, sweep_dir_of_job
from lipt.core.schema import HYDRA_KEYS
from lipt.data import DataModule
from lipt.data.sources import undigested_name
from lipt.jigsaw.checkpoints import LEARNERS_DIR
from lipt.report.sweep import flatten
from lipt.selection.reselection import latest_subset
from lipt.stages.run import Run
from lipt.stages.select import (
    STAGES_FILE,
    SUBSET_FILE,
    check_subset_fits,
    load_checked_subset,
    subset_meta,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resume:
    """What this attempt takes from an earlier one (all None: it starts from scratch)."""

    checkpoint: str | None = None  # main training resumes from it; None: from its first epoch
    # The subset main training was on at the checkpoint (subset.npz, or the latest subset
    # re-selected after it), which this attempt trains on instead of selecting again.
    subset: tuple[Tensor, Tensor] | None = None
    initial: Tensor | None = None  # subset.npz's indices, where a re-selected subset replaced it
    stages: dict[str, dict[str, Any]] | None = None  # stages.json: what the earlier stages cost


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
    *(f"trainer.{key}" for key in TRAINER_DEFAULTS),
    PROCESSES,
    "dataset.name",
    "dataset.val_size",
    "dataset.split_seed",
    "dataset.pool_size",
    "dataset.label_noise",
    "dataset.train_labels",
)
# Of those, how the work runs and where the learners are kept, not what it computes: they may
# change between attempts too (saved learners are checked by their own recipe).
PASSED_OVER = (
    "model.channels_last",
    "model.compile",
    "pretrain.num_threads",
    "pretrain.learner_dir",
    "pretrain.merge_from",
)


def finished_summary(run: Run, out: Path) -> dict[str, Any] | None:
    """Resuming a sweep re-runs its every job: one that finished keeps its results as they are
    (a second test pass would overwrite its stage timings with a resume's).

    Raises:
        UserError: summary.json is of a run with other settings (`RESULT_SETTINGS`): it
            would stand for this one.
    """
    finished = out / "summary.json"
    if run.settings.ckpt_path != "last" or not finished.is_file() or is_ddp_child():
        return None
    summary: dict[str, Any] = json.loads(finished.read_text())
    recorded, now = settled(summary.get("config", {})), settled(run.config)
    refuse_other_settings(f"{finished} is of a run with", recorded, now)
    log.info(f"{console.shown(out)} finished already: its summary.json stands")
    return summary


def settled(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `RESULT_SETTINGS` of a resolved config, by dotted key, less `PASSED_OVER` and
    Hydra's instantiation keys but `_target_`, by its last name: what a group's option is
    (scheduler=linear, not cosine, when every other key is equal), where a `_target_` moved to
    another module by a new lipt version is no other setting."""
    settings: dict[str, Any] = {}
    for key, value in flatten(config).items():
        last = key.rpartition(".")[2]
        if key in PASSED_OVER or (last in HYDRA_KEYS and last != "_target_"):
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
NEW_RUN = "pass a new hydra.run.dir to start a new run"


def refuse_other_settings(
    what: str, recorded: Mapping[str, Any], now: Mapping[str, Any], instead: str = NEW_RUN
) -> None:
    """Refuse, in one line, what an earlier attempt left (`what`: "<file> is of a run with")
    where the settings it records are not this run's `now`: up to 3 of the keys that differ,
    with their old and new values, and how to go on (`instead`: the other way than resuming
    with the original settings). Keys one side lacks are passed over: another lipt version's.

    Raises:
        UserError: some key both have differs.
    """
    changed = [key for key in recorded if key in now and recorded[key] != now[key]]
    if not changed:
        return
    was = ", ".join(f"{key}={recorded[key]}" for key in changed[:3])
    has = ", ".join(f"{key}={now[key]}" for key in changed[:3])
    more = f" ({len(changed) - 3} more differ)" if len(changed) > 3 else ""
    if changed == [DATA_KEY] and undigested_name(str(recorded[DATA_KEY]), str(now[DATA_KEY])):
        raise UserError(
            f"{what} {was}, this run has {has}: an older lipt's name of this ImageFolder tree, "
            f"which did not digest its files; {instead}"
        )
    again = "the data set as it was" if changed == [DATA_KEY] else "the original settings"
    raise UserError(f"{what} {was}, this run has {has}{more}; resume with {again}, or {instead}")


class RunRecord(L.Callback):
    """On main training's Trainer: its checkpoints record the run's `settled` settings and the
    data set's name (lipt.data.DataModule.data_name), which a resume checks before any work
    (`resume_checkpoint`). It only adds its state to a checkpoint: it touches no random
    stream and no batch, and a resumed fit restores nothing from it (it records this attempt's
    settings from then on, the same ones)."""

    KEY = "lipt.RunRecord"  # in checkpoint["callbacks"]

    def __init__(self, run: Run, dm: DataModule) -> None:
        self.settings = settled(run.config)
        self.data = dm.data_name

    @property
    def state_key(self) -> str:
        return self.KEY

    def state_dict(self) -> dict[str, Any]:
        return {"settings": dict(self.settings), "data": self.data}


def recorded_settings(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """What `RunRecord` recorded in a checkpoint of main training (its `payload`), the data
    set's name under `DATA_KEY`; None for a checkpoint that records nothing (an older lipt's)."""
    callbacks = payload.get("callbacks")
    record = callbacks.get(RunRecord.KEY) if isinstance(callbacks, Mapping) else None
    if not isinstance(record, Mapping):
        return None
    recorded = dict(record.get("settings") or {})
    if record.get("data") is not None:
        recorded[DATA_KEY] = record["data"]
    return recorded


def resume_of(run: Run, dm: DataModule, out: Path) -> Resume:
    """Where this attempt resumes from, each file checked now (`resume_checkpoint`,
    `kept_subset`)."""
    checkpoint, completed = resume_checkpoint(run, dm, out)
    subset, initial = kept_subset(run, dm, out, completed)
    stages_file = out / STAGES_FILE
    resuming = run.settings.ckpt_path is not None
    stages = json.loads(stages_file.read_text()) if resuming and stages_file.is_file() else None
    return Resume(checkpoint, subset, initial, stages)


def resume_checkpoint(run: Run, dm: DataModule, out: Path) -> tuple[str | None, int | None]:
    """The checkpoint main training resumes from (ckpt_path) and the epochs it completed,
    checked now, before anything of the run starts: a Lightning checkpoint of main training, of
    a run with this run's settings (`RESULT_SETTINGS`) and data. (None, None) where main
    training starts from its first epoch.

    Raises:
        UserError: no such checkpoint, one main training cannot resume from, or one of a run
            with other settings or data (main training would go on under the new ones, and
            summary.json report the whole run as theirs).
    """
    path = checkpoint_path(run, out)
    if path is None:
        return None, None
    ckpt = run.settings.ckpt_path
    named = f"ckpt_path=last: {path}" if ckpt == "last" else f"ckpt_path={ckpt}"
    payload = check_lightning_checkpoint(path, named)  # mapped, not read: read once here
    recorded = recorded_settings(payload)
    if recorded is not None:
        now = {**settled(run.config), DATA_KEY: dm.data_name}
        instead = NEW_RUN if ckpt == "last" else "leave out ckpt_path to start over"
        refuse_other_settings(f"{named} is of a run with", recorded, now, instead)
    return str(path), int(payload["epoch"]) + 1


def checkpoint_path(run: Run, out: Path) -> Path | None:
    """The file `ckpt_path` names (`last`: this run folder's checkpoints/last.ckpt); None where
    main training starts from its first epoch (a run killed before it saved one)."""
    ckpt = run.settings.ckpt_path
    if not ckpt:
        return None
    if ckpt != "last":
        if not Path(str(ckpt)).is_file():
            raise UserError(
                f"ckpt_path={ckpt} does not exist; give a Lightning checkpoint or 'last'"
            )
        return Path(str(ckpt))
    last = out / "checkpoints" / "last.ckpt"
    if last.is_file():
        return last
    if (out / SUBSET_FILE).is_file() or any((out / LEARNERS_DIR).glob("learner_*.ckpt")):
        return None  # killed before main training: its saved learners and subset are reused
    if sweep_dir_of_job() is not None:
        log.info("resuming a sweep: this job never started, so it starts now")
        return None
    if logged_before_this_process(out):
        log.info(f"resuming {console.shown(out)}: nothing saved yet: starting over")
        return None
    raise UserError(
        f"ckpt_path=last but {last} does not exist; pass hydra.run.dir=<the run to resume>"
    )


def kept_subset(
    run: Run, dm: DataModule, out: Path, completed: int | None
) -> tuple[tuple[Tensor, Tensor] | None, Tensor | None]:
    """The subset an earlier attempt of this run selected, which this attempt trains on, and
    subset.npz's indices where a later re-selection replaced it. None where there is none, or
    where this run takes subset_path or trains the whole pool.

    Raises:
        UserError: the subset was selected with other settings than this run's (it would train
            on the old subset under the new settings' name), or does not fit the data.
    """
    saved = out / SUBSET_FILE
    resuming = completed is not None or run.settings.ckpt_path == "last"
    if not resuming or run.settings.subset_path or not run.trains_subset or not saved.is_file():
        return None, None
    indices, weights, recorded = load_subset(saved)
    refuse_other_settings(f"{saved} was selected with", recorded, subset_meta(run, dm))
    check_subset_fits(dm, saved, indices, weights, recorded)
    if completed is None:
        # Killed after selection, before main training saved an epoch: the subset is kept.
        log.info("resuming: the subset in %s is kept (not selected again)", saved)
        return (indices, weights), None
    # The subset in force at the checkpoint (`completed` epochs): re-selected ones included.
    reselected = latest_subset(out, completed, run.settings.reselect_every, indices)
    if reselected is None:
        return (indices, weights), None
    return load_checked_subset(dm, reselected), indices
