"""Wrong labels in your own data: lipt's label-issue finder on your model and an in-memory data
set, then cleanlab's Datalab on what it computed (outliers, near duplicates). A few seconds on
a CPU.

    python examples/label_issues.py
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import lipt

CLASSES, DIM, N = 8, 32, 2400


def make_net() -> nn.Module:
    """Your model: any nn.Module whose final nn.Linear gives the logits (here `head`)."""
    net = nn.Sequential()
    net.add_module("body", nn.Sequential(nn.Linear(DIM, 64), nn.ReLU()))
    net.add_module("head", nn.Linear(64, CLASSES))
    return net


def main() -> None:
    # Your data: 8 classes of points in 32-d, and 10% of the labels made wrong on purpose.
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(CLASSES, DIM, generator=g)
    truth = torch.randint(0, CLASSES, (N,), generator=g)
    x = centres[truth] + torch.randn(N, DIM, generator=g)
    labels = truth.clone()
    flipped = torch.randperm(N, generator=g)[: N // 10]
    labels[flipped] = (
        truth[flipped] + torch.randint(1, CLASSES, (len(flipped),), generator=g)
    ) % CLASSES
    # ...and two things Datalab looks for: 5 items copied, 5 far from everything.
    x[2300:2305] = x[:5]
    labels[2300:2305] = labels[:5]
    x[2305:2310] = 8 * torch.randn(5, DIM, generator=g)

    # One jigsaw stage of your model (a tenth of the data kept to score its soup), one pass
    # over the rest, a linear probe on the soup's embeddings, and cleanlab's decision.
    found = lipt.find_label_issues(make_net, TensorDataset(x, labels), head="head")
    wrong = labels != truth
    hits, wrong_in_pool = int(wrong[found.indices].sum()), int(wrong[found.pool].sum())
    print(
        f"{len(found)} labels flagged in {found.seconds['total']:.1f} s: precision "
        f"{hits / len(found):.2f}, recall {hits / wrong_in_pool:.2f} "
        f"(of the pool's {wrong_in_pool} wrong labels)"
    )
    for k in range(3):  # the three most likely wrong
        print(
            f"  item {int(found.indices[k])}: given {int(found.given[k])}, suggested "
            f"{int(found.suggested[k])} (p(given) = {float(found.score[k]):.3f})"
        )

    # The same run's embeddings and out-of-sample probabilities, handed to cleanlab's Datalab.
    report = lipt.datalab_report(found)
    pool = set(found.pool.tolist())
    copies = [(i, i - 2300) for i in range(2300, 2305) if {i, i - 2300} <= pool]
    duplicates = set(report.flagged("near_duplicate").tolist())
    outliers = set(report.flagged("outlier").tolist())
    far = [i for i in range(2305, 2310) if i in pool]
    print(
        f"Datalab: {len(duplicates)} near duplicates flagged, among them "
        f"{sum(bool({i, j} & duplicates) for i, j in copies)} of the {len(copies)} copies "
        f"(or their originals); {len(outliers)} outliers, among them "
        f"{len(outliers.intersection(far))} of the {len(far)} far items; "
        f"{report.summary['label']['flagged']} label issues, the finder's own"
    )


if __name__ == "__main__":
    main()
