"""Pictures name the classes: subset.png's bars and sample rows (and the wandb class table)
say "T-shirt/top", not "0", for every data set that has names (Fashion-MNIST, CIFAR-10/100,
an ImageFolder tree's folders), and the class numbers for one that has none."""

from __future__ import annotations

from typing import Any

import pytest

from lipt.report.pictures import subset_figure
from lipt.run.config import run_of
from lipt.stages.build import build_datamodule


def tick_labels(axes: Any, axis: str) -> list[str]:
    ticks = axes.get_xticklabels() if axis == "x" else axes.get_yticklabels()
    return [t.get_text() for t in ticks]


@pytest.mark.parametrize(
    ("dataset", "fixture", "names"),
    [
        ("fashion_mnist", "fashion_mnist_dir", ["T-shirt/top", "Trouser", "Pullover"]),
        ("cifar10", "cifar10_dir", ["airplane", "automobile", "bird"]),
        ("cifar100", "cifar100_dir", ["apple", "aquarium_fish", "baby"]),
        ("imagenet", "imagefolder_dir", ["n01440764", "n01443537", "n01484850"]),
    ],
)
def test_subset_picture_names_the_classes(make_cfg, request, dataset, fixture, names):
    root = request.getfixturevalue(fixture)
    overrides = [f"dataset={dataset}", f"dataset.data_dir={root}", "dataset.val_size=20"]
    if dataset == "imagenet":
        overrides += ["dataset.num_classes=3", "dataset.image_size=32", "dataset.resize=36"]
    dm = build_datamodule(run_of(make_cfg(overrides)))
    assert dm.class_names[:3] == names and len(dm.class_names) == dm.num_classes
    indices = dm.pool_indices[::2].sort().values
    bars, grid = subset_figure(dm, indices).axes
    if dm.num_classes <= 20:  # the bars name every class
        assert tick_labels(bars, "x") == dm.class_names
    present = sorted({int(dm.train_source.labels[i]) for i in indices})[:10]
    assert tick_labels(grid, "y") == [dm.class_names[c] for c in present]  # one row per class


def test_cifar_names_come_from_its_meta_file_when_there(cifar10_dir, tmp_path):
    import pickle

    from lipt.data.class_names import CIFAR10, cifar_names

    base = cifar10_dir / "cifar-10-batches-py"
    assert cifar_names(base, 10) == CIFAR10  # no meta file: the published names
    renamed = [f"kind {i}" for i in range(10)]
    with open(base / "batches.meta", "wb") as f:
        pickle.dump({"label_names": renamed}, f)
    assert cifar_names(base, 10) == renamed


def test_a_data_set_without_names_is_labelled_by_its_class_numbers(make_cfg):
    dm = build_datamodule(run_of(make_cfg(["dataset=synthetic"])))
    assert dm.class_names == ["0", "1", "2", "3"]
    bars, _ = subset_figure(dm, dm.pool_indices[::5].sort().values).axes
    assert tick_labels(bars, "x") == ["0", "1", "2", "3"]
