"""lipt.cleaning's pure functions at realistic shapes: out-of-sample probabilities from the jigsaw
stage (each row's own learner left out, or a cross-validated probe on the soup's embeddings),
cleanlab's decision on them, and detection scored against the labels known to be wrong."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lipt.cleaning import (
    detection_quality,
    find_issues,
    fit_softmax_regression,
    fold_of,
    jigsaw_probs,
    probe_issues,
    probe_probs,
    shard_owner,
)
from lipt.cleaning import issues as issues_module
from lipt.data.noise import flip_labels
from lipt.selection.types import LearnerHeads, PoolOutputs

N, D, C = 10_000, 128, 10  # a pool of 10k rows, convnet's 128-dim ReLU embeddings, 10 classes


def relu_embeddings(labels: torch.Tensor, separation: float, seed: int) -> torch.Tensor:
    """[N, D] non-negative features whose class means differ: a soup's penultimate layer."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(C, D, generator=g)
    return torch.relu(separation * prototypes[labels] + torch.randn(len(labels), D, generator=g))


def test_shard_owner_marks_each_learners_rows():
    pool = torch.arange(0, 20_000, 2)  # positions in the training split: the even ones
    shards = [torch.tensor([4, 10, 12]), torch.tensor([0, 30])]
    owner = shard_owner(pool, shards)
    assert owner.tolist()[:8] == [1, -1, 0, -1, -1, 0, 0, -1]
    assert int(owner[15]) == 1 and int((owner >= 0).sum()) == 5


def test_jigsaw_probs_leave_each_rows_own_learner_out():
    g = torch.Generator().manual_seed(0)
    logits, emb = torch.randn(N, C, generator=g), torch.randn(N, D, generator=g)
    heads = LearnerHeads(torch.randn(4, C, D, generator=g), torch.randn(4, C, generator=g))
    owner = torch.full((N,), -1)
    owner[:100], owner[100:200] = 0, 3
    members = torch.stack(
        [torch.softmax(logits, 1)]
        + [torch.softmax(emb @ w.T + b, 1) for w, b in zip(heads.weight, heads.bias, strict=True)]
    )  # [5, N, C]
    ensemble = jigsaw_probs(logits, emb, heads, owner, "ensemble")
    assert torch.allclose(ensemble[300], members[:, 300].mean(0), atol=1e-6)
    assert torch.allclose(ensemble[50], members[[0, 2, 3, 4], 50].mean(0), atol=1e-6)
    assert torch.allclose(ensemble[150], members[[0, 1, 2, 3], 150].mean(0), atol=1e-6)
    only_heads = jigsaw_probs(logits, emb, heads, owner, "heads")
    assert torch.allclose(only_heads[50], members[[2, 3, 4], 50].mean(0), atol=1e-6)
    assert torch.allclose(jigsaw_probs(logits, emb, heads, owner, "soup"), members[0])
    assert torch.allclose(ensemble.sum(1), torch.ones(N), atol=1e-5)


def test_folds_partition_the_rows_evenly():
    fold = fold_of(N + 3, 5, seed=1)
    counts = torch.bincount(fold, minlength=5)
    assert counts.sum() == N + 3 and int(counts.max() - counts.min()) <= 1
    assert not torch.equal(fold, fold_of(N + 3, 5, seed=2))
    with pytest.raises(ValueError, match="folds"):
        fold_of(3, 4, seed=0)


@pytest.mark.parametrize(
    ("kind", "separation", "floor"),
    # class pairs pull a linear boundary toward the pair: weaker on the same features
    [("symmetric", 0.35, 0.85), ("pairs", 0.7, 0.65)],
)
def test_probe_on_soup_like_embeddings_finds_the_wrong_labels(kind, separation, floor):
    # 30% wrong labels on features a linear model separates well: cleanlab on the
    # cross-validated probe finds most of them and flags few right ones.
    true = torch.arange(N) % C
    given = flip_labels(true, C, 0.3, kind, seed=0)
    wrong = given != true
    emb = relu_embeddings(true, separation, seed=1)
    probs = probe_probs(emb, given, C, folds=5, seed=0)
    assert probs.shape == (N, C) and torch.allclose(probs.sum(1), torch.ones(N), atol=1e-4)
    accuracy = float((probs.argmax(1) == true).float().mean())
    assert accuracy > floor, accuracy  # the probe learns the true classes, not the noise
    issues = find_issues(given, probs)
    quality = detection_quality(issues.rows, wrong)
    assert quality["precision"] > floor and quality["recall"] > 0.75, quality
    # ranked by cleanlab's self-confidence: the probability of the given label, lowest first
    assert torch.all(issues.score[1:] >= issues.score[:-1])
    assert torch.equal(issues.given, given[issues.rows])
    assert torch.equal(issues.suggested, probs[issues.rows].argmax(1))


def test_softmax_regression_reaches_the_penalised_optimum():
    # The fit's gradient is written out by hand (autograd's backward was slower): at what it
    # returns, autograd's gradient of the same objective must vanish, and the objective must be
    # no higher than autograd-driven L-BFGS reaches. A wrong written gradient (a missing 1/N, a
    # transposed product, the penalty's factor) moves the optimum and fails both.
    true = torch.arange(N) % C
    given = flip_labels(true, C, 0.3, "symmetric", seed=0)
    emb = relu_embeddings(true, 0.35, seed=1)
    x = (emb - emb.mean(0)) / emb.std(0)  # standardised, as probe_probs fits them
    decay = 1e-3

    def objective(w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(F.linear(x, w, b), given) + decay * (w * w).sum()

    w, b = fit_softmax_regression(x, given, C, decay, max_iter=200)
    assert w.shape == (C, D) and b.shape == (C,)
    w_, b_ = w.clone().requires_grad_(), b.clone().requires_grad_()
    grad_w, grad_b = torch.autograd.grad(objective(w_, b_), [w_, b_])
    assert float(grad_w.abs().max()) < 1e-4 and float(grad_b.abs().max()) < 1e-4

    w_ref = torch.zeros(C, D, requires_grad=True)
    b_ref = torch.zeros(C, requires_grad=True)
    reference = torch.optim.LBFGS(
        [w_ref, b_ref], max_iter=200, line_search_fn="strong_wolfe", tolerance_grad=1e-6
    )

    def closure() -> torch.Tensor:
        reference.zero_grad()
        loss = objective(w_ref, b_ref)
        loss.backward()
        return loss

    reference.step(closure)
    with torch.no_grad():
        assert float(objective(w, b)) <= float(objective(w_ref, b_ref)) + 1e-5


def test_weak_probabilities_find_less():
    # The same noise scored by an all-but-uninformative model: cleanlab's decision is only as
    # good as the probabilities, which is why lipt probes the embeddings instead of using the
    # soup's own softmax.
    true = torch.arange(N) % C
    given = flip_labels(true, C, 0.3, "symmetric", seed=0)
    emb = relu_embeddings(true, separation=0.02, seed=1)
    weak = detection_quality(find_issues(given, probe_probs(emb, given, C)).rows, given != true)
    assert weak["precision"] < 0.6, weak


def test_detection_quality_counts_hits():
    wrong = torch.zeros(100, dtype=torch.bool)
    wrong[:10] = True
    flagged = torch.tensor([0, 1, 2, 3, 50, 60, 70, 80])
    assert detection_quality(flagged, wrong) == {"precision": 0.5, "recall": 0.4}
    assert detection_quality(torch.tensor([], dtype=torch.long), wrong)["recall"] == 0.0


# --------------------------------------------------------------------------- what they refuse


def noisy_probs() -> tuple[torch.Tensor, torch.Tensor]:
    """Given labels [N] (30% wrong) and the probe's out-of-sample probabilities [N, C]."""
    true = torch.arange(N) % C
    given = flip_labels(true, C, 0.3, "symmetric", seed=0)
    return given, probe_probs(relu_embeddings(true, 0.35, seed=1), given, C)


def test_find_issues_takes_any_integer_labels_alike():
    # uint8 labels index as a mask in torch: they must give the int64 labels' decision
    given, probs = noisy_probs()
    reference = find_issues(given, probs)
    assert len(reference) > 0.2 * N
    for dtype in (torch.uint8, torch.int32):
        issues = find_issues(given.to(dtype), probs)
        assert torch.equal(issues.rows, reference.rows), dtype
        assert torch.equal(issues.score, reference.score) and issues.given.dtype == torch.int64


def test_find_issues_takes_numpy_arrays_and_lists_as_cleanlab_does():
    """What a cleanlab user holds: numpy labels and probabilities, or a list. A numpy array
    was refused as "not an integer tensor ... convert them with labels.long()", which it has
    not; a list or numpy probabilities ended in an AttributeError."""
    import numpy as np

    given, probs = noisy_probs()
    reference = find_issues(given, probs)
    for labels, p in (
        (given.numpy(), probs.numpy()),
        (given.numpy().astype(np.int32), probs),
        (given.tolist(), probs.double().numpy()),
        (given, probs.tolist()),
    ):
        issues = find_issues(labels, p)
        assert torch.equal(issues.rows, reference.rows), type(labels)
        assert torch.equal(issues.given, reference.given) and issues.given.dtype == torch.int64
        assert torch.equal(issues.suggested, reference.suggested)
        assert torch.allclose(issues.score, reference.score)
    names = np.array(["cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay", "kid", "lynx"])
    with pytest.raises(
        ValueError,
        match=r"^labels must be numbers, .* \(class names: map them to 0\.\.C-1 first\)$",
    ):
        find_issues(names[given.numpy()], probs)


def test_datalab_takes_every_column_of_probs_as_a_class_with_items_or_not():
    """A class without an item among the labels (a head's spare output, a class the pool
    lacks), which lipt.find_label_issues and clean=lipt allow: Datalab took the labels'
    distinct values for the classes, its label check failed ("Length of values (9) does not
    match length of index (10)") and the report ended in its "No issues available"."""
    from lipt.cleaning import datalab_issues

    # 3,000 rows: the classes Datalab reads do not depend on the rows' count, and its
    # neighbour search, quadratic in the rows, costs ~6 s a case at N
    true = torch.arange(3000) % C
    given = flip_labels(true, C, 0.3, "symmetric", seed=0)
    emb = relu_embeddings(true, 0.35, seed=1)
    for absent in (0, 4, C - 1):
        keep = given != absent
        labels, x = given[keep], emb[keep]
        probs = probe_probs(x, labels, C)
        report = datalab_issues(labels, x, probs, torch.nonzero(keep).flatten() * 2)
        flagged = report.flagged("label")
        rows = find_issues(labels, probs).rows
        assert len(flagged) > 0.1 * len(labels), absent
        assert set((flagged // 2).tolist()) == set(torch.nonzero(keep).flatten()[rows].tolist())
        assert set(report.summary) == {"label", "outlier", "near_duplicate"}


@pytest.mark.parametrize(
    ("labels", "rows", "words"),
    [
        ("float", [], r"labels must be class indices, an integer tensor, not torch\.float32"),
        ("above", [], r"label 10 is out of range: probs \(10000, 10\) gives 10 classes"),
        ("int64", [17], r"probs are not finite \(NaN or inf\) in 1 row\(s\): 17; "),
        ("int64", [9000, 17, 4242], r"in 3 row\(s\): 17, 4242, 9000; "),
    ],
    ids=["float-labels", "label-above-the-columns", "a-nan-row", "nan-and-inf-rows"],
)
def test_find_issues_refuses_what_cleanlab_would_misread_in_one_line(labels, rows, words):
    """Float labels crashed inside cleanlab (IndexError); a NaN row still gave flags, with a
    NaN score and an arbitrary suggestion."""
    given, probs = noisy_probs()
    if labels == "float":
        given = given.float()
    if labels == "above":
        given = given.clone()
        given[123] = C
    probs = probs.clone()
    probs[rows[:1]] = float("nan")
    probs[rows[1:], 3] = float("inf")
    with pytest.raises(ValueError, match="^[^\n]*" + words + "[^\n]*$"):
        find_issues(given, probs)


def test_probe_issues_name_the_items_whose_embeddings_are_not_finite(monkeypatch):
    """A NaN item's embedding made L-BFGS fail after all the work ("value cannot be converted
    to type float without overflow"); it is named by its position in the data set, before the
    probe's first fit."""

    def no_fit(*args, **kwargs):
        raise AssertionError("the probe was fitted on embeddings with a NaN")

    true = torch.arange(N) % C
    emb = relu_embeddings(true, 0.35, seed=1)
    emb[[500, 7000]] = torch.tensor([float("nan"), float("-inf")]).unsqueeze(1)
    positions = torch.arange(N) * 3 + 1  # the pool: every third item of the data set
    outputs = PoolOutputs(torch.zeros(N, C), emb, true, positions)
    monkeypatch.setattr(issues_module, "fit_softmax_regression", no_fit)
    with pytest.raises(
        ValueError,
        match=r"^the soup's embeddings are not finite \(NaN or inf\) "
        r"in 2 item\(s\): 1501, 21001; [^\n]*lower learning rate$",
    ):
        probe_issues(outputs, C)
