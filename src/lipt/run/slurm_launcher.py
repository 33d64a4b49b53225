"""`hydra/launcher=slurm` (hydra_plugins.lipt_slurm): Hydra's submitit launcher, with what a lipt
sweep needs on a cluster.

On top of hydra-submitit-launcher's SlurmLauncher (every job of the multirun a task of one
SLURM job array), it

- resolves `hydra.sweep.dir` once, when the sweep is submitted: a `${now:}` in it would
  otherwise resolve again in every job and in every requeued attempt, each writing elsewhere;
- skips the jobs that finished (`ckpt_path=last` and a summary.json in their folder): submitting
  a sweep again runs only what is left, without a job for each finished one;
- runs the jigsaw learners of every job that pre-trains as a job array of their own first
  (`learners_per_task` learners a task), then the jobs themselves, which merge the learners'
  checkpoints from their folder: no training, merging or scoring runs on the submitting host;
- waits on the jobs itself: a learner task that dies is submitted again (`learner_retries`),
  only for the learners it did not write, and a job that is cancelled or fails, that sbatch
  refuses or that SLURM would keep pending for ever ends the sweep with one line that names it
  (exit 2), never a hang.

A job requeued by SLURM (preemption, `scontrol requeue`, or the time-limit signal that
lipt.core.requeue answers) runs again from the same pickled submission, in the same folder,
and resumes from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol, cast

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import DictConfig, OmegaConf, open_dict

from lipt.core.errors import UserError, fail, one_line
from lipt.run.slurm import timeout_minutes
from lipt.run.slurm_learners import (
    LearnerGroup,
    LearnerTask,
    groups_of,
    learners_folder,
    missing_learners,
    uses_jigsaw_learners,
)
from lipt.run.slurm_pending import never_starting

log = logging.getLogger(__name__)

# The launcher's own keys (configs/hydra/launcher/slurm.yaml); the rest go to submitit.
OWN_KEYS = ("learner_array", "learners_per_task", "learner_retries", "poll_s")
# How to go on after a job was cancelled (a sweep's own: resubmission).
AGAIN = "submit the same command again to go on from what finished"


class SlurmSweepLauncher(Protocol):
    """What `launch` reads of hydra_plugins.lipt_slurm's SlurmSweepLauncher (Hydra's submitit
    launcher: its config, context and submitit keys; and lipt's own keys)."""

    config: DictConfig | None
    hydra_context: Any
    params: dict[str, Any]
    learner_array: bool
    learners_per_task: int
    learner_retries: int
    poll_s: float


@dataclass
class SweepJob:
    """One job of the multirun: its number, overrides, folder and resolved config."""

    num: int
    overrides: list[str]
    run_dir: Path
    config: dict[str, Any]  # resolved, without `hydra`
    task_config: DictConfig  # as Hydra's job sees it (for a skipped job's JobReturn)

    @property
    def label(self) -> str:
        return " ".join(filter_overrides(self.overrides)) or f"job {self.num}"


def launch(
    launcher: SlurmSweepLauncher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> list[JobReturn]:
    """The sweep's jobs on SLURM: finished ones skipped, learners first, then the jobs."""
    assert launcher.config is not None
    # The launcher's keys were checked before Hydra started (lipt.run.slurm).
    assert launcher.learners_per_task >= 1 and launcher.learner_retries >= 0
    try:
        with open_dict(launcher.config):  # one folder for the submitter, jobs and requeues
            launcher.config.hydra.sweep.dir = str(launcher.config.hydra.sweep.dir)
        jobs = [
            sweep_job(launcher, initial_job_idx + k, list(overrides))
            for k, overrides in enumerate(job_overrides)
        ]
        again = resubmission(str(launcher.config.hydra.sweep.dir), jobs)
        returns: dict[int, JobReturn] = {}
        for job in jobs:
            finished = _finished(job)
            if finished is not None:
                log.info("#%d %s: finished already (%s)", job.num, job.label, job.run_dir)
                returns[job.num] = finished
        todo = [job for job in jobs if job.num not in returns]
        if todo and launcher.learner_array:
            train_learners(launcher, todo, again)
        if todo:
            returns.update(run_jobs(launcher, todo, again))
    except UserError as e:
        _fail(e)
    return [returns[job.num] for job in jobs]


def resubmission(sweep_dir: str, jobs: list[SweepJob]) -> str:
    """How to go on from what a sweep ended with: the same command in the same folder (a
    `${now:}` in hydra.sweep.dir would make it a new one)."""
    fix = f"submit the same command again with hydra.sweep.dir={sweep_dir}"
    if all(job.config.get("ckpt_path") == "last" for job in jobs):
        return f"{fix} to go on from what finished"
    return (
        f"{fix} to keep the learners written (and ckpt_path=last to keep the jobs that "
        "finished and resume main training)"
    )


def sweep_job(launcher: SlurmSweepLauncher, num: int, overrides: list[str]) -> SweepJob:
    """The job's config as Hydra's run_job will compose it, and the folder it will run in."""
    assert launcher.hydra_context is not None and launcher.config is not None
    loader = launcher.hydra_context.config_loader
    sweep_config = loader.load_sweep_config(launcher.config, overrides)
    with open_dict(sweep_config.hydra.job):
        sweep_config.hydra.job.num = num
        sweep_config.hydra.job.id = f"job_id_for_{num}"
    HydraConfig.instance().set_config(sweep_config)  # so that ${hydra:...} resolves
    run_dir = Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
    task = copy.deepcopy(sweep_config)
    with open_dict(task):
        del task["hydra"]
        task.paths.output_dir = str(run_dir)
    config = cast(dict[str, Any], OmegaConf.to_container(task, resolve=True))
    return SweepJob(num, overrides, run_dir, config, sweep_config)


def executor_for(params: dict[str, Any], name: str, tasks_per_node: int | None = None) -> Any:
    """A submitit executor with a SLURM launcher's settings (`params`: the launcher's keys, as
    Hydra's launch hands them to submitit), for jobs called `name`."""
    import submitit

    params = {k: v for k, v in params.items() if k not in (*OWN_KEYS, "_target_")}
    executor = submitit.AutoExecutor(
        cluster="slurm",
        folder=str(params.pop("submitit_folder")),
        slurm_max_num_timeout=params.pop("max_num_timeout", 0),
    )
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    params = {k if k in base else f"slurm_{k}": v for k, v in params.items()}
    params["name"] = name
    if "timeout_min" in params:  # as users give it (1:30:00): checked before the sweep began
        params["timeout_min"] = timeout_minutes(params["timeout_min"])
    if tasks_per_node is not None:
        params["tasks_per_node"] = tasks_per_node
    executor.update_parameters(**params)
    return executor


def submitted_by(name: str, submit: Any, *args: Any) -> Any:
    """`submit(*args)` (an executor's submit or map_array); sbatch's refusal (resources the
    cluster does not have: mem_gb, cpus_per_task, gpus_per_node...) as one line.

    Raises:
        UserError: sbatch refused the jobs, or is not there.
    """
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's errors too
            return submit(*args)
    except (FailedJobError, FailedSubmissionError, OSError) as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        errors = [line.removeprefix("sbatch: error: ") for line in lines if "error" in line]
        said = "; ".join(errors or lines[-1:]) or type(e).__name__
        raise UserError(
            f"sbatch refused the {name} jobs ({said}); fit hydra.launcher's settings "
            "(partition, timeout_min, nodes, tasks_per_node, cpus_per_task, mem_gb, gres...) "
            "to the cluster (scontrol show partition)"
        ) from e


def run_as_job(launcher: DictConfig, name: str, function: Any, *args: Any) -> Any:
    """`function(*args)` as one SLURM job with the `hydra.launcher` settings of a sweep (what
    the sweep's host would otherwise compute itself: the soup callback's merge), and its result.

    Raises:
        UserError: the job was cancelled or failed (one line naming it).
    """
    params = cast(dict[str, Any], OmegaConf.to_container(launcher, resolve=True))
    executor = executor_for(params, name, tasks_per_node=1)
    job = submitted_by(name, executor.submit, function, *args)
    log.info("SLURM job %s: %s", job.job_id, name)
    return wait([job], [name], float(params.get("poll_s", 10.0)))[0]


def train_learners(launcher: SlurmSweepLauncher, jobs: list[SweepJob], again: str = AGAIN) -> None:
    """Every job's missing jigsaw learners as one job array, `learners_per_task` a task;
    tasks that died are submitted again, for the learners they did not write."""
    counts = {job.num: uses_jigsaw_learners(job.config) for job in jobs}
    wanted = [job for job in jobs if counts[job.num] > 0]

    def pending() -> list[LearnerGroup]:
        return [
            LearnerGroup(job.run_dir, ids, job.config)
            for job in wanted
            for ids in groups_of(
                missing_learners(learners_folder(job.run_dir, job.config), counts[job.num]),
                launcher.learners_per_task,
            )
        ]

    groups = pending()
    for attempt in range(1 + launcher.learner_retries):
        if not groups:
            return
        learners = sum(len(g.ids) for g in groups)
        again = " again" if attempt else ""
        log.info(
            "jigsaw learners%s: %d in %d array tasks for %d jobs",
            again,
            learners,
            len(groups),
            len(wanted),
        )
        executor = executor_for(launcher.params, "lipt-learners", tasks_per_node=1)
        name = "lipt-learners"
        submitted = submitted_by(name, executor.map_array, LearnerTask(), groups)
        labels = [f"learners {g.ids} of {g.run_dir}" for g in groups]
        wait(submitted, labels, launcher.poll_s, failed_ok=True, again=again)
        groups = pending()
    if groups:
        first = groups[0]
        raise UserError(
            f"jigsaw learners {first.ids} of {first.run_dir} were not written after "
            f"{1 + launcher.learner_retries} attempts; see {first.job_dir} and the sweep's "
            ".submitit/ logs"
        )


def run_jobs(
    launcher: SlurmSweepLauncher, jobs: list[SweepJob], again: str = AGAIN
) -> dict[int, JobReturn]:
    """The jobs themselves, as one array (Hydra's own __call__ runs each)."""
    from hydra.core.singleton import Singleton

    name = str(launcher.params.get("name") or "lipt")
    executor = executor_for(launcher.params, name)
    for job in jobs:
        log.info("\t#%d : %s", job.num, job.label)
    state = Singleton.get_state()
    params = [
        (job.overrides, "hydra.sweep.dir", job.num, f"job_id_for_{job.num}", state) for job in jobs
    ]
    submitted = submitted_by(name, executor.map_array, launcher, *zip(*params, strict=True))
    labels = [f"#{job.num} {job.label}" for job in jobs]
    results = wait(submitted, labels, launcher.poll_s, again=again)
    return {job.num: result for job, result in zip(jobs, results, strict=True)}


def wait(
    submitted: list[Any],
    labels: list[str],
    poll_s: float,
    failed_ok: bool = False,
    again: str = AGAIN,
) -> list[Any]:
    """Each job's result, polling SLURM's accounting (sacct) every `poll_s` seconds at most.
    `again`: how to go on after a job was cancelled (lipt.run.slurm_launcher.resubmission).

    Raises:
        UserError: a job was cancelled, SLURM will never start one, or (unless `failed_ok`)
            one ended without a result.
    """
    start = time.monotonic()
    while True:
        waiting = [job for job in submitted if not job.done()]
        if not waiting:
            break
        never = never_starting(waiting)
        if never is not None:
            job, reason = never
            stuck = [j.job_id for j in waiting]
            subprocess.run(["scancel", *stuck], capture_output=True, check=False, timeout=60)
            label = labels[submitted.index(job)]
            others = f" and the {len(stuck) - 1} unfinished beside it" if len(stuck) > 1 else ""
            raise UserError(
                f"SLURM will never start job {job.job_id} ({label}): {reason}; cancelled it{others}"
            )
        elapsed = time.monotonic() - start
        time.sleep(min(poll_s, 1.0 + elapsed / 10))  # quick at first, then gentler
        submitted[0].done(force_check=True)  # one sacct call for all of them
    results = []
    for job, label in zip(submitted, labels, strict=True):
        if job.paths.result_pickle.exists():
            outcome, value = _result(job)
            if outcome == "success":
                results.append(value)
                continue
            if not failed_ok:
                raise UserError(f"SLURM job {job.job_id} ({label}) failed: {_last_line(value)}")
            log.warning("SLURM job %s (%s) failed: %s", job.job_id, label, _last_line(value))
            results.append(None)
            continue
        state = str(job.watcher.get_state(job.job_id, mode="force"))
        if state.startswith("CANCELLED"):
            raise UserError(f"SLURM job {job.job_id} ({label}) was cancelled ({state}); {again}")
        if not failed_ok:
            raise UserError(
                f"SLURM job {job.job_id} ({label}) ended {state} without a result: "
                f"{_last_line(job.stderr() or '')} (log: {job.paths.stderr})"
            )
        log.warning("SLURM job %s (%s) ended %s", job.job_id, label, state)
        results.append(None)
    return results


def _result(job: Any) -> tuple[str, Any]:
    from submitit.core import utils

    outcome, value = utils.pickle_load(job.paths.result_pickle)
    return str(outcome), value


def _last_line(text: Any) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else "no error output"


def _finished(job: SweepJob) -> JobReturn | None:
    """A finished job's return, from its summary.json (None: it has still to run)."""
    import json

    summary = job.run_dir / "summary.json"
    if job.config.get("ckpt_path") != "last" or not summary.is_file():
        return None
    from lipt.run.cli import task_result

    task_config = copy.deepcopy(job.task_config)
    hydra_config = task_config.hydra
    with open_dict(task_config):
        del task_config["hydra"]
    value = task_result(task_config, json.loads(summary.read_text()))
    return JobReturn(
        overrides=job.overrides,
        cfg=task_config,
        hydra_cfg=hydra_config,
        working_dir=str(job.run_dir),
        task_name=str(hydra_config.job.name),
        status=JobStatus.COMPLETED,
        _return_value=value,
    )


def _fail(error: UserError) -> NoReturn:
    fail(one_line(error))
