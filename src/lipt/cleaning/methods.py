"""The `clean` group's methods: where the out-of-sample probabilities come from, and what is
done with the labels cleanlab flags. Each is a callable: given what it may ask of the run it
cleans (`PoolWork`, which lipt.stages.clean provides: the pre-training, the soup's pass over the
pool, a fold's training), it finds the pool's label issues (`Found`). lipt.stages.clean writes
and applies them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Protocol

import torch
from torch import Tensor, nn

from lipt.cleaning.inputs import FilterBy, rarest_class_below
from lipt.cleaning.issues import (
    LabelIssues,
    Members,
    find_issues,
    fold_of,
    jigsaw_probs,
    probe_issues,
    shard_owner,
)
from lipt.core.bounds import NON_NEGATIVE, POSITIVE, Interval
from lipt.core.errors import UserError
from lipt.core.settings import Checked
from lipt.selection.types import PoolOutputs

# What a run does with the flagged labels: train without them, or with the suggested class.
Action = Literal["drop", "relabel"]


class PoolWork(Protocol):
    """What a cleaning method may ask of the run whose pool it cleans (rows in pool order)."""

    seed: int
    num_classes: int
    targets: Tensor  # [N], the labels as given

    def pretrain(self) -> Any:
        """The run's pre-training (a lipt.jigsaw.context.Pretrained): its soup `model`, the
        learners' `learner_heads` and `head_shards`."""

    def soup_outputs(self, soup: nn.Module) -> PoolOutputs:
        """The pool once through `soup`: logits, embeddings, targets, in pool order."""

    def fold_probs(self, train: Tensor, held: Tensor, epochs: float) -> tuple[Tensor, int]:
        """Main training's model trained `epochs` passes over the `train` rows (a mask [N]),
        then its softmax on the `held` rows [H, C]; and the samples it trained."""


def check_fold_count(key: str, folds: int, pool_size: int) -> None:
    """More folds than the pool has items leaves a fold empty."""
    if folds > pool_size:
        raise UserError(
            f"{key}={folds} is more folds than the pool's {pool_size} items; "
            f"use {key}={min(5, pool_size)} (or a larger pool)"
        )


@dataclass
class Found:
    """A method's label issues (rows: pool positions), what it decided on, and its cost."""

    issues: LabelIssues
    seconds: float  # finding them, pre-training excluded (stages.pretrain's)
    samples: int  # trained to find them (K folds' models; 0 for the soup's)
    what: str  # what the probabilities came from, for the console
    outputs: PoolOutputs | None = None  # the soup's pass over the pool (lipt's finder)
    probs: Tensor | None = None  # [N, C]: what cleanlab decided on (lipt's finder)
    pretrained: Any = None  # the pre-training it made (lipt's finder): selection reuses it


@dataclass(frozen=True)
class JigsawCleaning(Checked):
    """`clean=lipt`: probabilities from the jigsaw stage (pretrain=jigsaw). `members`: `probe`,
    a linear probe on the soup's embeddings, cross-validated over `probe_folds` folds
    (lipt.cleaning.issues.probe_probs); `soup`, `heads` or `ensemble`, the soup's and its
    learners' predictions, each row's own learner left out (jigsaw_probs). The soup is the
    run's pre-trained model, so selection reuses it. `datalab`: also hand the soup's embeddings
    and those probabilities to cleanlab's Datalab (label issues, outliers, near duplicates;
    lipt.cleaning.datalab)."""

    PREFIX: ClassVar[str] = "clean"

    name: str = "lipt"
    action: Action = "drop"
    members: Members = "probe"
    probe_folds: Annotated[int, Interval(ge=1, le=100)] = 5
    probe_weight_decay: Annotated[float, NON_NEGATIVE] = 1e-3
    filter_by: FilterBy = "prune_by_noise_rate"
    datalab: bool = False

    reuses_saved_issues: ClassVar[bool] = False  # a resume finds them again, learners reused

    def check_pool(self, labels: Tensor) -> None:
        """Before pre-training: the pool's `labels` [N] fill `probe_folds` folds, and, for the
        probe, each class present fills them (a class missing from a fold's training rows is
        one the probe cannot suggest: each of its items would be flagged)."""
        check_fold_count("clean.probe_folds", self.probe_folds, len(labels))
        if self.members != "probe":
            return
        short = rarest_class_below(labels, self.probe_folds)
        if short is not None:
            c, fewest = short
            fix = f"use clean.probe_folds={fewest}, or give" if fewest >= 2 else "give"
            raise UserError(
                f"clean.probe_folds={self.probe_folds}: class {c} has {fewest} item(s) in the "
                f"pool, fewer than the folds, and the probe's cross-validation needs one per "
                f"fold; {fix} the class at least {self.probe_folds} items"
            )

    def __call__(self, work: PoolWork) -> Found:
        """The pool through the soup once, then `members`: a cross-validated linear probe on
        its embeddings (`probe`, lipt.cleaning.probe_issues, as lipt.find_label_issues), or its
        softmax and its learners' heads, each row's own learner left out (jigsaw_probs);
        cleanlab decides on those probabilities."""
        pretrained = work.pretrain()
        start = time.perf_counter()
        outputs = work.soup_outputs(pretrained.model)
        if self.members == "probe":
            probs, issues = probe_issues(
                outputs,
                work.num_classes,
                self.probe_folds,
                work.seed,
                self.probe_weight_decay,
                self.filter_by,
            )
        else:
            shards = pretrained.head_shards
            owner = None if shards is None else shard_owner(outputs.indices, shards)
            probs = jigsaw_probs(
                outputs.logits, outputs.embeddings, pretrained.learner_heads, owner, self.members
            )
            issues = find_issues(outputs.targets, probs, self.filter_by)
        seconds = time.perf_counter() - start
        what = f"the jigsaw soup ({self.members})"
        return Found(issues, seconds, 0, what, outputs, probs, pretrained)


@dataclass(frozen=True)
class KFoldCleaning(Checked):
    """`clean=cleanlab`: cleanlab's recipe, K-fold cross-validated probabilities: `folds` copies
    of main training's model and optimiser, each trained `epochs` passes over the other folds
    and scoring its own. `folds=1` (`clean=warmup`): one model over the whole pool scores the
    pool itself, in-sample."""

    PREFIX: ClassVar[str] = "clean"

    name: str = "cleanlab"
    action: Action = "drop"
    folds: Annotated[int, Interval(ge=1, le=100)] = 5
    epochs: Annotated[float, POSITIVE] = 1.0  # fractions allowed: that share of an epoch's steps
    filter_by: FilterBy = "prune_by_noise_rate"

    reuses_saved_issues: ClassVar[bool] = True  # a resume reads them back, folds not retrained
    datalab: ClassVar[bool] = False  # Datalab needs the soup's embeddings

    def check_pool(self, labels: Tensor) -> None:
        """Before the folds train: the pool's `labels` [N] fill `folds` folds."""
        check_fold_count("clean.folds", self.folds, len(labels))

    def __call__(self, work: PoolWork) -> Found:
        """Each fold's rows scored by a model trained on the other folds (`folds=1`: the whole
        pool, in-sample), then cleanlab's decision on those probabilities."""
        start = time.perf_counter()
        n = len(work.targets)
        fold = fold_of(n, self.folds, work.seed)  # [N]
        probs = torch.empty(n, work.num_classes)
        samples = 0
        for k in range(self.folds):
            held = fold == k if self.folds > 1 else torch.ones(n, dtype=torch.bool)
            train = ~held if self.folds > 1 else torch.ones(n, dtype=torch.bool)
            probs[held], trained = work.fold_probs(train, held, self.epochs)  # rows ascending
            samples += trained
        issues = find_issues(work.targets, probs, self.filter_by)
        seconds = time.perf_counter() - start
        what = f"{self.folds} folds" if self.folds > 1 else "one model, in-sample"
        return Found(issues, seconds, samples, what)
