"""Wrong labels: lipt's label-issue finder from the jigsaw learners, cleanlab's K-fold recipe,
and how well either finds the labels known to be wrong (README.md)."""

from lipt.cleaning.issues import (
    LabelIssues,
    detection_quality,
    find_issues,
    fit_softmax_regression,
    fold_of,
    jigsaw_probs,
    probe_probs,
    shard_owner,
)
from lipt.cleaning.methods import JigsawCleaning, KFoldCleaning

__all__ = [
    "JigsawCleaning",
    "KFoldCleaning",
    "LabelIssues",
    "detection_quality",
    "find_issues",
    "fit_softmax_regression",
    "fold_of",
    "jigsaw_probs",
    "probe_probs",
    "shard_owner",
]
