"""cleanlab's Datalab on what lipt's label-issue finder computed: the jigsaw soup's embeddings as
Datalab's `features` and the probe's out-of-sample probabilities as its `pred_probs`. Besides the
label issues (the same confident-learning decision lipt's finder makes), Datalab finds outliers
(items far from their k nearest neighbours in the embedding) and near duplicates (items much
closer to a neighbour than the pool's median distance), for the cost of its k-nearest-neighbour
graph: no model runs again.

`datalab_issues` is the pure step (tensors in, a report out); lipt.datalab_report runs it on
lipt.find_label_issues's result, and `clean=lipt clean.datalab=true` writes it beside
label_issues.csv (`write_datalab`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from lipt.cleaning.inputs import as_cpu_tensor, class_labels, rows_summing_to_one
from lipt.core.artifacts import atomic_write_bytes, write_json

# The issue types asked of Datalab by default: those the embeddings and probabilities answer.
ISSUE_TYPES = ("label", "outlier", "near_duplicate")
ISSUES_FILE = "datalab_issues.csv"
SUMMARY_FILE = "datalab_summary.json"
COLUMNS = ["index", "issue_type", "score", "given", "suggested", "near_duplicates"]


@dataclass(frozen=True)
class DatalabReport:
    """Datalab's findings on the scored items.

    `issues`: a pandas DataFrame with one row per flagged item and issue type (COLUMNS: the
    item's `index` in the data set, the `issue_type`, Datalab's `score` for it, lower being
    more severe, the `given` and `suggested` class, and for a near duplicate the indices of
    its set, space-separated), by issue type, most severe first. `summary`: per issue type the
    count `flagged` and Datalab's overall `score` of the data set on it. `seconds`: Datalab's
    find_issues. `lab`: the cleanlab.Datalab, for its own report() and get_issues()."""

    issues: Any
    summary: dict[str, dict[str, float]]
    seconds: float
    lab: Any

    def flagged(self, issue_type: str) -> Tensor:
        """[F] int64: the indices flagged with `issue_type`, most severe first.

        Raises:
            ValueError: an issue type Datalab was not asked for (none of its items would be
                flagged, whatever the data).
        """
        import torch

        if issue_type not in self.summary:
            raise ValueError(
                f"Datalab was not asked for {issue_type!r}, so it flagged none: one of "
                f"{list(self.summary)}, or ask for it (lipt.datalab_report(found, "
                "issue_types=...))"
            )
        rows = self.issues[self.issues["issue_type"] == issue_type]
        return torch.tensor(rows["index"].to_numpy(dtype=np.int64))


def datalab_issues(
    labels: Tensor | Any,
    embeddings: Tensor | Any,
    probs: Tensor | Any,
    indices: Tensor | Any,
    issue_types: Sequence[str] = ISSUE_TYPES,
    filter_by: str = "prune_by_noise_rate",
) -> DatalabReport:
    """cleanlab's Datalab on N items: given `labels` [N], `embeddings` [N, D] (its features),
    out-of-sample `probs` [N, C] (its pred_probs) and the items' `indices` [N] in the data set,
    which the report speaks (each a tensor on any device, a numpy array or a list).
    `filter_by`: the label issues' confident-learning rule, as lipt.cleaning.find_issues. The
    classes are the C columns of `probs`, whether or not each has an item among the labels.

    Raises:
        ValueError: before Datalab runs, for `issue_types` that is a str or empty, tensors
            without a row per item, or labels that are not class indices in 0..C-1.
    """
    issue_types = issue_type_names(issue_types)
    labels, probs = as_cpu_tensor(labels, "labels"), as_cpu_tensor(probs, "probs")
    embeddings, indices = as_cpu_tensor(embeddings, "embeddings"), as_cpu_tensor(indices, "indices")
    n = labels.shape[0]
    if probs.ndim != 2 or embeddings.shape[0] != n or probs.shape[0] != n or indices.shape[0] != n:
        raise ValueError(
            f"labels {tuple(labels.shape)}, embeddings {tuple(embeddings.shape)}, probs "
            f"{tuple(probs.shape)} [N, C] and indices {tuple(indices.shape)} must have a row "
            "per item"
        )
    classes = probs.shape[1]
    labels = class_labels(labels, probs)
    from cleanlab import Datalab  # pandas, scikit-learn and datasets: only when asked
    from datasets import ClassLabel, Dataset, Features

    pred_probs = rows_summing_to_one(probs)
    # One process, as lipt.cleaning.find_issues: cleanlab's pool fails in a sweep's workers.
    label_kwargs = {"find_label_issues_kwargs": {"filter_by": filter_by, "n_jobs": 1}}
    asked: dict[str, dict[str, Any]] = {kind: {} for kind in issue_types}
    if "label" in asked:
        asked["label"] = {"clean_learning_kwargs": label_kwargs}
    # The classes declared, one per column of pred_probs: Datalab otherwise takes the labels'
    # distinct values for the classes, and a class without an item (a head's spare output, a
    # class the pool lacks) failed its label check ("Length of values (2) does not match
    # length of index (3)").
    data = Dataset.from_dict(
        {"label": labels.numpy()}, features=Features({"label": ClassLabel(num_classes=classes)})
    )
    lab = Datalab(data=data, label_name="label", verbosity=0)
    start = time.perf_counter()
    lab.find_issues(features=embeddings.float().numpy(), pred_probs=pred_probs, issue_types=asked)
    seconds = time.perf_counter() - start
    return DatalabReport(
        issues=issue_rows(lab, issue_types, labels, probs, indices),
        summary=issue_summary(lab, issue_types),
        seconds=seconds,
        lab=lab,
    )


def issue_type_names(issue_types: Iterable[str]) -> tuple[str, ...]:
    """`issue_types` as a tuple, each name once, in order: a non-empty sequence of Datalab's
    issue type names (Datalab itself refuses a name it does not know).

    Raises:
        ValueError: a str (which would be read letter by letter), none, or a name not a str.
    """
    if isinstance(issue_types, str):
        raise ValueError(
            f"issue_types must be a sequence of issue type names, not the str {issue_types!r}: "
            f"write issue_types=({issue_types!r},)"
        )
    names = tuple(issue_types)
    if not names or not all(isinstance(kind, str) for kind in names):
        raise ValueError(
            f"issue_types must name at least one issue type, each a str (e.g. {ISSUE_TYPES}), "
            f"got {names!r}"
        )
    return tuple(dict.fromkeys(names))


def issue_rows(
    lab: Any, issue_types: Sequence[str], labels: Tensor, probs: Tensor, indices: Tensor
) -> Any:
    """One row per flagged item and issue type (DatalabReport.issues)."""
    import pandas as pd

    position = indices.numpy()
    given, suggested = labels.numpy(), probs.argmax(1).numpy()
    frames = []
    for kind in issue_types:
        found = lab.get_issues(kind)
        rows = np.flatnonzero(found[f"is_{kind}_issue"].to_numpy())
        score = found[f"{kind}_score"].to_numpy()[rows]
        rows, score = rows[np.argsort(score, kind="stable")], np.sort(score, kind="stable")
        sets = [""] * len(rows)
        if kind == "near_duplicate":
            members = found["near_duplicate_sets"].to_numpy()[rows]
            sets = [" ".join(str(int(position[m])) for m in group) for group in members]
        frames.append(
            pd.DataFrame(
                {
                    "index": position[rows],
                    "issue_type": kind,
                    "score": score,
                    "given": given[rows],
                    "suggested": suggested[rows],
                    "near_duplicates": sets,
                },
                columns=COLUMNS,
            )
        )
    return pd.concat(frames, ignore_index=True)


def issue_summary(lab: Any, issue_types: Sequence[str]) -> dict[str, dict[str, float]]:
    summary = lab.get_issue_summary().set_index("issue_type")
    return {
        kind: {
            "flagged": int(summary.loc[kind, "num_issues"]),
            "score": round(float(summary.loc[kind, "score"]), 6),
        }
        for kind in issue_types
    }


def write_datalab(folder: Path, report: DatalabReport) -> None:
    """datalab_issues.csv (DatalabReport.issues) and datalab_summary.json (per issue type the
    count and Datalab's overall score, and the seconds), each written atomically."""
    # 6 significant digits, not places: a score of 1e-8 is not 0 (many classes make them small)
    text = report.issues.to_csv(index=False, float_format="%.6g", lineterminator="\n")
    atomic_write_bytes(folder / ISSUES_FILE, text.encode())
    write_json(
        folder / SUMMARY_FILE,
        {"issue_types": report.summary, "seconds": round(report.seconds, 3)},
    )
