"""What lipt asks of a SLURM cluster before it submits anything, through SLURM's own client
(`sinfo`): is one reachable, does the partition exist. A bad answer is a `UserError` (one line,
exit 2) raised before a job is submitted."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lipt.core.errors import UserError

# hydra/launcher options whose jobs go to SLURM (lipt's own, and Hydra's plain one).
LIPT_LAUNCHER = "hydra_plugins.lipt_slurm.slurm_launcher.LiptSlurmLauncher"
SLURM_LAUNCHERS = (
    LIPT_LAUNCHER,
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
)


def is_slurm_launcher(launcher: Mapping[str, Any] | None) -> bool:
    return launcher is not None and str(launcher.get("_target_")) in SLURM_LAUNCHERS


def _client(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def slurm_problem() -> str | None:
    """Why no SLURM controller answers here (None: one does)."""
    if shutil.which("sinfo") is None:
        return "no SLURM client (sinfo) on this machine"
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # else sinfo looks for a controller in DNS, for 20 s
        return f"SLURM_CONF={conf} is no file"
    try:
        out = _client("sinfo", "-h", "-o", "%P")
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 20 s"
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or ["no answer"])[0]
        return f"sinfo failed ({first})"
    return None


def partitions() -> list[str]:
    """The cluster's partition names (the default one without sinfo's '*')."""
    out = _client("sinfo", "-h", "-o", "%P")
    return [name.rstrip("*") for name in out.stdout.split()]


def check_slurm_launcher(launcher: Mapping[str, Any], multirun: bool) -> None:
    """A SLURM launcher's settings, before anything is submitted.

    Raises:
        UserError: lipt's own launcher keys out of range, not a multirun (Hydra would run the
            job here, not on SLURM), no SLURM controller answers, or the partition does not
            exist.
    """
    for key, least in (("learners_per_task", 1), ("learner_retries", 0)):
        value = launcher.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise UserError(
                f"hydra.launcher.{key}={value} must be a whole number of at least {least}"
            )
    poll = launcher.get("poll_s")
    if isinstance(poll, bool) or not isinstance(poll, (int, float)) or poll <= 0:
        raise UserError(f"hydra.launcher.poll_s={poll} must be a positive number of seconds")
    if not multirun:
        raise UserError(
            "hydra/launcher submits a multirun's jobs to SLURM, but this is a single run that "
            "Hydra would run here; add -m (python train.py -m hydra/launcher=slurm ...)"
        )
    problem = slurm_problem()
    if problem is not None:
        conf = os.environ.get("SLURM_CONF")
        where = f" (SLURM_CONF={conf})" if conf else ""
        raise UserError(
            f"no SLURM cluster is reachable{where}: {problem}; run on a cluster's login node, "
            "set SLURM_CONF, or start the local one with make slurm-up"
        )
    partition = launcher.get("partition")
    if partition:
        known = partitions()
        if str(partition) not in known:
            raise UserError(
                f"hydra.launcher.partition={partition} is not a partition of this cluster; "
                f"use one of {', '.join(known) or '(none)'}"
            )
