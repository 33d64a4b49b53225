"""The jigsaw soup is chosen on the validation split, so no learner merged into it may have
trained on that split: saved learners of another split are refused (lipt.jigsaw.merge)."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lipt.data import DataModule
from lipt.data.sources import make_synthetic
from tests.helpers import run_entry

# configs/dataset/synthetic.yaml's sizes (600 training items, 100 held out), in 2 classes.
ITEMS, CLASSES, VAL = 600, 2, 100
JIGSAW = [
    "dataset=synthetic",
    f"dataset.num_classes={CLASSES}",
    "trainer.accelerator=cpu",
    "model.width=8",
    "batch_size=32",
    "logger=none",
    "pretrain=jigsaw",
    "pretrain.num_learners=4",
    "pretrain.batches_per_learner=2",
    "pretrain.local_epochs=1",
    "merge.ratios=5",
]


def split_of(labels: Path, split_seed: int) -> DataModule:
    load = partial(make_synthetic, ITEMS, 200, CLASSES, 1, 12, seed=0)
    dm = DataModule(load, CLASSES, 1, 12, [0.5], [0.25], val_size=VAL, split_seed=split_seed,
                    train_labels=str(labels))  # fmt: skip
    dm.setup()
    return dm


def pretrain(data: list[str], folder: Path, *overrides: str) -> Any:
    """`pretrain.py` on `data` with `overrides`, in run folder `folder`."""
    return run_entry("pretrain.py", [*data, *overrides, f"hydra.run.dir={folder}"])


def held_out_counts(dm: DataModule) -> list[int]:
    """How many items of each class the validation split holds."""
    return torch.bincount(dm.train_source.labels[dm.val_indices], minlength=CLASSES).tolist()


def two_splits(tmp_path: Path) -> tuple[DataModule, int, list[str]]:
    """Class-sorted labels, as an ImageFolder tree reads them: split 0, another split seed that
    holds out as many items of each class (pools whose labels read the same, in order), and the
    jigsaw overrides on those labels."""
    labels = tmp_path / "labels.npy"
    np.save(labels, np.repeat(np.arange(CLASSES), ITEMS // CLASSES))
    first = split_of(labels, 0)
    held = held_out_counts(first)
    other = next(s for s in range(1, 200) if held_out_counts(split_of(labels, s)) == held)
    return first, other, [*JIGSAW, f"dataset.train_labels={labels}"]


@pytest.fixture(scope="module")
def other_split(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[DataModule, int, list[str], Path]:
    """two_splits, and the learners pretrain.py saved on the other split: one run both tests
    start from (each copies the learners before using them, so neither sees the other's)."""
    folder = tmp_path_factory.mktemp("other_split")
    first, other, data = two_splits(folder)
    saved = pretrain(data, folder / "other", f"dataset.split_seed={other}")
    assert saved.returncode == 0, saved.stderr[-2000:]
    return first, other, data, folder / "other" / "learners"


def test_learners_of_another_split_are_not_merged(
    tmp_path: Path, other_split: tuple[DataModule, int, list[str], Path]
) -> None:
    first, other, data, saved = other_split
    learners = tmp_path / "other" / "learners"
    shutil.copytree(saved, learners)
    shards = [
        torch.load(path, weights_only=True)["shard"]
        for path in sorted(learners.glob("learner_*.ckpt"))
    ]
    trained_on_val = torch.isin(torch.cat(shards), first.val_indices).sum()
    assert len(shards) == 4 and trained_on_val > 0  # split 0 holds out rows they trained on
    merged = pretrain(
        data, tmp_path / "merged", "dataset.split_seed=0", f"pretrain.merge_from={learners}"
    )
    assert merged.returncode == 2, merged.stdout[-2000:]
    error = merged.stderr.strip().splitlines()[-1]
    assert f"trained on {int(trained_on_val)} rows of this run's validation split" in error
    assert not (tmp_path / "merged" / "pretrain.ckpt").exists()
    # The same learners found in a shared pretrain.learner_dir are reused, then refused alike.
    reused = pretrain(
        data, tmp_path / "reused", "dataset.split_seed=0", f"pretrain.learner_dir={learners}"
    )
    assert reused.returncode == 2, reused.stdout[-2000:]
    assert "rows of this run's validation split" in reused.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "reused" / "pretrain.ckpt").exists()
    # A part of them (a killed run's) is refused at the first one reused, before the missing
    # learner trains: it used to train, and be written there, before the merge refused them all.
    part = tmp_path / "part"
    part.mkdir()
    for i in range(3):
        (part / f"learner_{i}.ckpt").write_bytes((learners / f"learner_{i}.ckpt").read_bytes())
    assert torch.isin(shards[0], first.val_indices).any()  # learner 0, the first reused
    partial_run = pretrain(
        data, tmp_path / "partial", "dataset.split_seed=0", f"pretrain.learner_dir={part}"
    )
    assert partial_run.returncode == 2, partial_run.stdout[-2000:]
    assert "jigsaw learners [0] trained on" in partial_run.stderr.strip().splitlines()[-1]
    assert not (part / "learner_3.ckpt").exists()
    # Their own split merges them.
    again = pretrain(
        data, tmp_path / "same", f"dataset.split_seed={other}", f"pretrain.merge_from={learners}"
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert (tmp_path / "same" / "pretrain.ckpt").is_file()


def test_a_diverged_learner_of_another_split_is_left_out_as_the_merge_leaves_it(
    tmp_path: Path, other_split: tuple[DataModule, int, list[str], Path]
) -> None:
    """The merge checks the learners it merges ("ok" ones) against the validation split, and
    leaves a diverged one out with a warning. The check where a saved learner is reused ran on
    a diverged one too, and refused a run the merge would have finished without it: no row of
    a learner left out of the soup is trained on."""
    first, _, data, other_learners = other_split
    shutil.copytree(other_learners, tmp_path / "other" / "learners")
    done = pretrain(data, tmp_path / "own", "dataset.split_seed=0")
    assert done.returncode == 0, done.stderr[-2000:]
    # learner 0: another split's, diverged (saved as the merge reports it); 1-3: this split's
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    payload = torch.load(tmp_path / "other" / "learners" / "learner_0.ckpt", weights_only=True)
    assert torch.isin(payload["shard"], first.val_indices).any()  # it trained on split 0's val
    torch.save({**payload, "status": "diverged"}, mixed / "learner_0.ckpt")
    for i in range(1, 4):
        name = f"learner_{i}.ckpt"
        (mixed / name).write_bytes((tmp_path / "own" / "learners" / name).read_bytes())
    run = pretrain(data, tmp_path / "run", "dataset.split_seed=0", f"pretrain.learner_dir={mixed}")
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "run" / "pretrain.ckpt").is_file()
