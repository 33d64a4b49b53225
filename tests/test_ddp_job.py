"""An extra DDP rank's part of the job (lipt.core.job): it ends with the rank 0 that started it,
and it sees an earlier attempt of the run where rank 0 does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lipt.core import job
from lipt.core.lock import release_run_dir
from tests.helpers import ROOT

# A rank 0 as Lightning's launcher is one: it starts an extra rank that runs the script again,
# here one that takes the run folder and then waits (as in the process group's rendezvous).
LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = {**os.environ, "LOCAL_RANK": "1", "LIPT_LAUNCHER_PID": str(os.getpid())}
    code = (
        "import sys, time; from pathlib import Path; from lipt.core.job import run_dir; "
        "run_dir(Path(sys.argv[1])); print('ready', flush=True); time.sleep(600)"
    )
    extra = subprocess.Popen([sys.executable, "-c", code, sys.argv[1]], env=env)
    print(extra.pid, flush=True)
    time.sleep(600)
    """
)


def gone(pid: int) -> bool:
    """The process ended (reaped, or a zombie nobody reaps)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_an_extra_rank_ends_when_its_rank_0_is_killed(tmp_path):
    """A rank 0 killed (SIGKILL, the out-of-memory killer) before its ranks met left the extra
    rank waiting in the rendezvous for the process group's 30-minute timeout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("LOCAL_RANK", None)
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert launcher.stdout is not None
    extra = int(launcher.stdout.readline())
    try:
        assert launcher.stdout.readline().strip() == "ready"  # past run_dir
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 20
        while not gone(extra) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(extra)
    finally:
        if not gone(extra):
            os.kill(extra, signal.SIGKILL)
        launcher.kill()


def finished_process_id() -> int:
    """The id of a process that ran and was reaped."""
    code = "import os; print(os.getpid())"
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return int(process.stdout)


def test_an_extra_rank_whose_rank_0_ended_before_it_started_stops(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv(job.LAUNCHER_PID, str(finished_process_id()))
    with pytest.raises(SystemExit, match="ended before this extra DDP rank started"):
        job.run_dir(tmp_path / "run")


def test_a_rank_another_launcher_started_is_left_alone(tmp_path, monkeypatch):
    """srun's and torchrun's ranks, and a rank whose recorded rank 0 is alive but not its
    parent, take the folder as before."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv(job.LAUNCHER_PID, str(os.getpid()))  # alive, not this one's parent
    assert job.run_dir(tmp_path / "a") == tmp_path / "a"
    ended = finished_process_id()
    monkeypatch.setenv(job.LAUNCHER_PID, str(ended))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "1")
    assert job.run_dir(tmp_path / "b") == tmp_path / "b"
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.setenv("SLURM_PROCID", "1")  # srun's second task
    assert job.launcher_pid() is None
    # inside `srun --pty bash` every process has SLURM_PROCID=0: Lightning's launcher started
    # this rank, whose rank 0 has ended
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert job.launcher_pid() == ended
    with pytest.raises(SystemExit, match="ended before this extra DDP rank started"):
        job.run_dir(tmp_path / "c")


def test_rank_0_tells_the_ranks_it_starts_its_process(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv(job.LAUNCHER_PID, "1")  # monkeypatch restores the environment after
    folder = job.run_dir(tmp_path / "run")
    try:
        assert os.environ[job.LAUNCHER_PID] == str(os.getpid())
    finally:
        release_run_dir(folder)


def stamped(when: float) -> str:
    """A log record as Hydra's format opens it, at `when` (seconds since the epoch)."""
    return time.strftime("[%Y-%m-%d %H:%M:%S,000][lipt][INFO] - a record\n", time.localtime(when))


def test_an_extra_rank_sees_the_earlier_attempt_its_rank_0_logged(tmp_path, monkeypatch):
    """A run killed on one device before it saved anything, resumed with ckpt_path=last on two:
    rank 0 started over, and its extra rank, whose own log (train_ddp_process_1.log) was new,
    refused the run ("ckpt_path=last but .../last.ckpt does not exist")."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "train.log").write_text(stamped(time.time() - 3600))  # the earlier attempt's
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv(job.LAUNCHER_PID, str(os.getpid()))
    rank_0_started = time.time() - 60
    monkeypatch.setattr(job, "process_start_time", lambda pid="self": rank_0_started)
    assert job.logged_before_this_process(out)
    (out / "train.log").write_text(stamped(time.time() - 30))  # this attempt's rank 0 wrote it
    assert not job.logged_before_this_process(out)


def test_rank_0_reads_only_its_own_log(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    (out / "other.log").write_text(stamped(time.time() - 3600))  # not this run's log
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert not job.logged_before_this_process(out)
