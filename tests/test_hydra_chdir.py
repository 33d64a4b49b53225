"""`hydra.job.chdir=True`: the job runs in its run folder. A relative input path, checked in the
folder the command was typed in, would be read in the run folder: refused in one line before
Hydra starts, with the absolute path that works. A job refused after Hydra started (a command
line that goes straight to Hydra, as --config-name does) removes the folder Hydra made for it,
its own working directory, without a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, run_entry

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not FASHION_MNIST.is_dir(), reason="needs Debian's dataset-fashion-mnist")
def test_a_relative_data_dir_under_chdir_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """`dataset.data_dir=fm` exists where the command is typed, not in the run folder the job
    reads it from: the check that passed it let the job fail (or read other files) later."""
    from lipt.run.precheck import precheck

    (tmp_path / "fm").symlink_to(FASHION_MNIST)
    monkeypatch.chdir(tmp_path)
    args = ["hydra.job.chdir=True", "dataset.data_dir=fm", "dataset.pool_size=2000"]
    with pytest.raises(SystemExit) as exit_:
        precheck("train", args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert "dataset.data_dir=fm is relative, and hydra.job.chdir=True" in err, err
    assert f"dataset.data_dir={tmp_path / 'fm'}" in err, err  # the fix: the absolute path
    # the fix passes, and so does the relative path without chdir
    assert precheck("train", [args[0], f"dataset.data_dir={tmp_path / 'fm'}", args[2]]) is None
    assert precheck("train", args[1:]) is None


def test_a_job_refused_in_its_own_working_dir_leaves_no_folder(tmp_path: Path) -> None:
    """--config-name goes straight to Hydra (no check first): the job refuses the relative
    `subset_path` in its run folder, its working directory, and removes that folder and the
    outputs/ folders made for it; removing them once ended in FileNotFoundError's traceback."""
    args = [
        "--config-name",
        "train",
        "hydra.job.chdir=True",
        "dataset=synthetic",
        "subset_path=subset.npz",
    ]
    proc = run_entry(str(ROOT / "train.py"), args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "subset_path=subset.npz is relative" in lines[0], proc.stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))
