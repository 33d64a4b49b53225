"""Datalab's outliers and near duplicates on lipt's label-issue finder's embeddings: planted in
Fashion-MNIST's pool, how many does cleanlab's Datalab find on the jigsaw soup's embeddings
(lipt.find_label_issues, then lipt.datalab_report), beside the same calls on a plain model's
(the same convnet trained one epoch on the pool), and at what cost, seed by seed.

    python benchmarks/datalab_issues.py --seeds 0 1 2 --json datalab_issues.json \
        --markdown docs/results/label_issues/datalab.md

Planted, at positions of the pool drawn from the seed: 200 near duplicates (a pool image
shifted by one pixel in a random direction, zero-filled, plus Gaussian noise of std 4 grey
levels, with its source's label) and 200 out-of-distribution images (a pool image inverted,
255 - x, with its source's label). A planted duplicate counts as found if it or its source is
flagged; a near-duplicate flag is right if it is a planted duplicate or the source of one (the
data set's own near duplicates count against precision). An outlier flag is right if it is a
planted inverted image. Both models see the images as they are (no augmentation), normalised
with Fashion-MNIST's mean and std; the validation split (5,000, which scores the soup) is not
judged. Pred_probs: the linear probe's cross-validated probabilities on each model's
embeddings (Datalab's outliers and near duplicates use the embeddings alone).

Beside Datalab's flags, what its scores rank, free of its thresholds: the share of planted
duplicates whose nearest neighbour in the embedding is their source (or the source's is the
duplicate), the planted pairs with an item among the 400 lowest near-duplicate scores, and the
planted outliers among the 200 lowest outlier scores.

`--models pixels` adds a reference without a model: Datalab on the normalised pixels (784-d).

Seconds: `embeddings`, what making them cost (soup: the jigsaw stage, the pool pass and the
probe, lipt.find_label_issues's total; plain: one epoch, the pass and the probe); `datalab`,
Datalab's find_issues (label, outlier, near_duplicate). --json keeps every row as it lands and
resumes a killed run; --markdown rewrites the table after each row.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # measure.py, also under runpy
from measure import ResultFile, host_line, log, pinned, print_caveat, shared_caveat, user_errors

DUPLICATES, OUTLIERS = 200, 200
VAL_SIZE, SPLIT_SEED = 5000, 0  # configs/dataset/fashion_mnist.yaml's split
MEAN, STD = 0.2860, 0.3530
NOISE_STD = 4.0  # grey levels, of 255
MODELS = ("soup", "plain", "pixels")


@dataclass(frozen=True)
class Planted:
    images: Any  # [N, 1, 28, 28] uint8, the planted items among them
    labels: Any  # [N] int64
    duplicates: list[tuple[int, int]]  # (planted duplicate, its source), positions
    outliers: list[int]  # planted inverted images, positions


def fashion_mnist() -> tuple[Any, Any]:
    """The training split as lipt's reader gives it (configs/dataset/fashion_mnist.yaml: the
    Debian package's IDX files)."""
    from lipt.data.sources import TensorImages, load_fashion_mnist

    train = load_fashion_mnist(None, download=False).train
    assert isinstance(train, TensorImages)
    return train.images, train.labels


def plant(images: Any, labels: Any, seed: int) -> Planted:
    """The training split with DUPLICATES + OUTLIERS items added, each at a position that
    lipt.PoolDataModule(val_size=VAL_SIZE, split_seed=SPLIT_SEED) puts in the pool, and each
    made from an original image of the pool (its source)."""
    import torch
    import torch.nn.functional as F

    n = len(labels) + DUPLICATES + OUTLIERS
    split = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED))
    pool = split[VAL_SIZE:]  # PoolDataModule's rule: the first val_size of the permutation
    g = torch.Generator().manual_seed(seed)
    drawn = pool[torch.randperm(len(pool), generator=g)]
    slots = drawn[: DUPLICATES + OUTLIERS]  # where the planted items go
    sources = drawn[DUPLICATES + OUTLIERS : 2 * (DUPLICATES + OUTLIERS)]  # originals in the pool
    original = torch.ones(n, dtype=torch.bool)
    original[slots] = False
    all_images = torch.zeros(n, *images.shape[1:], dtype=torch.uint8)
    all_labels = torch.zeros(n, dtype=torch.int64)
    all_images[original], all_labels[original] = images, labels

    dup_slots, dup_sources = slots[:DUPLICATES], sources[:DUPLICATES]
    shifts = torch.tensor([(0, 1), (0, -1), (1, 0), (-1, 0)])[
        torch.randint(0, 4, (DUPLICATES,), generator=g)
    ]
    padded = F.pad(all_images[dup_sources].float(), (1, 1, 1, 1))  # [D, 1, 30, 30]
    shifted = torch.stack(
        [
            p[:, 1 + dy : 29 + dy, 1 + dx : 29 + dx]
            for p, (dy, dx) in zip(padded, shifts.tolist(), strict=True)
        ]
    )
    noisy = shifted + NOISE_STD * torch.randn(shifted.shape, generator=g)
    all_images[dup_slots] = noisy.round().clamp(0, 255).to(torch.uint8)
    all_labels[dup_slots] = all_labels[dup_sources]

    ood_slots, ood_sources = slots[DUPLICATES:], sources[DUPLICATES:]
    all_images[ood_slots] = 255 - all_images[ood_sources]
    all_labels[ood_slots] = all_labels[ood_sources]
    return Planted(
        all_images,
        all_labels,
        list(zip(dup_slots.tolist(), dup_sources.tolist(), strict=True)),
        ood_slots.tolist(),
    )


def data_module(planted: Planted, seed: int) -> Any:
    import torch
    from torch.utils.data import TensorDataset

    import lipt

    x = (planted.images.float() / 255 - MEAN) / STD
    dm = lipt.PoolDataModule(
        TensorDataset(x, planted.labels),
        val_size=VAL_SIZE,
        split_seed=SPLIT_SEED,
        batch_size=256,
        resident=True,
        seed=seed,
    )
    placed = [d for d, s in planted.duplicates] + [s for d, s in planted.duplicates]
    assert bool(torch.isin(torch.tensor(placed + planted.outliers), dm.pool_indices).all())
    return dm


def convnet() -> Any:
    from lipt.models import ConvNet

    return ConvNet(in_channels=1, num_classes=10, width=32)  # configs/model/convnet.yaml


def soup_embeddings(dm: Any, seed: int) -> tuple[Any, Any, Any, Any, float]:
    """lipt.find_label_issues's run: the soup's embeddings and the probe's probabilities."""
    import lipt

    found = lipt.find_label_issues(convnet, dm, seed=seed)
    return found.labels, found.embeddings, found.probs, found.pool, found.seconds["total"]


def plain_embeddings(dm: Any, seed: int) -> tuple[Any, Any, Any, Any, float]:
    """The same convnet trained one epoch on the pool (lipt's Classifier: SGD, cosine), its
    embeddings, and the probe's probabilities on them."""
    import lightning as L
    import torch

    import lipt
    from lipt.cleaning import probe_issues, score_pool
    from lipt.models.classifier import QUIET_TRAINER

    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = convnet()
    module = lipt.Classifier(model, 10)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, **QUIET_TRAINER)
    L.seed_everything(seed, verbose=False)
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    outputs = score_pool(model, dm.pool_dataloader(), "cpu", "classifier")
    probs, _ = probe_issues(outputs, 10, seed=seed)
    seconds = time.perf_counter() - start
    return outputs.targets, outputs.embeddings, probs, outputs.indices, seconds


def pixel_features(dm: Any, seed: int) -> tuple[Any, Any, Any, Any, float]:
    """No model: the normalised pixels as Datalab's features, a reference for the embeddings
    (pred_probs: the given label at 0.91, for Datalab's label check only)."""
    import torch

    start = time.perf_counter()
    pool = dm.pool_indices
    inputs, labels = dm.tensors.inputs[pool], dm.tensors.labels[pool].long()
    probs = torch.full((len(pool), 10), 0.01)
    probs[torch.arange(len(pool)), labels] = 0.91
    return labels, inputs.flatten(1), probs, pool, time.perf_counter() - start


def detection(report: Any, planted: Planted, pool: Any) -> dict[str, float]:
    """Precision and recall of Datalab's near_duplicate and outlier flags on the planted items;
    and, free of Datalab's thresholds, what its scores and neighbours rank: the share of planted
    duplicates whose nearest neighbour in the embedding is their source (or the source's is
    the duplicate), the planted pairs with an item among the 2 x DUPLICATES lowest
    near-duplicate scores, and the planted outliers among the OUTLIERS lowest outlier scores."""
    import numpy as np

    duplicates = set(report.flagged("near_duplicate").tolist())
    pairs = planted.duplicates
    involved = {d for d, _ in pairs} | {s for _, s in pairs}
    outliers = set(report.flagged("outlier").tolist())
    ood = set(planted.outliers)
    position = pool.numpy()
    row_of = {int(p): r for r, p in enumerate(position)}
    nearest = np.asarray(report.lab.get_info("near_duplicate")["nearest_neighbor"])
    nn_source = sum(
        position[nearest[row_of[d]]] == s or position[nearest[row_of[s]]] == d for d, s in pairs
    )
    dup_scores = report.lab.get_issues("near_duplicate")["near_duplicate_score"].to_numpy()
    lowest_dup = set(position[np.argsort(dup_scores, kind="stable")[: 2 * DUPLICATES]].tolist())
    ood_scores = report.lab.get_issues("outlier")["outlier_score"].to_numpy()
    lowest_ood = set(position[np.argsort(ood_scores, kind="stable")[:OUTLIERS]].tolist())
    return {
        "near_duplicate_flagged": len(duplicates),
        "near_duplicate_precision": len(duplicates & involved) / max(1, len(duplicates)),
        "near_duplicate_recall": sum(d in duplicates or s in duplicates for d, s in pairs)
        / len(pairs),
        "near_duplicate_nn_is_source": nn_source / len(pairs),
        "near_duplicate_recall_lowest": sum(d in lowest_dup or s in lowest_dup for d, s in pairs)
        / len(pairs),
        "outlier_flagged": len(outliers),
        "outlier_precision": len(outliers & ood) / max(1, len(outliers)),
        "outlier_recall": len(outliers & ood) / len(ood),
        "outlier_recall_lowest": len(lowest_ood & ood) / len(ood),
        "label_flagged": report.summary["label"]["flagged"],
    }


def measure_row(model: str, seed: int, threads: int) -> dict[str, Any]:
    from lipt.cleaning import datalab_issues

    images, labels = fashion_mnist()
    planted = plant(images, labels, seed)
    dm = data_module(planted, seed)
    with pinned(threads):
        made = {"soup": soup_embeddings, "plain": plain_embeddings, "pixels": pixel_features}[model]
        targets, embeddings, probs, pool, seconds = made(dm, seed)
        report = datalab_issues(targets, embeddings, probs, pool)
    return {
        "model": model,
        "seed": seed,
        "pool": len(pool),
        "dim": int(embeddings.shape[1]),
        "metric": str(report.lab.get_info("statistics")["knn_metric"]),
        **detection(report, planted, pool),
        "embedding_seconds": round(seconds, 3),
        "datalab_seconds": round(report.seconds, 3),
    }


def mean_std(values: list[float], digits: int = 2) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {std:.{digits}f}"


# (row key, column heading, digits): the table's columns after the model's name
COLUMNS = (
    ("near_duplicate_flagged", "near dup. flagged", 0),
    ("near_duplicate_precision", "precision", 2),
    ("near_duplicate_recall", "recall", 2),
    ("near_duplicate_nn_is_source", "nearest is source", 2),
    ("near_duplicate_recall_lowest", f"recall, {2 * DUPLICATES} lowest scores", 2),
    ("outlier_flagged", "outliers flagged", 0),
    ("outlier_precision", "precision", 2),
    ("outlier_recall", "recall", 2),
    ("outlier_recall_lowest", f"recall, {OUTLIERS} lowest scores", 2),
    ("label_flagged", "label issues", 0),
    ("embedding_seconds", "embeddings s", 0),
    ("datalab_seconds", "Datalab s", 0),
)
NAMES = {
    "soup": "jigsaw soup (lipt.find_label_issues)",
    "plain": "one epoch on the pool",
    "pixels": "the pixels (no model)",
}


def table(rows: list[dict[str, Any]], per_seed: bool = False) -> str:
    """Mean ± std over seeds per model, or (`per_seed`) every row."""
    heading = ["embeddings", "seed" if per_seed else "seeds", *(c[1] for c in COLUMNS)]
    lines = ["| " + " | ".join(heading) + " |", "|---|" + "---:|" * (len(heading) - 1)]
    for model in MODELS:
        mine = [r for r in rows if r["model"] == model]
        if per_seed:
            cells = [
                [NAMES[model], str(r["seed"]), *(f"{r[k]:.{d}f}" for k, _, d in COLUMNS)]
                for r in mine
            ]
        elif mine:
            values = [mean_std([float(r[k]) for r in mine], d) for k, _, d in COLUMNS]
            cells = [[NAMES[model], str(len(mine)), *values]]
        else:
            cells = []
        lines += ["| " + " | ".join(c) + " |" for c in cells]
    return "\n".join(lines)


def write_markdown(path: Path, rows: list[dict[str, Any]], header: str) -> None:
    from lipt.core.artifacts import atomic_write_bytes

    seeds = ", ".join(str(s) for s in sorted({r["seed"] for r in rows}))
    text = "\n\n".join(
        [
            header,
            f"Mean ± std over seeds {seeds}:",
            table(rows),
            "Each seed:",
            table(rows, per_seed=True),
            *filter(None, [shared_caveat(rows)]),
        ]
    )
    atomic_write_bytes(path, (text + "\n").encode())


def markdown_header(host: str, argv: list[str]) -> str:
    """The --markdown file's opening: what was planted and found, the machine, and the command
    that made it (this run's own arguments and niceness, not a fixed command)."""
    nice = f"nice -n {os.nice(0)} " if os.nice(0) else ""
    command = f"{nice}python {shlex.join(['benchmarks/datalab_issues.py', *argv])}"
    return (
        "# Datalab's outliers and near duplicates on lipt's embeddings\n\n"
        f"{DUPLICATES} near duplicates and {OUTLIERS} inverted images planted in "
        "Fashion-MNIST's pool (55,400 items), found by cleanlab's Datalab on the jigsaw soup's "
        "embeddings (lipt.find_label_issues, then lipt.datalab_report), on those of the same "
        "convnet trained one epoch on the pool, and on the pixels (no model, a reference). "
        "A planted duplicate counts as found if it "
        'or its source is flagged; "nearest is source" and the "lowest scores" columns say '
        "what Datalab's neighbours and scores rank, free of its thresholds. What ran and how: "
        "benchmarks/datalab_issues.py's docstring. "
        f"Machine: {host.removeprefix('host: ')}; niceness {os.nice(0)}.\n\n"
        f"    {command}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None, help="the table, as rows land")
    args = parser.parse_args()
    if args.threads < 0:  # before the first row loads and plants the data
        parser.error(f"--threads {args.threads}: give a thread count, or 0 for torch's")
    settings = {"threads": args.threads}  # rows are found by model and seed
    results = ResultFile(args.json, settings)
    host = host_line()
    print(host, flush=True)
    header = markdown_header(host, sys.argv[1:])
    rows = []
    for seed in args.seeds:
        for model in args.models:
            log(f"{model}, seed {seed}")
            rows.append(
                results.measure(
                    {"model": model, "seed": seed}, measure_row, model, seed, args.threads
                )
            )
            if args.markdown is not None:
                write_markdown(args.markdown, rows, header)
    print()
    print(table(rows))
    print_caveat(rows)


if __name__ == "__main__":
    with user_errors():
        main()
