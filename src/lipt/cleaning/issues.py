"""Label issues from out-of-sample predicted probabilities: where they come from (the jigsaw
learners, or K folds), cleanlab's confident learning on them, and how well the flags match the
labels known to be wrong.

Confident learning (Northcutt et al., JAIR 2021, https://arxiv.org/abs/1911.00068) needs, for
every sample, class probabilities from a model that did not train on it. K-fold
cross-validation buys them with K trainings; lipt's jigsaw learners have them by construction:
each learner trains on its own shard, and the shards together hold a few percent of the pool.
The decision itself is cleanlab's (`cleanlab.filter.find_label_issues`), not ours.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipt.cleaning.inputs import as_cpu_tensor, check_finite, class_labels, rows_summing_to_one
from lipt.selection.coverage import MEMBER_ROWS, member_probs
from lipt.selection.gradients import model_outputs
from lipt.selection.types import LearnerHeads, PoolOutputs

PROBE_ROWS = 65536  # rows per block of the probe's loss (a whole Fashion-MNIST or CIFAR fold)

Members = Literal["probe", "soup", "heads", "ensemble"]


def shard_owner(pool_indices: Tensor, shards: list[Tensor]) -> Tensor:
    """[N] int64: for each pool row, the learner whose shard holds it, -1 for none.
    `pool_indices` [N] and each shard are positions in the training split."""
    owner = torch.full((len(pool_indices),), -1, dtype=torch.int64)
    for learner, shard in enumerate(shards):
        owner[torch.isin(pool_indices, shard)] = learner
    return owner


def jigsaw_probs(
    logits: Tensor,
    embeddings: Tensor,
    heads: LearnerHeads | None,
    owner: Tensor | None,
    members: Members = "ensemble",
) -> Tensor:
    """Class probabilities [N, C] for the pool from the jigsaw stage, each row's own learner left
    out: `soup`, the soup's softmax; `heads`, the mean softmax of the learners' heads on the
    soup's embeddings; `ensemble`, the mean over the soup and the heads. `logits` [N, C] and
    `embeddings` [N, D] are the soup's on the un-augmented pool; `owner` [N] the learner whose
    shard holds each row (`shard_owner`, -1 none; None: not known, no one left out)."""
    n = logits.shape[0]
    if members == "soup" or heads is None or len(heads) == 0:
        return torch.softmax(logits.float(), dim=1)  # [N, C]
    m = 1 + len(heads)
    use = torch.ones(m, n, dtype=torch.bool)  # [M, N]
    if members == "heads":
        use[0] = False
    if owner is not None:
        rows = torch.nonzero(owner >= 0).squeeze(1)
        use[owner[rows] + 1, rows] = False  # a learner's head says nothing new about its shard
    weights = use.float().unsqueeze(2)  # [M, N, 1]
    counts = weights.sum(0).clamp_min(1.0)  # [N, 1]
    # The members' weighted mean a block of rows at a time, never the [M, N, C] of them all.
    out = torch.empty(n, logits.shape[1])  # [N, C]
    for start in range(0, n, MEMBER_ROWS):
        block = slice(start, start + MEMBER_ROWS)
        member = member_probs(logits, embeddings, heads, block)  # each [n, C]
        total = next(member) * weights[0, block]
        for k, probs in enumerate(member, start=1):
            total += probs * weights[k, block]
        out[block] = total / counts[block]
    return out


def score_pool(
    model: nn.Module,
    batches: Iterable[Any],
    device: torch.device | str,
    head: nn.Linear | str | None = None,
) -> PoolOutputs:
    """The pool through `model` once ((x, y, idx) `batches`): its logits and the embeddings that
    enter its final linear layer (`head`, lipt.selection.model_outputs), rows sorted by idx.
    Channels-last: the same values but for the last bits, and a convnet's pass over the pool
    ran 1.9x faster on one CPU core."""
    return model_outputs(model, batches, device, head, channels_last=True)


def probe_issues(
    outputs: PoolOutputs,
    num_classes: int,
    folds: int = 5,
    seed: int = 0,
    weight_decay: float = 1e-3,
    filter_by: str = "prune_by_noise_rate",
) -> tuple[Tensor, LabelIssues]:
    """lipt's finder after the pool pass: the probe's cross-validated probabilities [N, C] on
    the `outputs`' embeddings and labels (`probe_probs`), and cleanlab's decision on them
    (`find_issues`; rows index `outputs`).

    Raises:
        ValueError: before the probe's fits, for embeddings with a NaN or an infinity (an
            item whose input holds one, or a diverged model), naming the items' `indices`.
    """
    check_finite(
        outputs.embeddings,
        "the soup's embeddings",
        "item",
        "fix or drop those items (their inputs may hold NaN or inf); if their inputs are "
        "finite, the soup diverged: pre-train it with a lower learning rate",
        names=outputs.indices,
    )
    probs = probe_probs(outputs.embeddings, outputs.targets, num_classes, folds, seed, weight_decay)
    return probs, find_issues(outputs.targets, probs, filter_by)


def probe_probs(
    embeddings: Tensor,
    labels: Tensor,
    num_classes: int,
    folds: int = 5,
    seed: int = 0,
    weight_decay: float = 1e-3,
    max_iter: int = 50,
) -> Tensor:
    """Cross-validated probabilities [N, C] from a linear probe: for each of `folds` folds, a
    softmax regression on the other folds' `embeddings` [N, D] and given `labels` [N] (features
    standardised on them, L2 `weight_decay` on the mean loss, full-batch L-BFGS), applied to
    the fold. A linear model on fixed features hardly fits wrong labels; on the soup's features
    it is what makes the jigsaw stage's probabilities good enough for confident learning."""
    n = embeddings.shape[0]
    fold = fold_of(n, folds, seed)  # [N]
    probs = torch.empty(n, num_classes)
    x_all = embeddings.float()
    for k in range(folds):
        held = fold == k
        train = ~held if folds > 1 else torch.ones(n, dtype=torch.bool)
        mean, std = x_all[train].mean(0), x_all[train].std(0) + 1e-6  # [D]
        w, b = fit_softmax_regression(
            (x_all[train] - mean) / std, labels[train], num_classes, weight_decay, max_iter
        )
        probs[held] = torch.softmax(F.linear((x_all[held] - mean) / std, w, b), dim=1)
    return probs


def fit_softmax_regression(
    x: Tensor, y: Tensor, num_classes: int, weight_decay: float, max_iter: int
) -> tuple[Tensor, Tensor]:
    """Weights [C, D] and bias [C] minimising the mean cross-entropy of `x` [N, D] against `y`
    [N] plus `weight_decay` x |W|^2, by full-batch L-BFGS.

    The gradient is written out rather than taken by autograd: autograd's backward of `x @ W`
    forms `x.T @ g`, a strided product over the [N, D] rows, several times slower on one CPU
    core than `g.T @ x`; 5 folds of the pool's 55,000 rows fit in 5 s instead of 14 s.
    Rows are taken PROBE_ROWS at a time, so that the [N, C] temporaries of ImageNet's 1.28M
    rows and 1,000 classes (5 GB each) are [PROBE_ROWS, C]; a pool of fewer rows is one block,
    the sums as they were."""
    n = x.shape[0]
    w = torch.zeros(num_classes, x.shape[1], dtype=x.dtype, requires_grad=True)  # [C, D]
    b = torch.zeros(num_classes, dtype=x.dtype, requires_grad=True)  # [C]
    optimizer = torch.optim.LBFGS(
        [w, b], max_iter=max_iter, line_search_fn="strong_wolfe", tolerance_grad=1e-6
    )

    def closure() -> Tensor:
        with torch.no_grad():
            nll, grad_w, grad_b = block_sums(x, y, w, b)
            loss = nll / n + weight_decay * (w * w).sum()
            w.grad = grad_w + 2 * weight_decay * w  # [C, D]
            b.grad = grad_b  # [C]
        return loss

    optimizer.step(closure)
    return w.detach(), b.detach()


def block_sums(x: Tensor, y: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The summed cross-entropy of the softmax regression (w [C, D], b [C]) on `x` [N, D]
    against `y` [N], and its mean's gradients [C, D] and [C], PROBE_ROWS rows at a time."""
    n = x.shape[0]
    sums: list[Tensor] = []
    for start in range(0, n, PROBE_ROWS):
        rows = slice(start, start + PROBE_ROWS)
        onehot = F.one_hot(y[rows], w.shape[0]).to(x.dtype)  # [n, C]
        log_p = torch.log_softmax(F.linear(x[rows], w, b), dim=1)  # [n, C]
        residual = (log_p.exp() - onehot) / n  # [n, C]: d loss / d logits
        block = (-(log_p * onehot).sum(), residual.t() @ x[rows], residual.sum(0))
        # The first block as it is (one block: the whole pool's sums, bit for bit).
        sums = list(block) if not sums else [s + t for s, t in zip(sums, block, strict=True)]
    return sums[0], sums[1], sums[2]


def fold_of(n: int, folds: int, seed: int) -> Tensor:
    """[N] int64 fold id in 0..folds-1, a seeded shuffle cut into near-equal folds."""
    if folds < 1 or folds > n:
        raise ValueError(f"folds must be in 1..{n}, got {folds}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    fold = torch.empty(n, dtype=torch.int64)
    fold[order] = torch.arange(n) % folds
    return fold


@dataclass(frozen=True)
class LabelIssues:
    """The rows cleanlab flags, most likely wrong first: positions into the scored rows, the
    label each was given, the class the probabilities suggest, and cleanlab's label quality
    score (self-confidence: the probability of the given label; lower is more likely wrong)."""

    rows: Tensor  # [F] int64
    given: Tensor  # [F] int64
    suggested: Tensor  # [F] int64
    score: Tensor  # [F] float32

    def __len__(self) -> int:
        return int(self.rows.shape[0])


def find_issues(
    labels: Tensor | Any, probs: Tensor | Any, filter_by: str = "prune_by_noise_rate"
) -> LabelIssues:
    """cleanlab's `find_label_issues` on `labels` [N] and out-of-sample `probs` [N, C], ranked
    by self-confidence. `filter_by`: cleanlab's rule (prune_by_noise_rate, its default;
    prune_by_class, both, confident_learning, predicted_neq_given). Each may be a tensor (on
    any device), a numpy array or a list; the result's tensors are on the CPU.

    Raises:
        ValueError: `probs` not [N, C] with a row per label, labels that are not integer class
            indices in 0..C-1, or a row of `probs` with a NaN or an infinity (named).
    """
    from cleanlab.filter import find_label_issues  # scikit-learn and pandas: only when cleaning

    labels, probs = as_cpu_tensor(labels, "labels"), as_cpu_tensor(probs, "probs")
    if probs.ndim != 2 or probs.shape[0] != labels.shape[0]:
        raise ValueError(
            f"probs [N, C] must have a row per label, got probs {tuple(probs.shape)} for "
            f"labels {tuple(labels.shape)}"
        )
    labels = class_labels(labels, probs)
    check_finite(
        probs, "probs", "row", "give each row out-of-sample class probabilities, or drop the row"
    )
    ranked = find_label_issues(
        labels.numpy(),
        rows_summing_to_one(probs),
        filter_by=filter_by,
        return_indices_ranked_by="self_confidence",
        # cleanlab's own process pool reads module globals its workers lack when lipt runs in a
        # joblib (loky) worker of a sweep (NameError pred_probs_by_class); one process here.
        n_jobs=1,
    )
    rows = torch.from_numpy(np.asarray(ranked, dtype=np.int64))
    return LabelIssues(
        rows=rows,
        given=labels[rows],
        suggested=probs[rows].argmax(1),
        score=probs[rows, labels[rows]].float(),
    )


def detection_quality(flagged: Tensor, wrong: Tensor) -> dict[str, float]:
    """Precision and recall of `flagged` (positions) against `wrong` ([N] bool, the labels known
    to be wrong): the share of flags that are wrong labels, the share of wrong labels flagged."""
    hit = int(wrong[flagged].sum()) if len(flagged) else 0
    n_wrong = int(wrong.sum())
    return {
        "precision": hit / len(flagged) if len(flagged) else 0.0,
        "recall": hit / n_wrong if n_wrong else 1.0,
    }
