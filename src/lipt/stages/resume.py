"""Where a run resumes from, read once from its folder before any stage and handed down.

A run resumes (`ckpt_path=last`, or a checkpoint) from what an earlier attempt left in its
folder: summary.json, where it finished (it stands: `finished_summary`); checkpoints/last.ckpt,
main training's last epoch; subset.npz and the subsets re-selected after it (subsets/), what main
training trains on; stages.json, what the stages before main training cost then. Each is checked
here, before any work: a checkpoint main training cannot resume from, a finished summary, a
checkpoint or a subset of a run with other settings than this run's
(lipt.stages.result_settings.RESULT_SETTINGS, the data set), is refused in one line
(`refuse_other_settings`). Main training's checkpoints record
the settings (`RunRecord`). Label cleaning's files are read back by lipt.stages.clean, where the
cleaning method says whether they may be.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

from lipt.core import console
from lipt.core.artifacts import check_lightning_checkpoint, load_subset
from lipt.core.errors import UserError
from lipt.core.job import is_ddp_child, logged_before_this_process, sweep_dir_of_job
from lipt.data import DataModule
from lipt.data.sources import undigested_name
from lipt.jigsaw.checkpoints import LEARNERS_DIR
from lipt.selection.reselection import latest_subset
from lipt.stages.clean import CLEAN_FILE, older_cleaning
from lipt.stages.result_settings import DATA_KEY, settled
from lipt.stages.run import Run
from lipt.stages.select import (
    STAGES_FILE,
    SUBSET_FILE,
    check_subset_fits,
    load_checked_subset,
    subset_meta,
)
from lipt.warmup.saved import WARMUP_DIR

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


def finished_summary(run: Run, out: Path) -> dict[str, Any] | None:
    """Resuming a sweep re-runs its every job: one that finished keeps its results as they are
    (a second test pass would overwrite its stage timings with a resume's).

    Raises:
        UserError: summary.json is of a run with other settings (lipt.stages.result_settings): it
            would stand for this one.
    """
    finished = out / "summary.json"
    if run.settings.ckpt_path != "last" or not finished.is_file() or is_ddp_child():
        return None
    summary = read_saved_json(
        finished, "delete it, and ckpt_path=last tests the run's last checkpoint again"
    )
    recorded, now = settled(summary.get("config", {})), settled(run.config)
    refuse_other_settings(f"{finished} is of a run with", recorded, now)
    log.info(f"{console.shown(out)} finished already: its summary.json stands")
    return summary


def read_saved_json(path: Path, fix: str) -> dict[str, Any]:
    """A JSON object an earlier attempt saved in the run folder (summary.json, stages.json).

    Raises:
        UserError: it does not read as one (truncated, or not lipt's), naming `fix`.
    """
    try:
        payload = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:  # ValueError: bad JSON, bad UTF-8
        raise UserError(f"{path} is not readable JSON ({type(e).__name__}); {fix}") from e
    if not isinstance(payload, dict):
        raise UserError(f"{path} holds a JSON {type(payload).__name__}, not lipt's object; {fix}")
    return payload


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

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """A run folder moved or renamed since the checkpoint was saved: its checkpoint
        callbacks' records are carried over to where the folder is now, before they load.
        Lightning's ModelCheckpoint drops a record of another folder, so best.ckpt would
        take the next epoch's weights, better or not."""
        states = checkpoint.get("callbacks")
        if isinstance(states, dict):
            moved_checkpoint_records(trainer.checkpoint_callbacks, states)


# The fields of a ModelCheckpoint's state that name its folder or files in it.
_CHECKPOINT_PATHS = ("dirpath", "best_model_path", "kth_best_model_path", "last_model_path")


def moved_checkpoint_records(callbacks: list[Any], states: dict[str, Any]) -> None:
    """Rewrite, in place, the checkpoint callbacks' `states` (a checkpoint's "callbacks") that
    name files of the run folder where it was (the rolling checkpoint's folder's parent, as
    recorded) to name them where it is now (that callback's folder's parent)."""
    rolling = [
        cb
        for cb in callbacks
        if isinstance(cb, ModelCheckpoint)
        and cb.filename == "last"
        and os.path.basename(str(cb.dirpath)) == "checkpoints"
    ]
    recorded = states.get(rolling[0].state_key) if rolling else None
    was = recorded.get("dirpath") if isinstance(recorded, dict) else None
    if not isinstance(was, str) or os.path.basename(was) != "checkpoints":
        return
    old, new = os.path.dirname(was), os.path.dirname(str(rolling[0].dirpath))
    if old == new:
        return

    def moved(path: Any) -> Any:
        inside = isinstance(path, str) and path.startswith(old + os.sep)
        return new + path[len(old) :] if inside else path

    for cb in callbacks:
        state = states.get(cb.state_key) if isinstance(cb, ModelCheckpoint) else None
        if isinstance(state, dict):
            state.update({key: moved(state[key]) for key in _CHECKPOINT_PATHS if key in state})
            if isinstance(state.get("best_k_models"), dict):
                state["best_k_models"] = {moved(k): v for k, v in state["best_k_models"].items()}


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
    stages = None
    if resuming and stages_file.is_file():
        # the seconds of the stages before main training: summary.json counts them
        fix = "delete it to resume without the earlier stages' seconds (summary.json omits them)"
        stages = read_saved_json(stages_file, fix)
    return Resume(checkpoint, subset, initial, stages)


def resume_checkpoint(run: Run, dm: DataModule, out: Path) -> tuple[str | None, int | None]:
    """The checkpoint main training resumes from (ckpt_path) and the epochs it completed,
    checked now, before anything of the run starts: a Lightning checkpoint of main training, of
    a run with this run's settings (lipt.stages.result_settings) and data. (None, None) where main
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
        given = Path(str(ckpt)).expanduser()  # as lipt.run.config checked it: ~ is home
        if not given.is_file():
            raise UserError(
                f"ckpt_path={ckpt} does not exist; give a Lightning checkpoint or 'last'"
            )
        return given
    last = out / "checkpoints" / "last.ckpt"
    if last.is_file():
        return last
    # killed before main training: its saved learners, warm-up and subset are reused
    saved = (LEARNERS_DIR, "learner_*.ckpt"), (WARMUP_DIR, "*.ckpt")
    if (out / SUBSET_FILE).is_file() or any(any((out / d).glob(p)) for d, p in saved):
        return None
    if sweep_dir_of_job() is not None:
        log.info("resuming a sweep: this job never started, so it starts now")
        return None
    if logged_before_this_process(out):
        log.info(f"resuming {console.shown(out)}: nothing saved yet: starting over")
        return None
    raise UserError(
        f"ckpt_path=last but {last} does not exist; pass hydra.run.dir=<the run to resume>"
    )


def with_cleaning(recorded: dict[str, Any], out: Path) -> dict[str, Any]:
    """A subset file's `recorded` selection settings, with clean=none where it records no
    label cleaning (lipt.stages.select.cleaning_meta); left as they are beside an older lipt's
    clean.json, which recorded neither what it cleaned with nor the subset's cleaning."""
    if "clean" in recorded:
        return recorded
    # none there (or unreadable): the subset was selected without cleaning
    older = older_cleaning(out / CLEAN_FILE) is not None
    return recorded if older else {**recorded, "clean": "none"}


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
    try:
        indices, weights, recorded = load_subset(saved)
    except UserError as e:  # its "re-run select.py" is not how a run of train.py goes on
        unread = str(e).partition(";")[0]
        # before main training saved an epoch, the run selects it again; after, it trained on it
        fix = "delete it to select it again" if completed is None else NEW_RUN
        raise UserError(f"{unread}; {fix}") from e
    now = {"clean": "none", **subset_meta(run, dm)}
    refuse_other_settings(f"{saved} was selected with", with_cleaning(recorded, out), now)
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
