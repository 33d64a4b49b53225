"""lipt against a real SLURM scheduler (`make slurm-up`: slurmctld, slurmd, slurmdbd and munged on
this machine, one node). No mock: every job here is submitted with sbatch by submitit and run by
slurmd; preemption is `scontrol requeue`, the time-limit signal is the one `--signal` names,
sent by SLURM (`scancel --signal`), and a cancelled job is `scancel`.

Each run on the cluster is compared with the same run here, without SLURM: bit for bit."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from lipt.run.slurm import slurm_problem
from tests.helpers import FAST, ROOT, finished, run_entry, start_entry

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
        args, capture_output=True, text=True, env={**os.environ, **env}, timeout=60
    )
    assert out.returncode == 0, f"{' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}"
    return out.stdout


def job_ids(env: dict[str, str]) -> set[str]:
    """Every job accounting knows of (array tasks by their own ids)."""
    return set(
        slurm(env, "sacct", "-n", "-X", "-P", "-a", "-S", "now-1days", "-o", "JobID").split()
    )


SUBMITTED: list[Any] = []


@pytest.fixture(autouse=True)
def nothing_left_running(slurm_env, tmp_path):
    """However a test ends, its submitting processes and its jobs end with it: a job left
    running would be the next test's "running job"."""
    yield
    for proc in SUBMITTED:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    SUBMITTED.clear()
    for job in jobs_under(slurm_env, tmp_path):
        subprocess.run(["scancel", job], env={**os.environ, **slurm_env}, check=False)


def submit(env: dict[str, str], script: str, args: list[str]) -> Any:
    """Start a sweep's submitting process in the background, as a user on a login node would
    (forked from a preloaded Python of its own, as the test runs the same run here meanwhile):
    a subprocess.Popen started with start_new_session, or what behaves as one."""
    proc = start_entry(script, args, env, slot="submitting", capture=True)
    SUBMITTED.append(proc)
    return proc


def finish(proc: Any, timeout: float = 400) -> tuple[int, str, str]:
    done = finished(proc, timeout)
    return done.returncode, done.stdout, done.stderr


def until(what: str, check: Callable[[], object], timeout: float = 120) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def jobs_under(env: dict[str, str], folder: Path, state: str = "all", name: str = "") -> list[str]:
    """Ids of the jobs whose batch script submitit wrote under `folder` (array tasks as
    <array>_<task>): a test's own jobs, not an earlier test's."""
    named = ["-n", name] if name else []
    out = slurm(env, "squeue", "-h", "-t", state, *named, "-o", "%i %o")
    return [
        job
        for job, script in (line.split(" ", 1) for line in out.splitlines())
        if script.startswith(f"{folder}/")
    ]


def running_jobs(env: dict[str, str], name: str, folder: Path) -> list[str]:
    """Ids of the running jobs called `name` that a test submitted into `folder`."""
    return jobs_under(env, folder, "RUNNING", name)


def job_pythons(env: dict[str, str], job: str) -> list[int]:
    """The PIDs of the Python processes that run SLURM job `job` (<array>_<task> or an id), once
    it has some."""
    raw = slurm(env, "squeue", "-h", "-j", job, "-o", "%A").split()[0]

    def pids() -> list[int]:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                environ = (proc / "environ").read_bytes().split(b"\0")
                cmdline = (proc / "cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if f"SLURM_JOB_ID={raw}".encode() in environ and b"submitit" in cmdline:
                found.append(int(proc.name))
        return found

    return until(f"job {job}'s Python", pids)  # type: ignore[return-value]


def kill_tasks_python(env: dict[str, str], job: str) -> None:
    """SIGKILL the Python process that runs SLURM job `job`."""
    for pid in job_pythons(env, job):
        # A process listed a moment ago may have ended since (submitit's short-lived helper):
        # there is nothing left of it to kill.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def frozen(pids: list[int]) -> Iterator[None]:
    """The processes stopped (SIGSTOP) meanwhile: what the test sees of a run (its last epoch)
    stays true while it acts, however fast this machine trains. Signals sent meanwhile wait."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


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
        (
            ["-m", "hydra/launcher=slurm", "hydra.launcher.learners_per_task=0"],
            {},
            ["hydra.launcher.learners_per_task=0", "at least 1"],
        ),
    ],
    ids=["no-multirun", "no-such-partition", "no-slurm", "no-learners-a-task"],
)
def test_bad_input_is_one_line_before_anything_is_submitted(
    slurm_env, tmp_path, args, env_extra, words
):
    before = job_ids(slurm_env)
    sweep = tmp_path / "sweep"
    flags = [a for a in args if a.startswith("-")]  # before the overrides, as Hydra reads them
    overrides = [a for a in args if not a.startswith("-")]
    out = run_entry(
        "train.py",
        [
            *flags,
            *FAST,
            *overrides,
            f"hydra.sweep.dir={sweep}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        env={**slurm_env, **env_extra},
        timeout=120,
    )
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith("error: ") and all(w in lines[0] for w in words), lines[0]
    assert not sweep.exists() and not (tmp_path / "run").exists()  # nothing half-written
    assert job_ids(slurm_env) == before  # nothing submitted


# --------------------------------------------------------------------------- the main job

# lipt's default pipeline (jigsaw learners, their soup scoring the pool, dynamic pruning), small.
MAIN = [
    "dataset=synthetic",
    "trainer.accelerator=cpu",
    "model.width=8",
    "batch_size=32",
    "trainer.max_epochs=2",
    "trainer.enable_progress_bar=false",
    "logger=none",
    "pretrain.num_learners=2",  # two array tasks: both at once on the 2-CPU node
    "pretrain.batches_per_learner=1",
    "pretrain.local_epochs=2",
    "pretrain.num_threads=1",
    "merge.ratios=5",
    "trainer=ddp",  # two ranks: Lightning's own launcher here, srun's two tasks on SLURM
]


@pytest.mark.slow
def test_main_job_learners_as_an_array_then_ddp_under_srun_as_run_here(slurm_env, tmp_path):
    """One command: the learners as a job array (one a task), the merge, dynamic pruning and
    DDP training as a job of two tasks (Lightning's SLURM environment), the same weights as
    `trainer=ddp` here, bit for bit. A learner task killed mid-way runs again, alone. Nothing
    trains, merges or scores on the submitting host: every record was written in a job."""
    sweep = tmp_path / "sweep"
    proc = submit(
        slurm_env,
        "train.py",
        [
            "-m",
            *MAIN,
            *SLURM,
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.learners_per_task=1",
            "hydra.launcher.tasks_per_node=2",
        ],
    )
    task = until("a learner task running", lambda: running_jobs(slurm_env, "lipt-learners", sweep))
    kill_tasks_python(slurm_env, task[0])  # it dies (a crash, the OOM killer): not cancelled
    here = run_entry("train.py", [*MAIN, f"hydra.run.dir={tmp_path / 'here'}"], timeout=300)
    assert here.returncode == 0, here.stderr[-3000:]
    code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    assert "jigsaw learners: 2 in 2 array tasks" in out
    assert "jigsaw learners again: 1 in 1 array tasks" in out  # the killed one alone

    run = sweep / "0"
    same_weights(tmp_path / "here" / "checkpoints" / "last.ckpt", run / "checkpoints" / "last.ckpt")
    assert summary(run)["test_accuracy"] == summary(tmp_path / "here")["test_accuracy"]
    main = summary(run)
    assert main["slurm"]["tasks"] == 2 and main["stages"]["pretrain"]["learners_merged"] == 2
    learner_jobs = sorted((run / "learners" / "jobs").glob("*/summary.json"))
    assert len(learner_jobs) == 2
    assert all(json.loads(p.read_text())["slurm"]["job"] for p in learner_jobs)


# --------------------------------------------------------------------------- preemption

# Main training alone (no pre-training), long enough to be interrupted twice mid-run.
MAX_EPOCHS = 20
LONG = [
    *FAST,
    "budget=full",
    "dataset.num_train=1000",
    f"trainer.max_epochs={MAX_EPOCHS}",
]


def last_epoch(run: Path) -> int:
    last = run / "checkpoints" / "last.ckpt"
    try:
        return int(torch.load(last, map_location="cpu", weights_only=False)["epoch"])
    except (OSError, EOFError, RuntimeError, KeyError):
        return -1


def restarts(env: dict[str, str], job: str) -> int:
    shown = slurm(env, "scontrol", "show", "job", job)
    return int(shown.split("Restarts=")[1].split()[0])


@pytest.mark.slow
def test_time_limit_signal_and_requeue_resume_in_the_same_folder_bit_for_bit(slurm_env, tmp_path):
    """Main training on SLURM, interrupted twice: the time-limit signal (the one `--signal`
    names, sent by SLURM) finishes the epoch in flight and the job requeues itself; later the
    scheduler requeues it mid-epoch (`scontrol requeue`, as preemption does). Each attempt
    resumes from the last checkpoint in the same folder; the run ends with the weights of an
    uninterrupted run here."""
    sweep = tmp_path / "sweep"
    proc = submit(slurm_env, "train.py", ["-m", *LONG, *SLURM, f"hydra.sweep.dir={sweep}"])
    run = sweep / "0"
    job = until("the job running", lambda: running_jobs(slurm_env, "train", sweep))[0]  # type: ignore[index]
    pythons = job_pythons(slurm_env, job)
    until("its first epoch's checkpoint", lambda: last_epoch(run) >= 0, timeout=180)
    with frozen(pythons):
        assert last_epoch(run) < MAX_EPOCHS - 2  # epochs left to requeue at
        slurm(slurm_env, "scancel", "--signal=USR2", job)  # the time limit is near
    until("the job requeued by itself", lambda: restarts(slurm_env, job) == 1, timeout=180)
    resumed_from = last_epoch(run)
    until("the resumed attempt training", lambda: last_epoch(run) > resumed_from, timeout=180)
    with frozen(job_pythons(slurm_env, job)):  # the resumed attempt's
        assert last_epoch(run) < MAX_EPOCHS - 1
        slurm(slurm_env, "scontrol", "requeue", job)  # preempted mid-run
    here = run_entry("train.py", [*LONG, f"hydra.run.dir={tmp_path / 'here'}"], timeout=300)
    assert here.returncode == 0, here.stderr[-3000:]
    code, _, err = finish(proc)
    assert code == 0, err[-3000:]

    assert [p.name for p in sweep.iterdir() if p.is_dir() and p.name[0] != "."] == ["0"]
    assert summary(run)["slurm"]["restarts"] == 2
    assert "requeueing SLURM job" in (run / "train.log").read_text()  # at an epoch's start
    same_weights(tmp_path / "here" / "checkpoints" / "last.ckpt", run / "checkpoints" / "last.ckpt")
    ran, reference = summary(run)["stages"]["train"], summary(tmp_path / "here")["stages"]["train"]
    assert ran["samples"] == reference["samples"]
    assert summary(run)["test_accuracy"] == summary(tmp_path / "here")["test_accuracy"]
    script = next((sweep / ".submitit").glob("*/*_submission.sh")).read_text()
    assert "#SBATCH --signal=USR2@120" in script


# --------------------------------------------------------------------------- the frontier


@pytest.mark.slow
def test_frontier_small_on_slurm_gives_the_local_sweeps_results_survives_a_requeue(
    slurm_env, tmp_path
):
    """frontier_small's reference and the whole pool's shorter schedule on SLURM, each job
    pinned to a core, one requeued mid-sweep: every row, with the weights and accuracies of the
    same sweep here (Hydra's basic launcher), bit for bit. Submitting the sweep again submits
    nothing, and `make report` draws it. (The learners' array inside a sweep: the main job's
    test.)"""
    narrow = ["+experiment=frontier_small", "+approach=full_schedule", "fraction=0.5"]
    on_slurm, on_here = tmp_path / "slurm", tmp_path / "here"
    cores = f"hydra.callbacks.pin.lock_dir={on_slurm / 'cores'}"
    args = ["-m", *narrow, cores, *SLURM, f"hydra.sweep.dir={on_slurm}"]
    proc = submit(slurm_env, "train.py", args)
    job = until(
        "a frontier job running", lambda: running_jobs(slurm_env, "train", on_slurm), timeout=180
    )
    slurm(slurm_env, "scontrol", "requeue", job[0])  # type: ignore[index]
    cores = f"hydra.callbacks.pin.lock_dir={on_here / 'cores'}"
    here = run_entry("train.py", ["-m", *narrow, cores, f"hydra.sweep.dir={on_here}"], timeout=600)
    assert here.returncode == 0, here.stderr[-3000:]
    code, _, err = finish(proc)
    assert code == 0, err[-3000:]

    rows = sorted(p.parent.name for p in on_here.glob("*/summary.json"))
    assert rows == ["+approach=full_data,seed=0", "+approach=full_schedule,fraction=0.5,seed=0"]
    assert sorted(p.parent.name for p in on_slurm.glob("*/summary.json")) == rows
    assert sum(summary(on_slurm / row)["slurm"]["restarts"] for row in rows) == 1
    for row in rows:
        assert summary(on_slurm / row)["test_accuracy"] == summary(on_here / row)["test_accuracy"]
        same_weights(
            on_slurm / row / "checkpoints" / "last.ckpt",
            on_here / row / "checkpoints" / "last.ckpt",
        )

    before = job_ids(slurm_env)
    again = run_entry("train.py", args, env=slurm_env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("finished already") == 2 and job_ids(slurm_env) == before
    report = subprocess.run(  # ARGS= : not the ARGS of a make that runs these tests
        ["make", "report", f"SWEEP={on_slurm}", "ARGS="], cwd=ROOT, capture_output=True, text=True
    )
    assert report.returncode == 0, report.stderr[-2000:]
    table = (on_slurm / "frontier.md").read_text()
    assert "| reference (whole pool, 2 epochs) | 1 | 1 |" in table
    assert "| full_schedule | 0.5 | 1 |" in table


@pytest.mark.slow
def test_a_cancelled_job_ends_the_wait_with_one_line_naming_it(slurm_env, tmp_path):
    proc = submit(slurm_env, "train.py", ["-m", *LONG, *SLURM, f"hydra.sweep.dir={tmp_path}"])
    job = until("the job running", lambda: running_jobs(slurm_env, "train", tmp_path), timeout=180)
    slurm(slurm_env, "scancel", job[0])  # type: ignore[index]
    code, _, err = finish(proc, timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert f"SLURM job {job[0]}" in lines[0] and "cancelled" in lines[0]  # type: ignore[index]


# --------------------------------------------------------------------------- a learner sweep


@pytest.mark.slow
def test_a_learner_sweeps_soup_is_merged_in_a_job_as_in_process(slurm_env, tmp_path, make_cfg):
    """`pretrain.py -m pretrain.learners=... hydra/callbacks=soup` on SLURM: the learners as
    array tasks (two a task), the merge as a job of its own; the soup of the in-process run."""
    from lipt.run.config import validate
    from lipt.stages.pretrain import run as pretrain_run
    from tests.test_jigsaw import FEW_RATIOS, JIGSAW, N

    sweep = tmp_path / "sweep"
    args = ["-m", *JIGSAW, FEW_RATIOS, "pretrain.learners=[0,1],[2,3]", "hydra/callbacks=soup"]
    proc = submit(slurm_env, "pretrain.py", [*args, *SLURM, f"hydra.sweep.dir={sweep}"])
    pretrain_run(validate(make_cfg([*JIGSAW, FEW_RATIOS], config_name="pretrain")))
    code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    assert "lipt-soup" in out  # the merge's own job
    assert "slurm" in summary(sweep)
    same_weights(tmp_path / "pretrain.ckpt", sweep / "pretrain.ckpt")  # bit for bit
    for i in range(N):
        learner = Path("learners") / f"learner_{i}.ckpt"
        same_weights(tmp_path / learner, sweep / learner)
