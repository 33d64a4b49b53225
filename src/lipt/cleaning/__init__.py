"""Wrong labels: lipt's label-issue finder from the jigsaw learners, cleanlab's K-fold recipe,
how well either finds the labels known to be wrong, and cleanlab's Datalab on the finder's
embeddings and probabilities (README.md). The Python API for your own model and data,
lipt.find_label_issues and lipt.datalab_report, is lipt.stages.label_issues."""

from lipt.cleaning.datalab import DatalabReport, datalab_issues, write_datalab
from lipt.cleaning.issues import (
    LabelIssues,
    detection_quality,
    find_issues,
    fit_softmax_regression,
    fold_of,
    jigsaw_probs,
    probe_issues,
    probe_probs,
    score_pool,
    shard_owner,
)
from lipt.cleaning.methods import Found, JigsawCleaning, KFoldCleaning, PoolWork

__all__ = [
    "DatalabReport",
    "Found",
    "JigsawCleaning",
    "KFoldCleaning",
    "LabelIssues",
    "PoolWork",
    "datalab_issues",
    "detection_quality",
    "find_issues",
    "fit_softmax_regression",
    "fold_of",
    "jigsaw_probs",
    "probe_issues",
    "probe_probs",
    "score_pool",
    "shard_owner",
    "write_datalab",
]
