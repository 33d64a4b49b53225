"""Two lipt processes on one run folder: the folder is held from before Hydra writes into it
(claim_run_dir), a second process is refused in one line naming the holder, a killed holder
leaves no lock behind, and a claim that wrote nothing leaves no folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lipt.core.errors import one_line
from lipt.core.lock import (
    RunDirLockedError,
    check_unlocked,
    claim_run_dir,
    lock_holder,
    lock_run_dir,
    release_run_dir,
)
from lipt.run.cli import claim_given_folder
from lipt.run.precheck import check_given_folders
from tests.helpers import FAST, run_entry

CLAIMER = """
import sys
from pathlib import Path
from lipt.core.lock import claim_run_dir
claim_run_dir(Path(sys.argv[1]))
if sys.argv[2] == "write":  # as Hydra writes .hydra/ once the folder is claimed
    (Path(sys.argv[1]) / "x").write_text("")
print("claimed", flush=True)
if sys.argv[2] == "hold":
    sys.stdin.read()  # until killed or told to go
"""


def _claim_in_another_process(folder: Path, then: str = "hold") -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CLAIMER, str(folder), then],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "claimed"
    return proc


def test_a_new_folder_claimed_by_one_run_refuses_the_other_naming_it(tmp_path):
    """Two runs started at once on a folder not there yet: both passed the probe of
    check_unlocked, and the one refused later had rewritten the other's .hydra/ by then."""
    folder = tmp_path / "runs" / "mine"
    holder = _claim_in_another_process(folder)
    try:
        assert folder.is_dir() and lock_holder(folder) == holder.pid
        for attempt in (claim_run_dir, check_unlocked, lock_run_dir):
            with pytest.raises(RunDirLockedError) as refused:
                attempt(folder)
            line = one_line(refused.value)
            assert "\n" not in line
            assert f"run folder {folder} is in use by another lipt run (process {holder.pid})" in (
                line
            )
        assert list(folder.iterdir()) == []  # the refused one wrote nothing
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_claimer_leaves_no_lock(tmp_path):
    folder = tmp_path / "run"
    holder = _claim_in_another_process(folder)
    os.kill(holder.pid, signal.SIGKILL)  # no clean-up runs: the kernel drops the flock
    holder.wait()
    assert lock_holder(folder) is None
    try:
        claim_run_dir(folder)  # the next run proceeds
        assert lock_holder(folder) == os.getpid()
    finally:
        release_run_dir(folder)


def test_a_claim_that_wrote_nothing_leaves_nothing_and_one_that_wrote_keeps_its_folder(tmp_path):
    """A dry run or a refusal after the claim: the folders it made are gone at its exit; the
    folder that was there before stays."""
    (tmp_path / "outputs").mkdir()
    holder = _claim_in_another_process(tmp_path / "outputs" / "a" / "b", then="exit")
    assert holder.wait() == 0
    assert list(tmp_path.iterdir()) == [tmp_path / "outputs"]
    assert list((tmp_path / "outputs").iterdir()) == []

    writer = _claim_in_another_process(tmp_path / "written" / "run", then="write")
    assert writer.wait() == 0
    assert (tmp_path / "written" / "run" / "x").is_file()


def test_a_claim_then_the_stages_lock_removes_the_killed_writes_leftovers(tmp_path):
    """The folder is held from the claim on: the stage's lock_run_dir still clears what a
    killed attempt's writes left (lipt.core.artifacts.remove_leftover_temporaries)."""
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    leftover = folder / "checkpoints" / ".last.ckpt.abcd1234.tmp"
    leftover.write_bytes(b"half a checkpoint")
    try:
        claim_run_dir(folder)
        assert leftover.exists()
        lock_run_dir(folder)
        assert not leftover.exists()
    finally:
        release_run_dir(folder)


def test_an_extra_ddp_rank_claims_nothing_in_its_rank_0s_folder(tmp_path, monkeypatch):
    """srun starts every task at once: a task other than the first, holding the folder before
    its rank 0, would have its own rank 0 refused."""
    folder = tmp_path / "run"
    holder = _claim_in_another_process(folder)
    try:
        monkeypatch.setenv("SLURM_PROCID", "1")
        claim_given_folder([f"hydra.run.dir={folder}"], multirun=False)  # no refusal
        check_given_folders([f"hydra.run.dir={folder}"])  # precheck's probe: none either
        assert lock_holder(folder) == holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_a_quoted_folder_is_claimed_as_hydra_reads_it(tmp_path, monkeypatch):
    """Split at '=', "hydra.run.dir='<path>'" claimed a folder named with the quotes, under
    the working directory, and left the run's own folder unclaimed."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "runs" / "with space"
    try:
        claim_given_folder([f"+hydra.run.dir='{folder}'", "seed=1"], multirun=False)
        assert lock_holder(folder) == os.getpid()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    finally:
        release_run_dir(folder)


def test_a_sweep_whose_jobs_run_in_its_folder_is_not_claimed_by_the_sweep(tmp_path):
    """hydra.sweep.subdir=. : the one job's folder is the sweep folder; held by the sweep's
    process, a joblib worker's job was refused as if another run held it."""
    folder = tmp_path / "sweep"
    claim_given_folder([f"hydra.sweep.dir={folder}", "hydra.sweep.subdir=."], multirun=True)
    assert lock_holder(folder) is None
    claim_given_folder([f"hydra.sweep.dir={folder}", "seed=0,1"], multirun=True)
    try:
        assert lock_holder(folder) == os.getpid()
    finally:
        release_run_dir(folder)


@pytest.mark.parametrize("subdir", [".", "3", "f0.1/s3"])
def test_the_sweep_folder_of_a_job_is_above_its_subdir(monkeypatch, tmp_path, subdir):
    """sweep_dir_of_job, which a sweep's learner jobs share their learners under: with
    hydra.sweep.subdir=. it gave the file system's root, `/learners` for the learners."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from lipt.core.job import sweep_dir_of_job

    sweep = tmp_path / "sweep"
    output = sweep / subdir if subdir != "." else sweep
    hydra = OmegaConf.create({"sweep": {"subdir": subdir}, "runtime": {"output_dir": str(output)}})
    hydra.mode = RunMode.MULTIRUN  # an enum, as Hydra sets it
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hydra))
    assert sweep_dir_of_job() == sweep


def test_a_sweep_job_on_a_held_folder_is_refused_naming_the_sweeps_setting(tmp_path):
    """Two multiruns on one hydra.sweep.dir: the second's job finds the first's job folder
    held. It was told to pass another hydra.run.dir, which a multirun's job folders ignore."""
    sweep = tmp_path / "sweep"
    holder = _claim_in_another_process(sweep / "0")  # the first sweep's job 0, running
    try:
        args = [*FAST, "pretrain=none", "selector=random", "budget=subset", "seed=5"]
        out = run_entry("train.py", ["-m", *args, f"hydra.sweep.dir={sweep}"])
    finally:
        holder.kill()
        holder.wait()
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0] == (
        f"error: run folder {sweep / '0'} is in use by another lipt run (process "
        f"{holder.pid}); wait for it to end, or pass another hydra.sweep.dir"
    )
