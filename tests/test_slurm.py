"""lipt against a real SLURM scheduler (`make slurm-up`: slurmctld, slurmd, slurmdbd and munged on
this machine, one node). No mock: every job here is submitted with sbatch by submitit and run by
slurmd; preemption is `scontrol requeue`, the time-limit signal is the one `--signal` names,
sent by SLURM (`scancel --signal`), and a cancelled job is `scancel`.

Each run on the cluster is compared with the same run here, without SLURM: bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from lipt.cluster.slurm import slurm_problem
from tests.helpers import FAST, ROOT, run_entry

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    """The environment that reaches the cluster: SLURM_CONF of `make slurm-up`'s cluster unless
    one is set. Skips, saying why, where no controller answers."""
    env = {}
    if "SLURM_CONF" not in os.environ:
        conf = Path(os.environ.get("LIPT_SLURM_DIR", ROOT / ".slurm")) / "slurm.conf"
        env["SLURM_CONF"] = str(conf)
    saved = os.environ.copy()
    os.environ.update(env)
    try:
        problem = slurm_problem()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if problem is not None:
        pytest.skip(f"no SLURM cluster answers ({problem}): run make slurm-up (root and apt-get)")
    return env


def slurm(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        args, capture_output=True, text=True, env={**os.environ, **env}, timeout=60, check=True
    )
    return out.stdout


def job_ids(env: dict[str, str]) -> set[str]:
    """Every job accounting knows of (array tasks by their own ids)."""
    return set(
        slurm(env, "sacct", "-n", "-X", "-P", "-a", "-S", "now-1days", "-o", "JobID").split()
    )


def submit(env: dict[str, str], script: str, args: list[str]) -> subprocess.Popen[str]:
    """Start a sweep's submitting process in the background, as a user on a login node would."""
    return subprocess.Popen(
        [sys.executable, script, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 400) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def until(what: str, check: Callable[[], object], timeout: float = 120) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def running_jobs(env: dict[str, str], name: str) -> list[str]:
    """Ids of this user's running jobs called `name` (array tasks as <array>_<task>)."""
    out = slurm(env, "squeue", "-h", "-t", "RUNNING", "-n", name, "-o", "%i")
    return out.split()


def weights(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=False)[
        "state_dict"
    ]
    return state


def same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not differ, f"{a} and {b} differ in {differ}"


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


SLURM = ["hydra/launcher=slurm", "hydra.launcher.poll_s=1"]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "env_extra", "words"),
    [
        (["hydra/launcher=slurm"], {}, ["add -m"]),
        (["-m", "hydra/launcher=slurm", "hydra.launcher.partition=nope"], {}, ["nope", "debug"]),
        (
            ["-m", "hydra/launcher=slurm"],
            {"SLURM_CONF": "/no/such/slurm.conf"},
            ["no SLURM cluster is reachable", "make slurm-up"],
        ),
    ],
    ids=["no-multirun", "no-such-partition", "no-slurm"],
)
def test_bad_input_is_one_line_before_anything_is_submitted(
    slurm_env, tmp_path, args, env_extra, words
):
    before = job_ids(slurm_env)
    sweep = tmp_path / "sweep"
    out = run_entry(
        "train.py",
        [*FAST, *args, f"hydra.sweep.dir={sweep}", f"hydra.run.dir={tmp_path / 'run'}"],
        env={**slurm_env, **env_extra},
        timeout=120,
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith("error: ") and all(w in lines[0] for w in words), lines[0]
    assert not sweep.exists() and not (tmp_path / "run").exists()  # nothing half-written
    assert job_ids(slurm_env) == before  # nothing submitted
