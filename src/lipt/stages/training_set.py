"""What main training trains on (`training_set_of`): a subset, given (subset_path), kept from an
earlier attempt, read from rank 0 under DDP, or selected now by lipt.stages.select; or the whole
pool, pruned anew every epoch by lipt.stages.dynamic (budget=infobatch, budget=lipt).

A resumed run trains on what its first attempt chose, re-selected subsets included, and reports
the stages that attempt ran (stages.json) rather than running them again; it is refused when its
selection settings are not those the subset was selected with (lipt.stages.resume).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from lipt.core.artifacts import load_subset
from lipt.core.errors import UserError
from lipt.core.job import is_ddp_child, wait_for_file
from lipt.jigsaw.context import Pretrained
from lipt.report.pictures import SUBSET_PICTURE, write_subset_picture
from lipt.stages.build import Parts
from lipt.stages.dynamic import DynamicSetup, dynamic_pruning
from lipt.stages.pretrain import ranking_models
from lipt.stages.results import Cleaned, Selected, Trained
from lipt.stages.resume import Resume
from lipt.stages.run import Run
from lipt.stages.select import (
    SUBSET_FILE,
    load_checked_subset,
    select_subset,
    subset_meta,
    write_selection,
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


def obtain_subset(
    run: Run, parts: Parts, out: Path, resume: Resume, made: Pretrained | None = None
) -> TrainingSet:
    """The subset to train on: given (subset_path), none (a whole-pool budget), the one a resumed or
    restarted run already chose, or selected now exactly as select.py selects (`made`: the
    model pre-trained in this run already, by label cleaning)."""
    settings, dm = run.settings, parts.dm
    if settings.subset_path:
        return TrainingSet(load_checked_subset(dm, Path(settings.subset_path), run))
    if not run.trains_subset:
        return TrainingSet(None)
    saved = out / SUBSET_FILE
    if resume.subset is not None:
        # A resumed run trains on what the first attempt chose (re-selected ones included).
        kept = TrainingSet(resume.subset, initial=resume.initial, earlier_stages=resume.stages)
        picture = out / SUBSET_PICTURE
        if not picture.exists() and not is_ddp_child():  # killed between subset.npz and it
            assert kept.initial_indices is not None
            write_subset_picture(dm, kept.initial_indices, picture)
        ranks = run.selector is not None and run.selector.needs_model  # pre-trains to select
        if resume.checkpoint is not None or settings.init_from != "pretrained" or not ranks:
            return kept
        if is_ddp_child():  # keeps the init: DDP copies rank 0's weights when fit starts
            return kept
        # Killed after selection, before main training saved an epoch: the pre-trained model
        # (init_from=pretrained) is merged again from the saved learners.
        ranking = ranking_models(run, parts, made)
        kept.pretrained, kept.pretrain_stats = ranking.pretrained, ranking.pretrain_stats
        return kept
    if is_ddp_child():  # extra DDP ranks read what rank 0 chose (under srun: is choosing)
        wait_for_file(saved, ready=functools.partial(selected_for, subset_meta(run, dm)))
        return TrainingSet(load_checked_subset(dm, saved))
    selected = select_subset(run, parts, made)
    write_selection(run, dm, out, selected)
    subset = (selected.indices, selected.weights)
    return TrainingSet(subset, selected, selected.pretrained, selected.pretrain_stats)


def selected_for(meta: dict[str, Any], path: Path) -> bool:
    """Whether the subset file at `path` was selected with `meta` (lipt.stages.select.subset_meta):
    under srun an extra rank starts with rank 0, and may find an earlier run's subset.npz in the
    folder before rank 0 replaces it; one it cannot read is not this run's either."""
    try:
        recorded = load_subset(path)[2]
    except UserError:
        return False
    # A file without a cleaning record was selected from the pool as it is (clean=none).
    wanted, recorded = {"clean": "none", **meta}, {"clean": "none", **recorded}
    return all(recorded.get(key, value) == value for key, value in wanted.items())


def training_set_of(
    run: Run, parts: Parts, out: Path, resume: Resume, cleaned: Cleaned | None
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
        if resume.stages is not None:
            training_set.earlier_stages = resume.stages
    if training_set.pretrained is None:
        training_set.pretrained = made
    if training_set.subset is None:
        parts.dm.set_subset(None)
    else:
        parts.dm.set_subset(*training_set.subset)
    return training_set
