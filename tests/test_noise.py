"""Wrong labels as data: seeded noise and a user's labels replace the training split's labels for
every reader and both data paths; the test split stays clean; what changed is recorded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lipt.core.errors import UserError, one_line
from lipt.data.noise import flip_labels, pair_map, read_train_labels
from lipt.run.config import run_of, validate
from lipt.stages.build import build_datamodule

FASHION_PAIRS = [6, 3, 4, 1, 2, 7, 0, 5, 9, 8]


def fashion_like_labels(n: int = 60_000) -> torch.Tensor:
    return torch.arange(n) % 10  # balanced, like Fashion-MNIST's training split


@pytest.mark.parametrize("rate", [0.2, 0.4])
def test_symmetric_noise_makes_exactly_rate_wrong_uniformly_over_other_classes(rate):
    labels = fashion_like_labels()
    noisy = flip_labels(labels, 10, rate, "symmetric", seed=0)
    wrong = noisy != labels
    assert int(wrong.sum()) == round(rate * len(labels))
    # each class keeps its share of wrong labels, and a wrong label lands on each other class
    # about equally: 1/9 of a class's wrong labels each, within sampling error
    for c in range(10):
        members = labels == c
        assert abs(float(wrong[members].float().mean()) - rate) < 0.02
        landed = torch.bincount(noisy[members & wrong], minlength=10).float()
        assert landed[c] == 0
        share = landed / landed.sum()
        assert float((share[torch.arange(10) != c] - 1 / 9).abs().max()) < 0.04  # 4 sigma


def test_pair_noise_sends_each_class_to_its_pair_only():
    labels = fashion_like_labels()
    noisy = flip_labels(labels, 10, 0.4, "pairs", seed=3, pairs=FASHION_PAIRS)
    wrong = noisy != labels
    assert int(wrong.sum()) == 24_000
    assert torch.equal(noisy[wrong], torch.tensor(FASHION_PAIRS)[labels[wrong]])
    # null pairs: the next class
    shifted = flip_labels(labels, 10, 0.4, "pairs", seed=3)
    moved = shifted != labels
    assert torch.equal(shifted[moved], (labels[moved] + 1) % 10)


def test_noise_depends_on_its_seed_alone():
    labels = fashion_like_labels()
    a = flip_labels(labels, 10, 0.4, "symmetric", seed=1)
    assert torch.equal(a, flip_labels(labels, 10, 0.4, "symmetric", seed=1))
    b = flip_labels(labels, 10, 0.4, "symmetric", seed=2)
    overlap = float(((a != labels) & (b != labels)).sum()) / 24_000
    assert 0.3 < overlap < 0.5  # two independent draws of 40% share about 40% of their flips
    assert torch.equal(flip_labels(labels, 10, 0.0, "symmetric", seed=1), labels)


def test_bad_noise_arguments_are_value_errors():
    labels = fashion_like_labels(100)
    with pytest.raises(ValueError, match="rate"):
        flip_labels(labels, 10, 1.0, "symmetric", 0)
    with pytest.raises(ValueError, match="kind"):
        flip_labels(labels, 10, 0.1, "uniform", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="itself"):
        pair_map(3, [1, 1, 0])
    with pytest.raises(ValueError, match="one class per class"):
        pair_map(3, [1, 0])


def test_noise_on_fashion_mnist_config_wrongs_pool_and_validation_alike_and_not_test(
    make_cfg, fashion_mnist_dir
):
    # The seeded validation split draws its own permutation: noise drawn from the same seed as
    # the split would have made every validation label wrong.
    clean = build_datamodule(
        run_of(make_cfg([f"dataset.data_dir={fashion_mnist_dir}", "dataset.val_size=100"]))
    )
    noisy = build_datamodule(
        run_of(
            make_cfg(
                [
                    f"dataset.data_dir={fashion_mnist_dir}",
                    "dataset.val_size=100",
                    "dataset.label_noise.rate=0.4",
                    "dataset.label_noise.kind=pairs",
                ]
            )
        )
    )
    changes = noisy.label_changes
    assert changes is not None
    assert torch.equal(changes.original, clean.train_source.labels)
    assert torch.equal(changes.given, noisy.train_source.labels)
    wrong = changes.wrong
    assert int(wrong.sum()) == 120  # 40% of 300
    assert 0.25 < float(wrong[noisy.val_indices].float().mean()) < 0.55
    assert 0.3 < float(wrong[noisy.pool_indices].float().mean()) < 0.5
    assert torch.equal(noisy.splits.test.labels, clean.splits.test.labels)
    pairs = torch.tensor(FASHION_PAIRS)
    assert torch.equal(changes.given[wrong], pairs[changes.original[wrong]])


def labels_seen(dm) -> dict[int, int]:
    """Position -> label, as the pool loader serves them (either data path)."""
    seen = {}
    for _, y, idx in dm.pool_dataloader():
        seen.update(zip(idx.tolist(), y.tolist(), strict=True))
    return seen


@pytest.mark.parametrize("resident", [True, False])
def test_both_data_paths_serve_the_noisy_labels(make_cfg, resident):
    dm = build_datamodule(
        run_of(
            make_cfg(
                [
                    "dataset=synthetic",
                    f"dataset.resident={str(resident).lower()}",
                    "dataset.label_noise.rate=0.3",
                ]
            )
        )
    )
    assert dm.is_resident == resident
    seen = labels_seen(dm)
    given = dm.label_changes.given
    assert all(seen[i] == int(given[i]) for i in dm.pool_indices.tolist())
    assert sum(seen[i] != int(dm.label_changes.original[i]) for i in seen) > 0.2 * len(seen)


def write_labels(path: Path, array: np.ndarray) -> Path:
    np.save(path, array)
    return path


@pytest.mark.parametrize(
    ("reader", "size", "classes"),
    [("fashion_mnist", 300, 10), ("cifar10", 200, 10), ("cifar100", 400, 100), ("imagenet", 90, 3)],
)
def test_train_labels_replace_every_readers_labels(
    make_cfg, tmp_path, request, reader, size, classes
):
    data_dir = request.getfixturevalue(
        {
            "fashion_mnist": "fashion_mnist_dir",
            "cifar10": "cifar10_dir",
            "cifar100": "cifar100_dir",
            "imagenet": "imagefolder_dir",
        }[reader]
    )
    mine = np.random.default_rng(5).integers(0, classes, size).astype(np.int32)
    path = write_labels(tmp_path / "labels.npy", mine)
    extra = ["dataset.num_classes=3", "dataset.image_size=32", "dataset.resize=36"]
    overrides = [
        f"dataset={reader}",
        f"dataset.data_dir={data_dir}",
        "dataset.val_size=20",
        "dataset.num_workers=0",
        f"dataset.train_labels={path}",
        *(extra if reader == "imagenet" else []),
    ]
    dm = build_datamodule(run_of(make_cfg(overrides)))
    assert dm.train_source.labels.tolist() == mine.tolist()
    assert dm.label_changes is not None and torch.equal(
        dm.label_changes.wrong, dm.label_changes.original != torch.from_numpy(mine).long()
    )
    seen = labels_seen(dm)
    assert all(seen[i] == int(mine[i]) for i in seen)


def test_train_labels_of_the_wrong_length_are_refused_before_training(make_cfg, tmp_path):
    path = write_labels(tmp_path / "short.npy", np.zeros(599, np.int64))
    with pytest.raises(UserError, match="599 labels but the training split has 600"):
        build_datamodule(run_of(make_cfg(["dataset=synthetic", f"dataset.train_labels={path}"])))


@pytest.mark.parametrize(
    ("array", "words"),
    [
        (np.zeros(10, np.float32), "integer"),
        (np.zeros((10, 2), np.int64), "shape"),
        (np.full(10, 4, np.int64), "outside"),
        (np.full(10, -1, np.int64), "outside"),
    ],
)
def test_bad_train_labels_files_say_what_is_wrong(tmp_path, array, words):
    path = write_labels(tmp_path / "labels.npy", array)
    with pytest.raises(ValueError, match=words):
        read_train_labels(path, num_classes=4)
    text = tmp_path / "labels.txt"
    text.write_text("0 1 2")
    with pytest.raises(ValueError, match=r"not a \.npy"):
        read_train_labels(text, num_classes=4)


@pytest.mark.parametrize("kind", ["npz", "torch-pt", "truncated-npy"])
def test_train_labels_in_another_format_are_refused_in_one_line(make_cfg, tmp_path, kind):
    """CIFAR-10N's labels come as torch.save's .pt (a dict of label arrays), and numpy's
    savez writes a .npz: np.load opens both as zip archives, which have no dtype. Each is
    refused before any work, saying how to write the .npy lipt reads."""
    labels = np.random.default_rng(0).integers(0, 4, 600)
    path = tmp_path / {"npz": "labels.npz", "torch-pt": "labels.pt"}.get(kind, "labels.npy")
    if kind == "npz":
        np.savez(path, labels=labels)
    elif kind == "torch-pt":
        torch.save({"worse_label": labels, "aggre_label": labels}, path)
    else:
        write_labels(path, labels)
        path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"numpy\.save\(path, labels\)$"):
        read_train_labels(path, num_classes=4)
    cfg = make_cfg(["dataset=synthetic", f"dataset.train_labels={path}"])
    with pytest.raises(UserError) as refused:
        validate(cfg, deep=False)
    assert one_line(refused.value).startswith(f"dataset.train_labels: {path} is ")
