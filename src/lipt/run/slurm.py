"""What lipt asks of a SLURM cluster before it submits anything, through SLURM's own clients
(`sinfo`, `sacct`): is one reachable, does the partition exist and take the jobs' time limit,
and does accounting answer (without it a cancelled job goes unnoticed: a warning). A bad answer
is a `UserError` (one line, exit 2) raised before a job is submitted."""

from __future__ import annotations

import logging
import math
import os
import re
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
# SLURM's time formats (sbatch --time): minutes, minutes:seconds, hours:minutes:seconds,
# days-hours, days-hours:minutes, days-hours:minutes:seconds.
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def is_slurm_launcher(launcher: Mapping[str, Any] | None) -> bool:
    return launcher is not None and str(launcher.get("_target_")) in SLURM_LAUNCHERS


def submits_to_slurm() -> bool:
    """Whether this process submits the run's jobs to SLURM nodes (a multirun with a SLURM
    launcher, not from inside a job): the hardware they run on is not this host's."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or "SLURM_JOB_ID" in os.environ:
        return False
    hydra = HydraConfig.get()
    return hydra.mode == RunMode.MULTIRUN and is_slurm_launcher(hydra.launcher)


def check_job_gpus(launcher: Mapping[str, Any], trainer: Mapping[str, Any] | None) -> None:
    """trainer.accelerator=gpu (or cuda) on SLURM jobs that ask for no GPU: SLURM gives a job
    only the GPUs it asks for, so each job would wait in the queue, then fail on its node.
    Passed over where the jobs ask for them another way (additional_parameters: gpus, gres,
    a whole node with exclusive)."""
    accelerator = None if trainer is None else str(trainer.get("accelerator"))
    if accelerator not in ("gpu", "cuda"):
        return
    if any(launcher.get(key) for key in ("gpus_per_node", "gpus_per_task", "gres")):
        return
    extra = launcher.get("additional_parameters") or {}
    if any("gpu" in str(key) or key in ("gres", "exclusive") for key in extra):
        return
    devices = trainer.get("devices") if trainer is not None else None
    raise UserError(
        f"trainer.accelerator={accelerator} on SLURM jobs that ask for no GPU (SLURM gives a "
        "job only the GPUs it asks for: each would fail on its node); set "
        f"hydra.launcher.gpus_per_node={devices if isinstance(devices, int) else '<GPUs>'}, "
        "or gpus_per_task or gres"
    )


def slurm_client(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """A SLURM client's run (`args`: the tool, then its arguments), its output as text.

    Raises:
        OSError: no such tool; subprocess.TimeoutExpired: no answer in `timeout` seconds.
    """
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def _failed(tool: str, out: subprocess.CompletedProcess[str]) -> str:
    lines = [line.strip() for line in out.stderr.splitlines() if line.strip()]
    return f"{tool} failed ({lines[-1] if lines else f'exit {out.returncode}'})"


def slurm_problem() -> str | None:
    """Why no SLURM controller answers here (None: one does)."""
    missing = [tool for tool in ("sinfo", "sbatch") if shutil.which(tool) is None]
    if missing:
        return f"no SLURM client ({', '.join(missing)}) on this machine"
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # else sinfo looks for a controller in DNS, for 20 s
        return f"SLURM_CONF={conf} is no file"
    return _answers("sinfo", "-h", "-o", "%P")


def accounting_problem() -> str | None:
    """Why SLURM's accounting (sacct) does not answer here (None: it does). The jobs run
    without it, and end as their results come back; but a job cancelled or killed without a
    result is only told apart from a running one by accounting."""
    if shutil.which("sacct") is None:
        return "no sacct on this machine"
    return _answers("sacct", "-n", "-X", "-j", "1")


def _answers(tool: str, *args: str) -> str | None:
    try:
        out = slurm_client(tool, *args)
    except subprocess.TimeoutExpired:
        return f"{tool} did not answer in 20 s"
    return _failed(tool, out) if out.returncode != 0 else None


def partition_limits() -> tuple[dict[str, float | None], str | None]:
    """The cluster's partitions and their time limits in minutes (None: none), and its default
    partition (sinfo's '*'; None where it has none)."""
    out = slurm_client("sinfo", "-h", "-o", "%P %l")
    limits: dict[str, float | None] = {}
    default = None
    for line in out.stdout.splitlines():
        name, limit = line.split()
        if name.endswith("*"):
            default = name.rstrip("*")
        limits.setdefault(name.rstrip("*"), slurm_minutes(limit))
    return limits, default


def slurm_minutes(text: str) -> float | None:
    """A time in one of SLURM's formats in minutes (None: infinite, unlimited).

    Raises:
        ValueError: not one of SLURM's time formats.
    """
    text = text.strip()
    if text.lower() in ("infinite", "unlimited"):
        return None
    found = _TIME.match(text)
    if found is None:
        raise ValueError(f"{text!r} is not a SLURM time")
    days, first, second, third = found.groups()
    parts = [int(p) for p in (first, second, third) if p is not None]
    if days is not None:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (*parts, 0, 0)[:3]
        return int(days) * 1440 + hours * 60 + minutes + seconds / 60
    if len(parts) == 3:  # hours:minutes:seconds
        return parts[0] * 60 + parts[1] + parts[2] / 60
    if len(parts) == 2:  # minutes:seconds
        return parts[0] + parts[1] / 60
    return float(parts[0])


def timeout_minutes(value: Any) -> int:
    """`hydra.launcher.timeout_min` as users give a time limit: whole minutes (90), or one of
    SLURM's time formats (1:30:00, 2-00:00:00); in whole minutes, seconds rounded up, as SLURM
    rounds them.

    Raises:
        UserError: neither, or under a minute.
    """
    minutes: float | None
    if isinstance(value, bool):
        minutes = None
    elif isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        minutes = value
    elif isinstance(value, str):
        try:
            minutes = slurm_minutes(value)
        except ValueError:
            minutes = None
    else:
        minutes = None
    if minutes is None or minutes < 1:
        raise UserError(
            f"hydra.launcher.timeout_min={value} is no time limit; give whole minutes (90) or "
            "a SLURM time (1:30:00, 2-00:00:00) of at least a minute"
        )
    return math.ceil(minutes)


def check_slurm_launcher(launcher: Mapping[str, Any], multirun: bool) -> None:
    """A SLURM launcher's settings, before anything is submitted.

    Raises:
        UserError: lipt's own launcher keys out of range, a time limit SLURM does not read or
            whose signal would come before the job starts, not a multirun (Hydra would run
            the job here, not on SLURM), no SLURM controller answers, or the
            partition does not exist or takes no job that long.
    """
    if launcher.get("_target_") == LIPT_LAUNCHER:  # Hydra's own submitit launcher has none
        for key, least in (("learners_per_task", 1), ("learner_retries", 0)):
            value = launcher.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise UserError(
                    f"hydra.launcher.{key}={value} must be a whole number of at least {least}"
                )
        poll = launcher.get("poll_s")
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or poll <= 0:
            raise UserError(f"hydra.launcher.poll_s={poll} must be a positive number of seconds")
    minutes = timeout_minutes(launcher.get("timeout_min"))
    delay = launcher.get("signal_delay_s")
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
        raise UserError(f"hydra.launcher.signal_delay_s={delay} must be a whole number of seconds")
    if delay + 60 >= minutes * 60:  # SLURM may send it up to a minute early
        raise UserError(
            f"hydra.launcher.signal_delay_s={delay} sends the time-limit signal before a job of "
            f"hydra.launcher.timeout_min={launcher.get('timeout_min')} starts (SLURM sends it up "
            "to a minute early: every attempt would be requeued at once); raise timeout_min or "
            "lower signal_delay_s"
        )
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
    unaccounted = accounting_problem()
    if unaccounted is not None:  # clusters without accounting run the jobs all the same
        logging.getLogger(__name__).warning(
            "warning: SLURM's accounting does not answer (%s): the jobs run, but one cancelled "
            "or killed without a result is not noticed, and the wait for it goes on until "
            "Ctrl-C",
            unaccounted,
        )
    check_partition(launcher, minutes)


def check_partition(launcher: Mapping[str, Any], minutes: int) -> None:
    """The partition (hydra.launcher.partition: a name, or several as SLURM takes them, a,b)
    exists, and one of them takes a job of `minutes`, which SLURM would keep pending for ever.
    Without one the job goes where sbatch sends it (SBATCH_PARTITION, additional_parameters'
    partition, else the cluster's default); a QOS may lift the partition's time limit, so
    with hydra.launcher.qos only the names are checked."""
    partition = launcher.get("partition")
    extra = launcher.get("additional_parameters") or {}
    limits, default = partition_limits()
    names = [p.strip() for p in str(partition).split(",") if p.strip()] if partition else []
    unknown = [name for name in names if name not in limits]
    if unknown:
        raise UserError(
            f"hydra.launcher.partition={partition}: {', '.join(unknown)} is not a partition of "
            f"this cluster; use one of {', '.join(limits) or '(none)'}"
        )
    elsewhere = os.environ.get("SBATCH_PARTITION") or extra.get("partition")
    if not names and (elsewhere or default is None):
        return  # sbatch's choice: SLURM's own words if it refuses
    chosen = names or [str(default)]
    longest = [limits[name] for name in chosen]
    if launcher.get("qos") is None and all(lim is not None and minutes > lim for lim in longest):
        limit = max(lim for lim in longest if lim is not None)
        which = f"partition {chosen[0]}" if len(chosen) == 1 else f"partitions {partition}"
        raise UserError(
            f"hydra.launcher.timeout_min={launcher.get('timeout_min')} is longer than {which} "
            f"allows ({limit:g} minutes): SLURM would keep the jobs pending for ever; give "
            f"hydra.launcher.timeout_min={math.floor(limit)} or less, or another "
            "hydra.launcher.partition"
        )
