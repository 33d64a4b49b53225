"""`scripts/slurm.sh up` on a cluster that is partly up: a dead munged (every job then fails to
authenticate) is not "already up". Run on the script's own functions, sourced, with the
daemons stood in for by this test's own `sleep` processes and `munge` by a stub on PATH:
no SLURM daemon is started or stopped."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "scripts" / "slurm.sh"
DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "mariadb")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    """A cluster folder whose PID files name live processes of this test's."""
    run = tmp_path / "cluster" / "run"
    run.mkdir(parents=True)
    sleepers = [subprocess.Popen(["sleep", "300"]) for _ in DAEMONS]
    for name, process in zip(DAEMONS, sleepers, strict=True):
        (run / f"{name}.pid").write_text(f"{process.pid}\n")
    yield tmp_path / "cluster"
    for process in sleepers:
        process.kill()
        process.wait()


def _up(folder: Path, tmp_path: Path, munge_answers: bool) -> str:
    """`up`'s output, with `down` and the start of the daemons replaced by lines saying so."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name, body in (("munge", "echo cred" if munge_answers else "exit 1"), ("unmunge", "cat")):
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    script = (
        f"source {SCRIPT}\n"
        'down() { echo "down called"; }\n'
        'install_packages() { echo "starting it all"; exit 0; }\n'
        "up\n"
    )
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "LIPT_SLURM_DIR": str(folder)}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_cluster_whose_munged_is_dead_is_half_up(cluster, tmp_path):
    """It said "already up" with slurmctld alive and munged dead: every job then failed."""
    out = _up(cluster, tmp_path, munge_answers=False)
    assert "half up (munged not running)" in out
    assert "down called" in out and "starting it all" in out and "already up" not in out


def test_a_cluster_whose_daemons_all_answer_is_up(cluster, tmp_path):
    out = _up(cluster, tmp_path, munge_answers=True)
    assert "already up" in out and "down called" not in out and "starting" not in out


def test_a_dead_slurmctld_beside_live_daemons_stops_them_first(cluster, tmp_path):
    """The daemons still running were started over (their ports in use) when slurmctld was
    the one that died."""
    (cluster / "run" / "slurmctld.pid").unlink()
    out = _up(cluster, tmp_path, munge_answers=True)
    assert "half up (slurmctld not running)" in out and "down called" in out


def test_a_cluster_with_nothing_running_starts_without_stopping(tmp_path):
    out = _up(tmp_path / "nothing", tmp_path, munge_answers=False)
    assert "half up" not in out and "down called" not in out and "starting it all" in out
