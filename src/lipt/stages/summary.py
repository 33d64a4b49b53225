"""`summary.json`: the one file other tools read after a run (docs/DESIGN.md, "Artifacts")."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import Tensor

from lipt.data import DataModule
from lipt.selection.common import split_budget
from lipt.stages.run import Run

log = logging.getLogger(__name__)


def subset_class_counts(dm: DataModule, indices: Tensor) -> list[int]:
    """How many samples of each class the subset holds, warning when it is legal but degenerate:
    smaller than the number of classes, or with a class that has no sample (a model trained on
    it never sees that class)."""
    labels = dm.train_source.labels[indices]  # [k] int64
    counts = [int(c) for c in torch.bincount(labels, minlength=dm.num_classes)]
    size, classes = len(indices), len(counts)
    empty = [c for c, n in enumerate(counts) if n == 0]
    if not empty:
        return counts
    shown = ", ".join(str(c) for c in empty[:10]) + (", ..." if len(empty) > 10 else "")
    if size < classes:  # no selector gives every class a sample: only a larger subset does
        log.warning(
            "the subset holds %d sample(s), fewer than the %d classes: %d of %d classes have no "
            "sample in the subset (classes %s); raise fraction",
            size,
            classes,
            len(empty),
            classes,
            shown,
        )
        return counts
    pool = torch.bincount(dm.train_source.labels[dm.pool_indices], minlength=classes).tolist()
    balanced = size <= sum(pool) and counts == split_budget(pool, size)
    if balanced:  # class-balanced already: the empty classes' shares of the subset are < 1
        fix = "their share of the subset rounds to 0 (they are small in the pool); raise fraction"
    else:
        fix = "raise fraction or use a class-balanced selector (selector.balance=true)"
    log.warning(
        "%d of %d classes have no sample in the subset of %d (classes %s); %s",
        len(empty),
        classes,
        size,
        shown,
        fix,
    )
    return counts


def summary_payload(
    run: Run,
    dm: DataModule,
    test_accuracy: float | None,
    subset_size: int | None,
    stages: dict[str, dict[str, Any]],
    class_counts: list[int] | None = None,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "test_accuracy": None if test_accuracy is None else float(test_accuracy),
        "train_size": len(dm.pool_indices),
        "dataset_train_size": len(dm.train_source),
        "subset_size": subset_size,
        "stages": stages,
        "config": dict(run.config),
    }
    if class_counts is not None:
        payload["subset_class_counts"] = class_counts
    if "SLURM_JOB_ID" in os.environ:  # which job (and requeued attempt) wrote this record
        payload["slurm"] = {
            "job": os.environ["SLURM_JOB_ID"],
            "array_job": os.environ.get("SLURM_ARRAY_JOB_ID"),
            "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
            "restarts": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
            "tasks": int(os.environ.get("SLURM_NTASKS", "1") or 1),
        }
    changes = dm.label_changes
    if changes is not None:  # wrong labels (dataset.label_noise or train_labels), as counted
        pool = dm.pool_indices
        payload["wrong_labels"] = {
            "given": int(changes.wrong.sum()),  # in the training split, as the run was given
            # in the pool as selection and training saw it, after any label cleaning
            "pool": int((dm.train_source.labels[pool] != changes.original[pool]).sum()),
        }
    return payload
