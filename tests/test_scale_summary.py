"""summary.json's class counts of a subset of 1,000 classes, and the warning on the classes it
leaves out: its advice must be one that helps (a class-balanced selector gives an empty class
nothing more, and no selector gives 1,000 classes a sample each out of 50)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from lipt.selection import PoolOutputs, SelectionInputs, select_balanced, select_random
from lipt.stages.summary import subset_class_counts

CLASSES = 1000


def datamodule() -> SimpleNamespace:
    """An ImageNet-like pool: 1,000 classes of 2 to 29 items (ImageNet's run from 732 to 1,300)."""
    sizes = 2 + torch.arange(CLASSES) % 28
    labels = torch.arange(CLASSES).repeat_interleave(sizes)
    return SimpleNamespace(
        train_source=SimpleNamespace(labels=labels),
        pool_indices=torch.arange(len(labels)),
        num_classes=CLASSES,
    )


def subset(dm: SimpleNamespace, size: int, balance: bool) -> torch.Tensor:
    labels = dm.train_source.labels
    n = len(labels)
    inputs = SelectionInputs(
        PoolOutputs(torch.zeros(n, CLASSES), torch.zeros(n, 0), labels, torch.arange(n))
    )
    fn = select_balanced if balance else (lambda f, *a, **k: f(*a, **k))
    return fn(select_random, inputs, size, generator=torch.Generator().manual_seed(0)).rows


def warnings_of(caplog: pytest.LogCaptureFixture, dm: SimpleNamespace, rows: torch.Tensor) -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lipt.stages.summary"):
        counts = subset_class_counts(dm, rows)
    assert sum(counts) == len(rows) and len(counts) == CLASSES
    assert counts == torch.bincount(dm.train_source.labels[rows], minlength=CLASSES).tolist()
    return caplog.text


def test_a_balanced_subset_is_not_told_to_balance(caplog: pytest.LogCaptureFixture) -> None:
    dm = datamodule()
    text = warnings_of(caplog, dm, subset(dm, 1200, balance=True))  # 8% of 15,500 items
    assert "classes have no sample in the subset of 1200" in text
    assert "selector.balance=true" not in text and "raise fraction" in text


def test_an_unbalanced_subset_is_told_to_balance(caplog: pytest.LogCaptureFixture) -> None:
    dm = datamodule()
    text = warnings_of(caplog, dm, subset(dm, 1200, balance=False))
    assert "selector.balance=true" in text


def test_fewer_samples_than_classes_is_one_warning_that_helps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dm = datamodule()
    text = warnings_of(caplog, dm, subset(dm, 50, balance=True))
    assert len(caplog.records) == 1
    assert "fewer than the 1000 classes: 950 of 1000 classes have no sample" in text
    assert "selector.balance=true" not in text


def test_a_labels_only_pool_holds_no_logits_of_its_own():
    """Random selection reads labels only: its pool's logits are one zero seen [N, C], not
    N x C of them (5 GB at ImageNet's 1.28M rows and 1,000 classes)."""
    from lipt.selection.api import labels_of_pool, pick

    n, classes = 50_000, 1_000
    labels = torch.arange(n) % classes
    pool = labels_of_pool([(None, labels, torch.arange(n))])
    assert pool.logits.shape == (n, classes)
    assert pool.logits.untyped_storage().nbytes() == 4
    subset = pick(SelectionInputs(pool=pool), 2_000, select_random, seed=0, balance=True)
    assert len(subset.indices) == 2_000 and len(torch.unique(labels[subset.indices])) == classes
