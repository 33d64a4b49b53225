"""Stopping an entry script outside a job: Ctrl-C while the command line is checked, and
SIGTERM to a sweep whose jobs run in joblib's workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lipt.run import cli
from tests.helpers import FAST, ROOT


def test_ctrl_c_while_checking_is_one_line_and_exit_130(monkeypatch, capsys):
    # a dry run reads the data and builds every job: Ctrl-C then was a long traceback
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "precheck", interrupted)
    monkeypatch.setattr(sys, "argv", ["train.py", "dry_run=true"])
    with pytest.raises(SystemExit) as stop:
        cli.train_main()
    assert stop.value.code == 130
    err = capsys.readouterr().err
    assert err == "stopped by SIGINT before the run started; nothing was written\n"


def session_processes(sid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


@pytest.mark.slow
def test_sigterm_to_a_joblib_sweep_ends_its_workers_and_says_how_to_resume(tmp_path: Path):
    # The sweep's process died at once and left joblib's workers training every job to its
    # end (summary.json written after the sweep had stopped), holding the jobs' folders.
    sweep = tmp_path / "sweep"
    args = [*FAST, "trainer.max_epochs=300", "budget=full", "seed=0,1"]
    args += ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(
        [sys.executable, "train.py", "-m", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    left: list[int] = []
    try:
        logs = [sweep / str(job) / "train.log" for job in (0, 1)]
        deadline = time.monotonic() + 240
        while not all(log.is_file() and "training:" in log.read_text() for log in logs):
            assert proc.poll() is None and time.monotonic() < deadline, "the jobs did not start"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        deadline = time.monotonic() + 3  # the workers' grace to end after the sweep did
        while (left := session_processes(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.returncode == 128 + signal.SIGTERM, err
        # (joblib's resource tracker, which outlives the sweep a moment, may warn after it)
        assert (
            "stopped by SIGTERM; resume with the same command and "
            f"ckpt_path=last hydra.sweep.dir={sweep}"
        ) in err.splitlines(), err
        assert left == [], "joblib's workers outlived the sweep"
        assert not list(sweep.glob("*/summary.json"))
    finally:
        for pid in left or session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
