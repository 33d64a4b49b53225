"""lipt's files on a real file system: an empty subset file is refused in one line; a run folder
where a folder has the name of one of lipt's files (or a file one of its folders') is refused
before any work, not after it; an ImageFolder tree is the same data set however its path is
spelt."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from lipt.core import console
from lipt.core.artifacts import (
    RUN_FILES,
    RUN_SUBFOLDERS,
    atomic_write_bytes,
    check_run_folder_entries,
    load_subset,
)
from lipt.core.errors import UserError
from lipt.data.sources import load_image_folder
from lipt.run.config import validate
from lipt.stages import train as train_stage
from tests.helpers import CONFIGS, FAST


def _cfg(out: Path, overrides: Sequence[str]) -> DictConfig:
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=[f"paths.output_dir='{out}'", *overrides])


def test_an_empty_subset_file_is_refused_in_one_line(tmp_path):
    empty = tmp_path / "subset.npz"
    empty.touch()  # a copy that never got its bytes (numpy: EOFError)
    with pytest.raises(UserError, match=r"subset\.npz is not a readable lipt subset file") as e:
        load_subset(empty)
    assert "\n" not in str(e.value)


def test_a_folder_named_summary_json_is_refused_before_main_training(tmp_path):
    (tmp_path / "summary.json").mkdir()  # the user's, or another tool's
    with pytest.raises(UserError, match=r"summary\.json is a folder, where lipt writes") as e:
        train_stage.run(validate(_cfg(tmp_path, FAST)))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "checkpoints").exists()  # refused before training, not after it


@pytest.mark.parametrize("name", ["subset.npz", "stages.json", "learners", "subsets"])
def test_each_of_lipts_names_of_the_wrong_kind_is_refused(tmp_path, name):
    check_run_folder_entries(tmp_path)  # an empty run folder is fine
    entry = tmp_path / name
    if name in RUN_FILES:
        entry.mkdir()
    else:
        entry.write_text("the user's notes")
    with pytest.raises(UserError, match=f"{name} is a (folder|file), where lipt writes"):
        check_run_folder_entries(tmp_path)


def test_a_write_onto_a_folder_is_refused_in_one_line(tmp_path):
    target = tmp_path / "merge_report.json"
    target.mkdir()  # made while the run ran
    with pytest.raises(UserError, match=r"merge_report\.json is a folder, not lipt's file"):
        atomic_write_bytes(target, b"{}")
    assert [p.name for p in tmp_path.iterdir()] == ["merge_report.json"]  # no temporary left


def test_run_files_name_every_file_the_stages_write():
    from lipt.cleaning import datalab
    from lipt.cleaning.issues_csv import ISSUES_FILE
    from lipt.report.pictures import ISSUES_PICTURE, SUBSET_PICTURE
    from lipt.stages.clean import CLEAN_FILE
    from lipt.stages.select import STAGES_FILE, SUBSET_FILE

    written = {ISSUES_FILE, ISSUES_PICTURE, SUBSET_PICTURE, CLEAN_FILE, STAGES_FILE, SUBSET_FILE}
    written |= {datalab.ISSUES_FILE, datalab.SUMMARY_FILE}
    shown = {name for name in console.ARTIFACTS if "/" not in name}
    assert written | shown <= set(RUN_FILES)
    assert {name.split("/")[0] for name in console.ARTIFACTS if "/" in name} <= set(RUN_SUBFOLDERS)


def test_an_image_folder_is_named_alike_however_its_path_is_spelt(imagefolder_dir, monkeypatch):
    whole = load_image_folder(str(imagefolder_dir), 32, 32).name
    assert whole.startswith("imagefolder:imagenet:3:")
    monkeypatch.chdir(imagefolder_dir)
    assert load_image_folder(".", 32, 32).name == whole  # was imagefolder::3:...
    monkeypatch.chdir(imagefolder_dir / "train")
    assert load_image_folder("..", 32, 32).name == whole  # was imagefolder:..:3:...
    assert load_image_folder(os.path.join("..", "."), 32, 32).name == whole


def test_a_full_disk_says_how_train_py_goes_on_from_what_was_saved(tmp_path, monkeypatch):
    import errno

    path = tmp_path / "checkpoints" / "last.ckpt"
    atomic_write_bytes(path, b"epoch 0")

    def fsync(fd: int) -> None:  # the disk is full by the next epoch's checkpoint
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("lipt.core.artifacts.os.fsync", fsync)
    # "run again" alone: train.py without ckpt_path=last starts over, past the saved epochs
    with pytest.raises(UserError, match=r"unchanged\); free some space .*ckpt_path=last") as e:
        atomic_write_bytes(path, b"epoch 1")
    assert "\n" not in str(e.value) and path.read_bytes() == b"epoch 0"
