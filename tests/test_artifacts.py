"""summary.json / subset.npz / checkpoints: atomic, readable by other tools, checked on load."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from lipt.core.artifacts import (
    atomic_write_bytes,
    check_subset,
    load_checkpoint,
    load_subset,
    save_checkpoint,
    save_subset,
)
from lipt.core.errors import UserError


def test_subset_round_trip_is_plain_numpy(tmp_path):
    path = tmp_path / "subset.npz"
    save_subset(path, torch.tensor([3, 1, 7]), torch.tensor([1.0, 2.0, 0.5]), {"dataset": "x"})
    with np.load(path) as data:  # any tool reads it without lipt
        assert data["indices"].dtype == np.int64 and data["indices"].tolist() == [3, 1, 7]
        assert data["weights"].dtype == np.float32
        assert json.loads(str(data["meta"]))["dataset"] == "x"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600
    indices, weights, _ = load_subset(path)
    assert indices.tolist() == [3, 1, 7] and weights.tolist() == [1.0, 2.0, 0.5]


@pytest.mark.parametrize(
    ("indices", "weights", "meta", "match"),
    [
        ([1, 2], [1, 1], {"dataset": "other", "dataset_train_size": 10}, "made for dataset"),
        ([1, 12], [1, 1], {"dataset": "d", "dataset_train_size": 10}, "outside"),
        ([1, 1], [1, 1], {"dataset": "d", "dataset_train_size": 10}, "duplicate"),
        ([1, 5], [1, 1], {"dataset": "d", "dataset_train_size": 10}, "validation split"),
        ([1, 2], [1, -1], {"dataset": "d", "dataset_train_size": 10}, "non-positive"),
    ],
)
def test_bad_subsets_are_refused(tmp_path, indices, weights, meta, match):
    with pytest.raises(UserError, match=match):
        check_subset(
            tmp_path / "s.npz",
            torch.tensor(indices),
            torch.tensor(weights, dtype=torch.float32),
            meta,
            {"dataset": "d", "dataset_train_size": 10},
            10,
            torch.tensor([5, 6]),
        )


def test_truncated_files_are_user_errors(tmp_path):
    path = tmp_path / "subset.npz"
    save_subset(path, torch.arange(5), torch.ones(5), {})
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(UserError, match="not a readable lipt subset"):
        load_subset(path)
    ckpt = tmp_path / "pretrain.ckpt"
    save_checkpoint(ckpt, {"state_dict": {"w": torch.ones(3)}, "data": "d"})
    assert torch.equal(load_checkpoint(ckpt)["state_dict"]["w"], torch.ones(3))
    ckpt.write_bytes(ckpt.read_bytes()[:50])
    with pytest.raises(UserError, match="not a readable checkpoint"):
        load_checkpoint(ckpt)


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    atomic_write_bytes(path, b"old")

    def broken_replace(src, dst):
        raise KeyboardInterrupt  # a kill between writing and renaming

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left


def test_a_saved_subset_is_refused_beside_another_fraction_or_selector(make_cfg, tmp_path):
    """train.py subset_path=... trains the subset as select.py chose it, so a `fraction` or a
    `selector` that is not the subset's would only mislabel the run's summary.json (and a
    sweep's report): refused in one line before main training, the run folder left empty."""
    from lipt.run.config import validate
    from lipt.stages import select as select_stage
    from lipt.stages import train as train_stage
    from lipt.stages.build import build_datamodule
    from tests.helpers import FAST

    picks = [*FAST, "selector=random_balanced", "budget=subset", "fraction=0.2"]
    select_stage.run(validate(make_cfg(picks, config_name="select")))
    saved = tmp_path / "subset.npz"
    run2 = tmp_path / "second"
    given = [*FAST, f"subset_path={saved}", f"paths.output_dir={run2}"]
    cases = [
        ([], r"is a fraction=0\.2 subset, but this run has fraction=0\.1.*pass fraction=0\.2"),
        (["fraction=0.2", "selector=glister"], r"selected by selector=random_balanced, but .*"),
    ]
    for overrides, needle in cases:
        with pytest.raises(UserError, match=needle) as caught:
            train_stage.run(validate(make_cfg([*given, *overrides])))
        assert "\n" not in str(caught.value)
        assert not (run2 / "checkpoints").exists()  # refused before main training
    # the subset's own labels (or no selector at all) load it
    for overrides in (["fraction=0.2"], ["fraction=0.2", "selector=random_balanced"]):
        run = validate(make_cfg([*given, *overrides]))
        indices, _ = select_stage.load_checked_subset(build_datamodule(run), saved, run)
        assert len(indices) == 100  # 20% of the synthetic pool's 500
