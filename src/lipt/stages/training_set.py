"""What main training trains on (`training_set_of`): a subset, given (subset_path), kept from an
earlier attempt, read from rank 0 under DDP, or selected now by lipt.stages.select; or the whole
pool, pruned anew every epoch by lipt.stages.dynamic (budget=infobatch, budget=lipt).

A resumed run trains on what its first attempt chose, re-selected subsets included, and reports
the stages that attempt ran (stages.json) rather than running them again; it is refused when its
selection settings are not those the subset was selected with (`check_kept_subset`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lipt.core.artifacts import check_subset, load_subset
from lipt.core.errors import UserError
from lipt.core.job import is_ddp_child, wait_for_file
from lipt.data import DataModule
from lipt.jigsaw.context import Pretrained
from lipt.selection.reselection import latest_subset
from lipt.stages.build import Parts
from lipt.stages.dynamic import DynamicSetup, dynamic_pruning, recorded_stages
from lipt.stages.pretrain import ranking_models
from lipt.stages.results import Cleaned, Selected, Trained
from lipt.stages.run import Run
from lipt.stages.select import (
    STAGES_FILE,
    SUBSET_FILE,
    select_subset,
    subset_meta,
    write_selection,
)

log = logging.getLogger(__name__)


def load_checked_subset(dm: DataModule, path: Path) -> tuple[Tensor, Tensor]:
    indices, weights, meta = load_subset(path)
    expected = {"dataset": dm.data_name, "dataset_train_size": len(dm.train_source)}
    check_subset(path, indices, weights, meta, expected, len(dm.train_source), dm.val_indices)
    return indices, weights


def kept_subset(run: Run, out: Path, resume: str | None) -> Path | None:
    """The subset.npz an earlier attempt of this run saved, which this attempt trains on
    instead of selecting (None: it selects, takes subset_path, or trains the whole pool)."""
    saved = out / SUBSET_FILE
    resuming = resume is not None or run.settings.ckpt_path == "last"
    if not resuming or run.settings.subset_path or not run.trains_subset or not saved.is_file():
        return None
    return saved


def check_kept_subset(run: Run, dm: DataModule, out: Path, resume: str | None) -> None:
    """Refuse, before any work, a resume whose selection settings differ from those the kept
    subset was selected with: it would train on the old subset under the new settings' name."""
    saved = kept_subset(run, out, resume)
    if saved is None:
        return
    recorded, now = load_subset(saved)[2], subset_meta(run, dm)
    changed = [key for key in now if key in recorded and recorded[key] != now[key]]
    if changed:
        was = ", ".join(f"{key}={recorded[key]}" for key in changed)
        has = ", ".join(f"{key}={now[key]}" for key in changed)
        raise UserError(
            f"{saved} was selected with {was}, this run has {has}; resume with the original "
            "settings, or pass a new hydra.run.dir to start a new run"
        )


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
    score_stats: dict[str, Any] | None = None  # budget=lipt: the pool's pass through the soup
    dynamic: DynamicSetup | None = None  # the whole pool, pruned anew every epoch
    # The subset selected before main training (subset.npz), where a resumed run trains on a
    # later re-selected one: what summary.json's subset_class_counts describe.
    initial: Tensor | None = None

    @property
    def initial_indices(self) -> Tensor | None:
        """The subset main training started on (None: the whole pool)."""
        if self.initial is not None:
            return self.initial
        return None if self.subset is None else self.subset[0]

    def stages(self, trained: Trained) -> dict[str, dict[str, Any]]:
        """summary.json's stages: pretrain and select when they ran in this run (a resumed run:
        as the attempt that ran them recorded them; re-merging a soup on resume is not its
        cost), then train."""
        if self.earlier_stages is not None:
            return {**self.earlier_stages, "train": trained.stats()}
        stages: dict[str, dict[str, Any]] = {}
        if self.pretrain_stats is not None:
            stages["pretrain"] = self.pretrain_stats
        if self.selected is not None:
            stages["select"] = self.selected.stats()
        if self.score_stats is not None:
            stages["score"] = self.score_stats
        return {**stages, "train": trained.stats()}


def earlier_stages(out: Path) -> dict[str, dict[str, Any]] | None:
    path = out / STAGES_FILE
    return json.loads(path.read_text()) if path.is_file() else None  # None: an older run


def obtain_subset(
    run: Run, parts: Parts, out: Path, resume: str | None, made: Pretrained | None = None
) -> TrainingSet:
    """The subset to train on: given (subset_path), none (a whole-pool budget), the one a resumed or
    restarted run already chose, or selected now exactly as select.py selects (`made`: the
    model pre-trained in this run already, by label cleaning)."""
    settings, dm = run.settings, parts.dm
    if settings.subset_path:
        return TrainingSet(load_checked_subset(dm, Path(settings.subset_path)))
    if not run.trains_subset:
        return TrainingSet(None)
    saved = out / SUBSET_FILE
    if resume is not None and saved.is_file():
        # A resumed run trains on what the first attempt chose (re-selected ones included).
        completed = int(torch.load(resume, map_location="cpu", weights_only=True)["epoch"]) + 1
        reselected = latest_subset(out, completed, settings.reselect_every, saved)
        subset = load_checked_subset(dm, reselected or saved)
        initial = None if reselected is None else load_checked_subset(dm, saved)[0]
        return TrainingSet(subset, initial=initial, earlier_stages=earlier_stages(out))
    if settings.ckpt_path == "last" and saved.is_file():
        # Killed after selection, before main training saved an epoch: keep the subset; the
        # pre-trained model (init_from=pretrained) is merged again from the saved learners.
        subset = load_checked_subset(dm, saved)
        log.info("resuming: the subset in %s is kept (not selected again)", saved)
        earlier = earlier_stages(out)
        ranks = run.selector is not None and run.selector.needs_model  # pre-trains to select
        if settings.init_from != "pretrained" or not ranks or is_ddp_child():
            return TrainingSet(subset, earlier_stages=earlier)
        ranking = ranking_models(run, parts, made)
        return TrainingSet(subset, None, ranking.pretrained, ranking.pretrain_stats, earlier)
    if is_ddp_child():  # extra DDP ranks read what rank 0 chose (under srun: is choosing)
        wait_for_file(saved)
        return TrainingSet(load_checked_subset(dm, saved))
    selected = select_subset(run, parts, made)
    write_selection(run, dm, out, selected)
    subset = (selected.indices, selected.weights)
    return TrainingSet(subset, selected, selected.pretrained, selected.pretrain_stats)


def training_set_of(
    run: Run, parts: Parts, out: Path, resume: str | None, cleaned: Cleaned | None
) -> TrainingSet:
    """What main training trains on, set on the data module: a subset (obtain_subset), or the
    whole pool, pruned anew every epoch (budget=infobatch, budget=lipt)."""
    made = None if cleaned is None else cleaned.pretrained  # by label cleaning
    training_set = obtain_subset(run, parts, out, resume, made)
    if run.prunes:
        dynamic = dynamic_pruning(run, parts, out, resume, made)
        training_set.dynamic = dynamic
        training_set.pretrained = dynamic.pretrained
        training_set.pretrain_stats = dynamic.pretrain_stats
        training_set.score_stats = dynamic.score_stats
        if resume is not None or recorded_stages(run, out):
            training_set.earlier_stages = earlier_stages(out)
    if training_set.pretrained is None:
        training_set.pretrained = made
    if training_set.subset is None:
        parts.dm.set_subset(None)
    else:
        parts.dm.set_subset(*training_set.subset)
    return training_set
