"""Label cleaning (the `clean` group), between pre-training and selection in train.py and
select.py: out-of-sample probabilities for the pool (lipt's jigsaw learners, or cleanlab's K
folds), cleanlab's `find_label_issues` on them, then the run trains without the flagged labels
(`drop`) or with the suggested class (`relabel`).

Writes label_issues.csv (index, given, suggested, score; most likely wrong first),
label_issues.png and clean.json (stages.clean, the cost and, when the wrong labels are known,
precision and recall, and the settings of the run that found them); with `clean.datalab`
(lipt's finder), cleanlab's Datalab on the same embeddings and probabilities:
datalab_issues.csv and datalab_summary.json. A resumed run of K-fold cleaning reads them back
instead of training the folds again, where an attempt with its settings found them (not an
earlier run's of others in the folder); lipt's is recomputed, reusing the saved jigsaw learners.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from lipt.cleaning import (
    LabelIssues,
    datalab_issues,
    detection_quality,
    score_pool,
    write_datalab,
)
from lipt.cleaning.issues_csv import ISSUES_FILE, read_issues, write_issues
from lipt.core import console
from lipt.core.artifacts import write_json
from lipt.core.job import is_ddp_child, wait_for_file
from lipt.data import DataModule
from lipt.jigsaw.context import Pretrained
from lipt.report.pictures import ISSUES_PICTURE, write_issues_picture
from lipt.selection import PoolOutputs, model_outputs
from lipt.stages.build import CleaningMethod, Parts, progress_bars
from lipt.stages.pretrain import pretrain_model, pretrain_stats
from lipt.stages.result_settings import DATA_KEY, PROCESSES, settled
from lipt.stages.results import Cleaned
from lipt.stages.run import Run

log = logging.getLogger(__name__)

CLEAN_FILE = "clean.json"


def clean_pool(run: Run, parts: Parts, out: Path, resume: bool) -> Cleaned | None:
    """Find the pool's label issues with the `clean` method, write them, and apply its action
    to the data module. `resume`: the run resumes (ckpt_path=last), so K-fold issues already
    written are read back rather than found again; an extra DDP rank always reads rank 0's.
    Only issues an attempt with this run's settings found are read back (`cleaned_with`)."""
    method, dm = parts.cleaning, parts.dm
    if method is None:
        return None
    method.check_pool(dm.train_source.labels[dm.pool_indices])  # before any pre-training
    saved, costs = out / ISSUES_FILE, out / CLEAN_FILE
    settings = cleaning_settings(run, dm)
    # an older lipt's record stands for a resume, in rank 0 and srun's other tasks alike
    older = older_cleaning(costs) if resume else None
    if is_ddp_child() and older is None:  # srun starts every task at once: rank 0 may still
        # be finding them, where an earlier run of other settings may have left its own
        wait_for_file(costs, ready=functools.partial(cleaned_with, settings))
    # None: no attempt with these settings; else an older lipt's record, of no settings: what
    # it found stands, as it did then (its subset records no cleaning either:
    # lipt.stages.resume.with_cleaning)
    earlier = recorded_cleaning(costs, settings) or older
    reuse = is_ddp_child() or (resume and method.reuses_saved_issues)
    scored: Scored | None = None
    if reuse and earlier is not None and saved.is_file():
        cleaned = Cleaned(read_issues(saved), {})
        log.info(f"cleaning: {len(cleaned.issues):,} label issues read from {saved}")
    else:
        cleaned, scored = find_scored_issues(run, parts, method)
    if (resume or is_ddp_child()) and earlier is not None:
        # What the attempt that found them recorded: a resume's re-merge is not their cost.
        cleaned.stats, cleaned.pretrain_stats = earlier["clean"], earlier.get("pretrain")
    elif not is_ddp_child():
        issues = cleaned.issues
        write_issues(saved, issues)  # before Datalab: one that fails leaves the flags on disk
        if scored is not None and method.datalab:
            cleaned.stats["datalab"] = run_datalab(scored, out, method.filter_by)
        recorded = {"clean": cleaned.stats}
        if cleaned.pretrain_stats is not None:
            recorded["pretrain"] = cleaned.pretrain_stats
        recorded[SETTINGS_KEY] = settings
        write_json(costs, recorded)  # with label_issues.csv, what a resume reads back
        write_issues_picture(dm, issues.rows, issues.given, issues.suggested, out / ISSUES_PICTURE)
    apply_action(dm, cleaned.issues, method.action)
    return cleaned


# In clean.json: the settings of the run that found the issues (`cleaning_settings`).
SETTINGS_KEY = "settings"


# Selection's and main training's settings, which label cleaning (before both) does not use:
# a resume that changes one (trainer.max_epochs) reads the issues back rather than finding them
# again. clean=lipt's soup is jigsaw's, which takes neither `fraction` nor the main epochs.
NOT_FOR_CLEANING = (
    "selector",
    "budget",
    "fraction",
    "reselect_every",
    "init_from",
    "subset_path",
    "callbacks",
    "trainer.max_epochs",
    "trainer.min_epochs",
    "trainer.max_steps",
    "trainer.min_steps",
    PROCESSES,
)


def cleaning_settings(run: Run, dm: DataModule) -> dict[str, Any]:
    """What clean.json records of the run that found its issues: its result settings
    (lipt.stages.result_settings.settled) less `NOT_FOR_CLEANING`, and the data set's name."""
    settings = {
        key: value
        for key, value in settled(run.config).items()
        if not any(key == s or key.startswith(f"{s}.") for s in NOT_FOR_CLEANING)
    }
    return {**settings, DATA_KEY: dm.data_name}


def older_cleaning(path: Path) -> dict[str, Any] | None:
    """clean.json at `path` as an older lipt wrote it (issues and costs, no settings), else
    None."""
    recorded = cleaning_record(path)
    return recorded if recorded and SETTINGS_KEY not in recorded else None


def recorded_cleaning(path: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """clean.json at `path` where an attempt with `settings` wrote it, else None (none there,
    an unreadable one, or an earlier run's of other settings, or an older lipt's that recorded
    none)."""
    recorded = cleaning_record(path)
    # through JSON as clean.json holds them: (1, 2) is [1, 2] there
    wanted = json.loads(json.dumps(settings))
    return recorded if recorded and recorded.get(SETTINGS_KEY) == wanted else None


def cleaning_record(path: Path) -> dict[str, Any] | None:
    """clean.json at `path` as written (None: none there, or unreadable)."""
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) and "clean" in recorded else None


def cleaned_with(settings: dict[str, Any], path: Path) -> bool:
    """Whether the clean.json at `path` was written by an attempt with `settings`: under srun
    an extra rank starts with rank 0, and may find an earlier run's in the folder before rank 0
    replaces it."""
    return recorded_cleaning(path, settings) is not None


@dataclass(frozen=True)
class Scored:
    """What lipt's finder computed on the pool (rows in pool order): the soup's outputs, its
    embeddings among them, and the probabilities cleanlab decided on."""

    outputs: PoolOutputs
    probs: Tensor  # [N, C]


@dataclass
class RunPoolWork:
    """What a cleaning method may ask of this run (lipt.cleaning.PoolWork): its pre-training,
    the soup's pass over the pool, a fold of main training's model."""

    run: Run
    parts: Parts

    def __post_init__(self) -> None:
        self.dm = self.parts.dm
        self.seed = self.run.settings.seed
        self.num_classes = self.dm.num_classes
        self.targets = self.dm.train_source.labels[self.dm.pool_indices]  # [N], as given

    def pretrain(self) -> Pretrained:
        return pretrain_model(self.parts, self.seed)

    def soup_outputs(self, soup: nn.Module) -> PoolOutputs:
        dm = self.dm
        with console.progress("cleaning: pool scored by the soup", len(dm.pool_indices)) as step:
            batches = console.counted(dm.pool_dataloader(), step)
            outputs = score_pool(soup, batches, self.parts.device)
        assert torch.equal(outputs.indices, dm.pool_indices), "the pass scores the pool, in order"
        assert torch.equal(outputs.targets, dm.train_source.labels[dm.pool_indices].long())
        return outputs

    def fold_probs(self, train: Tensor, held: Tensor, epochs: float) -> tuple[Tensor, int]:
        pool = self.dm.pool_indices
        model, trained = train_fold(self.run, self.parts, pool[train], epochs, self.seed)
        held_out = self.dm.unaugmented(pool[held])
        outputs = model_outputs(model, held_out, self.parts.device, channels_last=True)
        return torch.softmax(outputs.logits.float(), dim=1), trained


def find_scored_issues(
    run: Run, parts: Parts, method: CleaningMethod
) -> tuple[Cleaned, Scored | None]:
    """The method's label issues on the pool (its probabilities, then cleanlab's decision), as
    summary.json's stages.clean counts them; and for lipt's finder what it scored the pool with
    (None: K folds)."""
    dm = parts.dm
    pool = dm.pool_indices
    found = method(RunPoolWork(run, parts))
    issues, pretrained = found.issues, found.pretrained
    pretrain_seconds = 0.0 if pretrained is None else pretrained.seconds
    stats: dict[str, Any] = {
        "method": method.name,
        "action": method.action,
        "flagged": len(issues),
        "pool": len(pool),
        "seconds": round(found.seconds, 3),
        "samples": found.samples,
        # Finding the issues in all, the pre-training it needed included.
        "detection_seconds": round(found.seconds + pretrain_seconds, 3),
    }
    if dm.label_changes is not None:
        stats.update(detection_quality(issues.rows, dm.label_changes.wrong[pool]))
    log.info(
        f"cleaning: {len(issues):,} of {len(pool):,} labels flagged by cleanlab on {found.what} "
        f"({stats['detection_seconds']:.0f} s); action: {method.action}"
        + (
            f"; precision {stats['precision']:.2f}, recall {stats['recall']:.2f}"
            if "precision" in stats
            else ""
        )
    )
    flagged = LabelIssues(pool[issues.rows], issues.given, issues.suggested, issues.score)
    made = None if pretrained is None else pretrain_stats([pretrained])
    cleaned = Cleaned(issues=flagged, stats=stats, pretrained=pretrained, pretrain_stats=made)
    scored = None
    if found.outputs is not None and found.probs is not None:
        scored = Scored(found.outputs, found.probs)
    return cleaned, scored


def run_datalab(scored: Scored, out: Path, filter_by: str) -> dict[str, Any]:
    """`clean.datalab`: cleanlab's Datalab on the soup's embeddings and the probabilities the
    labels were judged on; datalab_issues.csv and datalab_summary.json beside label_issues.csv.
    Returns stages.clean's `datalab`: each issue type's count, and the seconds."""
    outputs = scored.outputs
    report = datalab_issues(
        outputs.targets, outputs.embeddings, scored.probs, outputs.indices, filter_by=filter_by
    )
    write_datalab(out, report)
    log.info(
        "cleaning: Datalab flagged "
        + ", ".join(f"{v['flagged']:,} {k}" for k, v in report.summary.items())
        + f" ({report.seconds:.0f} s)"
    )
    return {
        **{kind: found["flagged"] for kind, found in report.summary.items()},
        "seconds": round(report.seconds, 3),
    }


def train_fold(
    run: Run, parts: Parts, rows: Tensor, epochs: float, seed: int
) -> tuple[nn.Module, int]:
    """Main training's model and optimiser from the common init of `seed`, `epochs` passes
    (fractions: that share of the steps) over `rows`; the model and the samples it trained."""
    dm = parts.dm
    model = parts.initial_model(seed)
    module = parts.classifier(model)
    steps = max(1, round(epochs * math.ceil(len(rows) / run.settings.batch_size)))
    trainer = parts.quiet_trainer(
        max_epochs=math.ceil(epochs),
        max_steps=steps,
        enable_progress_bar=progress_bars(run) and console.bars_enabled(),  # =false is kept
    )
    L.seed_everything(seed, workers=True, verbose=False)
    dm.set_subset(rows)
    try:
        trainer.fit(module, train_dataloaders=dm.train_dataloader())
    finally:
        dm.set_subset(None)
    return model, int(module.samples_seen)


def apply_action(dm: DataModule, issues: LabelIssues, action: str) -> None:
    """`drop`: the flagged items leave the pool; `relabel`: they take the suggested class."""
    if action == "drop":
        dm.drop_from_pool(issues.rows)
    else:
        dm.relabel(issues.rows, issues.suggested)
