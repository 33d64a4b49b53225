"""Main training inside a SLURM job: the time-limit signal requeues the job once what it would
lose is on disk, and never after the run's results are.

SLURM sends the signal of `--signal=USR2@<seconds>` (submitit's `signal_delay_s`) that long
before a job's time limit. Left to submitit, the job requeues at once and the epoch in flight is
lost; left to the default action, the process ends. `RequeueOnSignal` answers it by where the
run is:

- **Main training**: the signal is noted; training goes on to the end of the epoch, whose
  checkpoint (checkpoints/last.ckpt) the requeued attempt resumes from, and the job is requeued
  at the start of the next epoch, or at the end of the fit where that epoch was the last.
- **After main training** (a resumed fit's validation, the test pass): the job is requeued at
  once. All training made is in checkpoints/last.ckpt; the requeued attempt finds the fit
  finished, validates the weights once, tests them and writes summary.json
  (lipt.stages.train.fit_and_test). Testing on would race the time limit, which kills the job
  without requeueing it.
- **After the test pass** (summary.json, the loggers, the end of the process): the signal is
  only logged. What is left takes seconds, and a finished job requeued would only find its
  summary.json.

An attempt that trained no epoch of its own (a requeued one that found the fit finished) never
requeues: its requeued attempt would start where it did, and a job that met the signal there
each time would requeue for ever. The job is requeued through submitit's own handler when
submitit runs the job (it re-submits the same Hydra job and counts the timeouts), else with
`scontrol requeue`. A resumed run ends bit for bit where an uninterrupted one ends
(tests/test_slurm.py). Lightning's own SLURM requeue listens to SIGUSR1, a different signal, so
the two never both act.
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


# Where the run is, as the signal handler acts on it (the module docstring).
TRAINING, TRAINED, TESTED = "training", "trained", "tested"


class RequeueOnSignal(L.Callback):
    """Handles the time-limit signal from the moment it is made (before data loading and
    selection, so an early signal is not lost) to the end of the process, by where the run is
    (the module docstring). A callback of main training's Trainer, whose hooks tell where: the
    same Trainer validates a resumed fit and tests."""

    def __init__(self) -> None:
        self.signum = preemption_signal()
        self.caught = False
        self.first_epoch: int | None = None  # this attempt's first epoch (None: none trained)
        self.phase = TRAINING
        self.rank = 0
        current = signal.getsignal(self.signum)
        # An earlier run in this process left its own: requeue through the one it had found.
        earlier = getattr(current, "__self__", None)
        self.previous: Any = earlier.previous if isinstance(earlier, RequeueOnSignal) else current
        signal.signal(self.signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.phase == TESTED:
            log.warning("caught %s after the test pass: the run is ending, not requeued", name)
            return
        if self.phase == TRAINED and self.first_epoch is not None:
            log.warning(
                "caught %s after main training: requeueing SLURM job %s now; the next attempt "
                "tests checkpoints/last.ckpt",
                name,
                _job_id(),
            )
            if self.rank == 0:  # rank 0 requeues the job, which ends every task
                self.requeue()
            return
        self.caught = True
        if self.phase == TRAINED:  # resumed with the fit finished: requeueing gains nothing
            log.warning(
                "caught %s (the job's time limit is near): not requeued, this attempt trained "
                "no epoch; testing on",
                name,
            )
            return
        log.warning(
            "caught %s (the job's time limit is near): requeueing after this epoch's checkpoint",
            name,
        )

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.rank = trainer.global_rank

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.first_epoch is None:  # this attempt's first epoch: nothing of it saved yet
            self.first_epoch = trainer.current_epoch
            return
        self._requeue_if_caught(trainer, f"epoch {trainer.current_epoch - 1}'s checkpoint")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The last epoch's checkpoint is written. From now on a signal requeues at once; one
        # caught during the last epoch requeues now (the test pass runs in the next attempt).
        self.phase = TRAINED
        if self.first_epoch is not None:
            self._requeue_if_caught(trainer, "the last epoch's checkpoint")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Called after every stage (fit, a resumed fit's validation, test): a fit resumed after
        # its last epoch, with nothing left to run, ends here without on_train_end. The handler
        # stays installed to the end of the process.
        if stage == "fit" and self.phase == TRAINING:
            self.phase = TRAINED

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The test pass is over: summary.json comes next. A signal from now on is only logged,
        # neither left to the default action (the process would end before summary.json is
        # written) nor to submitit's handler (a finished job requeued).
        self.phase = TESTED

    def _requeue_if_caught(self, trainer: L.Trainer, where: str) -> None:
        # Any rank's signal stops every rank at the same point.
        if not trainer.strategy.reduce_boolean_decision(self.caught, all=False):
            return
        log.warning("requeueing SLURM job %s from %s", _job_id(), where)
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


def _job_id() -> str:
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]
