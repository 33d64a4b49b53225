"""label_issues.csv, the flagged labels a cleaning run leaves in its folder: one row per item,
most likely wrong first. A resumed run reads it back rather than finding the issues again."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import torch
from torch import Tensor

from lipt.cleaning.issues import LabelIssues
from lipt.core.artifacts import atomic_write_bytes
from lipt.core.errors import UserError

ISSUES_FILE = "label_issues.csv"

# label_issues.csv's columns: `index` is the position in the training split, as subset.npz's.
COLUMNS = ("index", "given", "suggested", "score")


def write_issues(path: Path, issues: LabelIssues) -> None:
    """label_issues.csv: one row per flagged item, most likely wrong first (rows: positions in
    the training split)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COLUMNS)
    rows = zip(
        issues.rows.tolist(),
        issues.given.tolist(),
        issues.suggested.tolist(),
        # 6 significant digits: at 1,000 classes the likeliest wrong labels score 1e-8 or less
        (f"{q:.6g}" for q in issues.score.tolist()),
        strict=True,
    )
    writer.writerows(rows)
    atomic_write_bytes(path, text.getvalue().encode())


def read_issues(path: Path) -> LabelIssues:
    """A label_issues.csv an earlier attempt wrote (whole: `write_issues` writes it atomically).

    Raises:
        UserError: it is not one, or was damaged since (cut short by a copy, bytes not text).
    """
    unreadable = f"{path} is not a readable label_issues.csv"
    fix = "delete it to find the issues again"
    try:
        text = path.read_bytes().decode()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{unreadable} ({type(e).__name__}); {fix}") from e
    if not text.endswith("\n"):  # every row ends one: a last row without it was cut short
        raise UserError(f"{unreadable} (its last row is cut short); {fix}")
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    if rows and tuple(rows[0]) != COLUMNS:
        raise UserError(f"{path} is not a label_issues.csv (columns {tuple(rows[0])})")

    def column(name: str, dtype: torch.dtype) -> Tensor:
        return torch.tensor([float(r[name]) for r in rows], dtype=dtype)

    try:  # a row of missing fields reads None (TypeError); a field not a number, ValueError
        return LabelIssues(
            column("index", torch.int64),
            column("given", torch.int64),
            column("suggested", torch.int64),
            column("score", torch.float32),
        )
    except (TypeError, ValueError) as e:
        raise UserError(f"{unreadable} ({e}); {fix}") from e
