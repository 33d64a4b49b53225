"""lipt's label-issue finder (the linear probe on the soup's embeddings) at 1,000 classes: the
probe's loss is summed in blocks of rows, so its memory is not rows x classes several times over
(ImageNet's 1.28M x 1,000 temporaries are 5 GB each), and a pool of one block fits as before,
bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import lipt.cleaning.issues as issues
from lipt.cleaning.datalab import DatalabReport, write_datalab
from lipt.cleaning.issues import LabelIssues, fit_softmax_regression, probe_probs
from lipt.cleaning.issues_csv import read_issues, write_issues
from lipt.core.errors import UserError
from tests.helpers import LargestTensor

N, C, D = 2000, 1000, 16


def embeddings() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(C, (N,), generator=g)
    return torch.randn(N, D, generator=g) + 3 * torch.randn(C, D, generator=g)[y], y


def whole_pool_fit(x: Tensor, y: Tensor, decay: float, max_iter: int) -> tuple[Tensor, Tensor]:
    """The probe's fit with the whole pool's [N, C] loss at once: the definition."""
    n = x.shape[0]
    onehot = F.one_hot(y, C).to(x.dtype)
    w = torch.zeros(C, x.shape[1], requires_grad=True)
    b = torch.zeros(C, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [w, b], max_iter=max_iter, line_search_fn="strong_wolfe", tolerance_grad=1e-6
    )

    def closure() -> Tensor:
        with torch.no_grad():
            log_p = torch.log_softmax(F.linear(x, w, b), dim=1)
            loss = -(log_p * onehot).sum() / n + decay * (w * w).sum()
            residual = (log_p.exp() - onehot) / n
            w.grad = residual.t() @ x + 2 * decay * w
            b.grad = residual.sum(0)
        return loss

    optimizer.step(closure)
    return w.detach(), b.detach()


def test_one_block_fits_as_the_whole_pool_bit_for_bit() -> None:
    x, y = embeddings()
    w, b = fit_softmax_regression(x, y, C, 1e-3, max_iter=5)
    w0, b0 = whole_pool_fit(x, y, 1e-3, max_iter=5)
    assert torch.equal(w, w0) and torch.equal(b, b0)


def test_the_probe_never_holds_rows_x_classes_temporaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 200 rows stand for the 65,536 of a pool of millions: the largest tensor is the
    probabilities it returns, [N, C], not the fold's several [N, C] temporaries; the fit is the
    whole pool's but for float sums."""
    monkeypatch.setattr(issues, "PROBE_ROWS", 200)
    x, y = embeddings()
    with LargestTensor() as watch:
        probs = probe_probs(x, y, C, folds=2, max_iter=3)
    assert watch.largest <= N * C, watch.largest
    with LargestTensor() as watch:
        w, b = fit_softmax_regression(x, y, C, 1e-3, max_iter=3)
    assert watch.largest < N * C // 4, watch.largest
    w0, b0 = whole_pool_fit(x, y, 1e-3, max_iter=3)
    assert torch.allclose(w, w0, atol=1e-4) and torch.allclose(b, b0, atol=1e-4)
    assert probs.shape == (N, C) and torch.allclose(probs.sum(1), torch.ones(N))


def test_label_issue_files_keep_the_tiny_scores_of_many_classes(tmp_path: Path) -> None:
    """A confident 1,000-class model gives its likeliest wrong labels a self-confidence of
    1e-8 or so: label_issues.csv and datalab_issues.csv keep it (6 significant digits), not
    0.000000 for every one of them, so the files still rank the flags."""
    scores = torch.tensor([2.6e-08, 1.1e-07, 1.2e-07, 3.4e-06, 0.25])
    n = len(scores)
    issues = LabelIssues(
        torch.arange(n), torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.int64), scores
    )
    write_issues(tmp_path / "label_issues.csv", issues)
    back = read_issues(tmp_path / "label_issues.csv").score
    assert torch.allclose(back, scores, rtol=1e-5, atol=0)
    frame = pd.DataFrame(
        {
            "index": range(n),
            "issue_type": "label",
            "score": scores.double().numpy(),
            "given": 0,
            "suggested": 1,
            "near_duplicates": "",
        }
    )
    write_datalab(tmp_path, DatalabReport(frame, {}, 0.0, None))
    written = pd.read_csv(tmp_path / "datalab_issues.csv")["score"].to_numpy()
    assert np.allclose(written, scores.double().numpy(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("cut", ["mid_number", "missing_fields", "bad_bytes"])
def test_a_damaged_label_issues_csv_is_refused_in_one_line(tmp_path: Path, cut: str) -> None:
    """A label_issues.csv damaged since it was written (a copy cut short, within a number or a
    row; bytes that are not text) is refused as unreadable, saying how to go on: not read as
    other numbers, nor a TypeError's traceback."""
    n = 1000
    issues = LabelIssues(
        torch.arange(n),
        torch.zeros(n, dtype=torch.int64),
        torch.ones(n, dtype=torch.int64),
        torch.rand(n),
    )
    path = tmp_path / "label_issues.csv"
    write_issues(path, issues)
    data = path.read_bytes()
    last_row = data.rindex(b"\n", 0, len(data) // 2)  # a row's end, half way down
    damaged = {
        "mid_number": data[: last_row - 1],  # its score's last digit gone, and the newline
        "missing_fields": data[: last_row + 1] + b"7,0\n",
        "bad_bytes": b"\xff\xfe" + data,
    }
    path.write_bytes(damaged[cut])
    with pytest.raises(UserError, match=r"is not a readable label_issues.csv .*; delete it"):
        read_issues(path)
