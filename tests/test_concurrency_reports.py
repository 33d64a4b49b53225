"""Reports read while the sweep's jobs still run: a folder that a running job removes during the
walk (a refused job's folder, which lipt.run.cli removes; a logger's temporary one) is passed
over, where rglob ended `make report` and a sweep's closing table in FileNotFoundError."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from lipt.report.frontier_runs import find_named, reference_approach
from lipt.report.sweep_runs import load_summaries


def _summary(seed: int) -> dict:
    config = {"seed": seed, "fraction": 0.1, "approach": "random", "trainer": {"max_epochs": 2}}
    return {"config": config, "stages": {"train": {"seconds": 1.0}}, "test_accuracy": 0.5}


def _sweep(root: Path) -> Path:
    """A frontier sweep of 12 finished jobs and one, the last, refused as it started."""
    sweep = root / "sweep"
    for job in range(12):
        folder = sweep / str(job)
        (folder / ".hydra").mkdir(parents=True)
        (folder / "csv" / "version_0").mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps(_summary(job)))
    (sweep / "12" / ".hydra").mkdir(parents=True)
    (sweep / "12" / "csv" / "version_0").mkdir(parents=True)
    target = "lipt.run.frontier_sweep.FrontierSweeper"
    sweeper = {"_target_": target, "reference": ["approach=full"]}
    (sweep / "multirun.yaml").write_text(json.dumps({"hydra": {"sweeper": sweeper}}))
    return sweep


@pytest.fixture
def removed_while_read(tmp_path, monkeypatch):
    """The refused job's folder is removed (as lipt.run.cli.remove_if_only_bookkeeping removes
    it) in the instant after the reader listed it and before it lists the folders in it."""
    sweep = _sweep(tmp_path)
    doomed = sweep / "12"
    real = os.scandir

    def scandir(path=None):  # type: ignore[no-untyped-def]
        named = isinstance(path, str | os.PathLike)  # shutil.rmtree lists by descriptor
        if named and Path(path).parent == doomed and doomed.exists():
            shutil.rmtree(doomed)
        return real(path) if path is not None else real()

    monkeypatch.setattr(os, "scandir", scandir)
    return sweep


def test_a_sweeps_runs_are_read_while_a_job_folder_is_removed(removed_while_read):
    runs, warnings = load_summaries(removed_while_read)
    assert sorted(run.config["seed"] for run in runs) == list(range(12))
    assert not (removed_while_read / "12").exists()
    assert warnings == []  # the removed job was never a run: no summary to miss


def test_a_frontiers_reference_is_read_while_a_job_folder_is_removed(removed_while_read):
    assert reference_approach(removed_while_read) == "full"


def test_a_sweep_folder_is_walked_as_rglob_walks_it(tmp_path):
    sweep = _sweep(tmp_path)
    (sweep / "3" / "link").symlink_to(sweep / "4")  # not followed: job 4 once, not twice
    for name in ("summary.json", ".hydra", "multirun.yaml", "version_0"):
        assert find_named(sweep, name) == sorted(sweep.rglob(name)), name
    assert len(find_named(sweep, "summary.json")) == 12


def test_a_multirun_yaml_being_written_is_passed_over(tmp_path):
    """A sweep started in a folder under the one reported writes its multirun.yaml in place:
    read half-written, it was a YAML traceback; the frontier's own multirun.yaml still says."""
    sweep = _sweep(tmp_path)
    (sweep / "again").mkdir()
    (sweep / "again" / "multirun.yaml").write_text("hydra:\n  sweeper: {_target_: 'lipt.ru")
    assert reference_approach(sweep) == "full"
