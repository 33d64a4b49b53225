"""The `clean` group's methods: where the out-of-sample probabilities come from, and what is
done with the labels cleanlab flags. Settings only; lipt.stages.clean runs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from lipt.cleaning.issues import Members
from lipt.core.schema import NON_NEGATIVE, POSITIVE, Range
from lipt.core.settings import Checked

# What a run does with the flagged labels: train without them, or with the suggested class.
Action = Literal["drop", "relabel"]
# cleanlab.filter.find_label_issues's `filter_by` rules.
FilterBy = Literal[
    "prune_by_noise_rate", "prune_by_class", "both", "confident_learning", "predicted_neq_given"
]


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
    probe_folds: Annotated[int, Range(1, 100)] = 5
    probe_weight_decay: Annotated[float, NON_NEGATIVE] = 1e-3
    filter_by: FilterBy = "prune_by_noise_rate"
    datalab: bool = False


@dataclass(frozen=True)
class KFoldCleaning(Checked):
    """`clean=cleanlab`: cleanlab's recipe, K-fold cross-validated probabilities: `folds` copies
    of main training's model and optimiser, each trained `epochs` passes over the other folds
    and scoring its own. `folds=1` (`clean=warmup`): one model over the whole pool scores the
    pool itself, in-sample."""

    PREFIX: ClassVar[str] = "clean"

    name: str = "cleanlab"
    action: Action = "drop"
    folds: Annotated[int, Range(1, 100)] = 5
    epochs: Annotated[float, POSITIVE] = 1.0  # fractions allowed: that share of an epoch's steps
    filter_by: FilterBy = "prune_by_noise_rate"
