"""Main training inside a SLURM job: the time-limit signal ends the attempt at an epoch's end.

SLURM sends the signal of `--signal=USR2@<seconds>` (submitit's `signal_delay_s`) that long
before a job's time limit. Left to submitit, the job requeues at once and the epoch in flight is
lost. `RequeueOnSignal` only notes the signal; training goes on to the end of the epoch, whose
checkpoint (checkpoints/last.ckpt) the requeued attempt resumes from, and then the job is
requeued: through submitit's own handler when submitit runs the job (it re-submits the same
Hydra job and counts the timeouts), else with `scontrol requeue`. A resumed run ends bit for bit
where an uninterrupted one ends (tests/test_slurm.py). Lightning's own SLURM requeue listens to
SIGUSR1, a different signal, so the two never both act.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Any

import lightning as L

log = logging.getLogger(__name__)


def in_slurm_job() -> bool:
    """Whether this process is a task of a SLURM batch or array job."""
    return "SLURM_JOB_ID" in os.environ and os.environ.get("SLURM_JOB_NAME") not in (
        "bash",
        "interactive",
    )


def restarted_by_slurm() -> bool:
    """Whether this is a requeued attempt of a SLURM job (SLURM counts its restarts)."""
    return in_slurm_job() and int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0


def preemption_signal() -> signal.Signals:
    """The signal SLURM sends before the time limit: submitit's (USR2 unless
    SUBMITIT_PREEMPT_SIGNAL says otherwise)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    return signal.Signals[f"SIG{name}"]


class RequeueOnSignal(L.Callback):
    """Notes the time-limit signal from the moment it is made (before data loading and
    selection, so an early signal is not lost) and requeues the job at the start of the next
    epoch, once the last one's checkpoint is written."""

    def __init__(self) -> None:
        self.signum = preemption_signal()
        self.caught = False
        self.previous = signal.signal(self.signum, self._note)
        self.first_epoch: int | None = None

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.caught = True
        log.warning(
            "caught %s (the job's time limit is near): requeueing after this epoch's checkpoint",
            signal.Signals(signum).name,
        )

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.first_epoch is None:  # this attempt's first epoch: nothing of it saved yet
            self.first_epoch = trainer.current_epoch
            return
        # Any rank's signal stops every rank at the same epoch.
        if not trainer.strategy.reduce_boolean_decision(self.caught, all=False):
            return
        log.warning(
            "requeueing SLURM job %s from epoch %d's checkpoint", _job_id(), trainer.current_epoch
        )
        if trainer.global_rank != 0:
            time.sleep(120)  # rank 0 requeues the job, which ends every task
            sys.exit(1)
        self.requeue()

    def requeue(self) -> None:
        previous: Any = self.previous
        if callable(previous):  # submitit's handler: re-submits the job and exits
            previous(self.signum, None)
        subprocess.run(["scontrol", "requeue", _job_id()], check=True, timeout=60)
        sys.exit(0)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        signal.signal(self.signum, self.previous)


def _job_id() -> str:
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]
