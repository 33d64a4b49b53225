"""lipt against a real SLURM scheduler (`make slurm-up`: slurmctld, slurmd, slurmdbd and munged on
this machine, one node). No mock: every job here is submitted with sbatch (by submitit, or as a
user's batch script) and run by slurmd; preemption is `scontrol requeue`, the time-limit signal
is the one `--signal` names, sent by SLURM (`scancel --signal`), and a cancelled job is
`scancel`. One test drives the time-limit signal's handler in this process instead, on a real
Trainer: the signal from os.kill, submitit's handler stood in for.

Each run on the cluster is compared with the same run here, without SLURM: bit for bit."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hydra.experimental.callback import Callback as HydraCallback
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from lipt.core.errors import UserError
from lipt.core.requeue import RequeueOnSignal
from lipt.run.slurm import LIPT_LAUNCHER, slurm_problem
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


# A partition of the test cluster with a time limit (30 minutes), made for the tests that ask
# for one: jobs of the launcher's default 60 minutes would wait there for ever.
SHORT = "lipt-short"


@pytest.fixture(scope="module")
def short_partition(slurm_env) -> Iterator[str]:
    env = {**os.environ, **slurm_env}
    delete = ["scontrol", "delete", f"PartitionName={SHORT}"]
    subprocess.run(delete, env=env, capture_output=True, check=False)  # an earlier run's
    slurm(slurm_env, "scontrol", "create", f"PartitionName={SHORT}", "Nodes=ALL", "MaxTime=30")
    yield SHORT
    subprocess.run(delete, env=env, capture_output=True, check=False)


@pytest.fixture(scope="module")
def no_accounting(slurm_env, tmp_path_factory) -> str:
    """A SLURM_CONF whose controller answers, but not its accounting (slurmdbd's port closed):
    sinfo works, sacct fails, as with slurmdbd down."""
    conf = Path(slurm_env.get("SLURM_CONF") or os.environ["SLURM_CONF"])
    lines = [
        "AccountingStoragePort=1" if line.startswith("AccountingStoragePort=") else line
        for line in conf.read_text().splitlines()
    ]
    copy = tmp_path_factory.mktemp("no_accounting") / "slurm.conf"
    copy.write_text("\n".join(lines) + "\n")
    return str(copy)


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
    return until(f"job {job}'s Python", lambda: job_processes(raw, b"submitit"))  # type: ignore[return-value]


def job_processes(raw: str, command: bytes) -> list[int]:
    """The PIDs of the processes of SLURM job `raw` (its own id, not <array>_<task>) whose command
    line has `command` (submitit's runner, or the entry script a batch script starts)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if f"SLURM_JOB_ID={raw}".encode() in environ and command in cmdline:
            found.append(int(proc.name))
    return found


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
        (
            ["-m", "hydra/launcher=slurm", "paths.output_dir=/tmp/elsewhere"],
            {},
            ["paths.output_dir=/tmp/elsewhere is ignored", "hydra.sweep.dir="],
        ),
        (  # SLURM's minutes are whole
            ["-m", "hydra/launcher=slurm", "hydra.launcher.timeout_min=1.5"],
            {},
            ["hydra.launcher.timeout_min=1.5 is no time limit", "1:30:00"],
        ),
        (  # the signal would be due as the job starts: every attempt requeued at once
            ["-m", "hydra/launcher=slurm", "hydra.launcher.timeout_min=2"],
            {},
            ["signal_delay_s=120", "before a job of hydra.launcher.timeout_min=2 starts"],
        ),
        (  # the default 60 minutes on a partition of 30: pending for ever
            ["-m", "hydra/launcher=slurm", f"hydra.launcher.partition={SHORT}"],
            {},
            [f"longer than partition {SHORT} allows (30 minutes)", "timeout_min=30 or less"],
        ),
        (  # a login node without SLURM's clients
            ["-m", "hydra/launcher=slurm"],
            {"PATH": "/nonexistent"},
            ["no SLURM client (sinfo, sbatch) on this machine"],
        ),
        (  # SLURM gives a job only the GPUs it asks for: each would fail on its node
            ["-m", "hydra/launcher=slurm", "trainer.accelerator=gpu"],
            {},
            ["trainer.accelerator=gpu on SLURM jobs that ask for no GPU", "gpus_per_node=1"],
        ),
    ],
    ids=[
        "no-multirun",
        "no-such-partition",
        "no-slurm",
        "no-learners-a-task",
        "output-dir",
        "time-limit-format",
        "signal-before-start",
        "partition-time-limit",
        "no-clients",
        "gpu-jobs-without-gpus",
    ],
)
def test_bad_input_is_one_line_before_anything_is_submitted(
    slurm_env, short_partition, tmp_path, args, env_extra, words
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


def test_time_limits_partitions_and_hydras_own_launcher_as_users_give_them(
    slurm_env, short_partition, tmp_path
):
    """A time limit in SLURM's own formats, partitions as SLURM takes them (a,b: the job starts
    in either), and Hydra's plain submitit launcher (none of lipt's own keys) pass the checks;
    the time limit reaches sbatch in minutes."""
    from lipt.run.slurm_launcher import executor_for

    for args in (
        ["hydra/launcher=slurm", "hydra.launcher.timeout_min=0:30:00"],
        ["hydra/launcher=slurm", f"hydra.launcher.partition='{SHORT},debug'"],
        ["hydra/launcher=submitit_slurm", "hydra.launcher.timeout_min=90"],
    ):
        sweep = tmp_path / "sweep"
        overrides = [*FAST, *args, "dry_run=true", f"hydra.sweep.dir={sweep}"]
        out = run_entry("train.py", ["-m", *overrides], env=slurm_env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "dry run: 1 job composed, checked and built" in out.stdout, args
    params = {"submitit_folder": str(tmp_path / "%j"), "timeout_min": "1-02:00:30"}
    executor = executor_for(params, "train")
    assert executor._executor.parameters["time"] == 1561  # 26 hours, 31 minutes (rounded up)


def test_gpu_jobs_are_checked_for_the_nodes_not_the_login_node(slurm_env, tmp_path):
    """A login node has no GPU, so trainer=gpu was refused there ("No supported gpu backend
    found") and no GPU job could be submitted. The Trainer's other settings are still checked
    there, on the CPU; the jobs ask SLURM for their GPUs, which this cluster has none of."""
    cpu_free = [o for o in FAST if not o.startswith("trainer.accelerator=")]
    gpu = ["-m", "hydra/launcher=slurm", "trainer=gpu", "hydra.launcher.gpus_per_node=1"]
    for extra, words in (
        ([], ["sbatch refused the train jobs", "gres"]),
        (["trainer.strategy=sideways"], ["trainer settings are invalid", "sideways"]),
    ):
        sweep = tmp_path / f"sweep{len(extra)}"
        out = run_entry(
            "train.py",
            [*gpu, *cpu_free, *extra, f"hydra.sweep.dir={sweep}"],
            env=slurm_env,
            timeout=120,
        )
        line = out.stderr.strip().splitlines()[-1]
        assert out.returncode == 2 and all(w in line for w in words), out.stderr[-2000:]


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("hydra.launcher.mem_gb=100000", ["sbatch refused the train jobs (Memory", "mem_gb"]),
        ("hydra.launcher.nodes=2", ["SLURM will never start job", "nodes", "cancelled it"]),
        ("hydra.launcher.cpus_per_task=4", ["never start job", "PartitionConfig", "CPUs"]),
    ],
    ids=["sbatch-refuses", "never-starts", "never-starts-cpus"],
)
def test_jobs_the_cluster_refuses_or_never_starts_end_in_one_line(
    slurm_env, tmp_path, setting, words
):
    """More than the one node has: sbatch refuses the job, or takes it and would keep it
    pending for ever (2 nodes of 1). The submitting command ends with one line either way,
    and leaves no job waiting."""
    sweep = tmp_path / "sweep"
    args = ["-m", *FAST, *SLURM, setting, f"hydra.sweep.dir={sweep}"]
    out = run_entry("train.py", args, env=slurm_env, timeout=120)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith("error: ") and all(w in lines[0] for w in words), lines[0]
    assert not jobs_under(slurm_env, sweep, "PENDING,RUNNING")


# A lipt launcher's settings that check_slurm_launcher reads (configs/hydra/launcher/slurm.yaml).
LAUNCHER_CHECKED = {
    "_target_": LIPT_LAUNCHER,
    "learners_per_task": 1,
    "learner_retries": 0,
    "poll_s": 1,
    "timeout_min": 60,
    "signal_delay_s": 120,
    "partition": None,
}


def test_a_partition_sbatch_chooses_is_left_to_sbatch(slurm_env, short_partition, monkeypatch):
    """Without hydra.launcher.partition the job goes where sbatch sends it: SBATCH_PARTITION or
    additional_parameters' partition, else the default; only the default's time limit is
    checked before, and none with a QOS (which may lift it)."""
    from lipt.run.slurm import check_slurm_launcher

    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)
    launcher = dict(LAUNCHER_CHECKED)
    check_slurm_launcher(launcher, multirun=True)  # the default partition has no limit
    with pytest.raises(UserError, match=f"longer than partition {SHORT} allows"):
        check_slurm_launcher({**launcher, "partition": SHORT}, multirun=True)
    check_slurm_launcher({**launcher, "partition": SHORT, "qos": "long"}, multirun=True)
    monkeypatch.setenv("SBATCH_PARTITION", SHORT)
    check_slurm_launcher(launcher, multirun=True)


def test_a_cluster_without_accounting_runs_the_jobs_with_a_warning(
    slurm_env, no_accounting, caplog
):
    """Accounting (sacct) that does not answer is no reason to refuse a cluster (many run
    without it): the checks pass, with a warning that a cancelled job would go unnoticed."""
    from lipt.run.slurm import check_slurm_launcher

    launcher = dict(LAUNCHER_CHECKED)
    with pytest.MonkeyPatch.context() as env:
        for key, value in {**slurm_env, "SLURM_CONF": no_accounting}.items():
            env.setenv(key, value)
        with caplog.at_level(logging.WARNING, logger="lipt.run.slurm"):
            check_slurm_launcher(launcher, multirun=True)
    assert "SLURM's accounting does not answer (sacct failed" in caplog.text
    assert "not noticed" in caplog.text


def test_the_benchmark_without_a_cluster_says_why_in_one_line(slurm_env, no_accounting):
    """benchmarks/slurm_jigsaw.py where SLURM's clients are missing, or accounting is down."""
    for env in ({"PATH": "/nonexistent"}, {"SLURM_CONF": no_accounting}):
        out = subprocess.run(
            [sys.executable, "benchmarks/slurm_jigsaw.py", "--per-task", "5"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, **slurm_env, **env},
            timeout=120,
        )
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 1 and len(lines) == 1, out.stderr[-2000:]
        assert lines[0].startswith("error: no SLURM cluster answers ("), lines[0]


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


# Main training as a batch script runs it without submitit (`srun python train.py`), with two
# breakpoints: its test pass's start (main training over), and the job's end (summary.json
# written). Each stops the process (SIGSTOP) until the test, which signals it there, continues it.
AFTER_TRAINING = [
    *FAST,
    "budget=full",
    "trainer.max_epochs=2",
]
BREAKPOINTS = [
    "+callbacks.stop_at_test._target_=tests.test_slurm.StopAtTestStart",
    "+hydra.callbacks.stop_at_end._target_=tests.test_slurm.StopAtJobEnd",
]


class StopAtTestStart(L.Callback):
    """A breakpoint: the process stops itself as its test pass starts."""

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        os.kill(os.getpid(), signal.SIGSTOP)


class StopAtJobEnd(HydraCallback):
    """A breakpoint: the process stops itself once the run returned (summary.json written)."""

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGSTOP)


def sbatch(env: dict[str, str], folder: Path, command: list[str]) -> str:
    """Submit `command` as a user's batch script would run it (`srun`, a job step: what
    `--signal` and `scancel --signal` reach), with its script and output in `folder`; its id."""
    script = folder / "job.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --time=10\n#SBATCH --signal=USR2@120\n"
        f"export PYTHONUNBUFFERED=1\nsrun {shlex.join(command)}\n"
    )
    out = slurm(
        env, "sbatch", "--parsable", "-J", "train", "-o", str(folder / "slurm-%j.out"),
        f"--chdir={ROOT}", str(script),
    )  # fmt: skip
    return out.strip().split(";")[0]


def job_state(env: dict[str, str], job: str) -> tuple[str, int]:
    """The job's state as the controller has it (RUNNING, PENDING, COMPLETED, FAILED...) and its
    restarts."""
    shown = slurm(env, "scontrol", "show", "job", job)
    return shown.split("JobState=")[1].split()[0], int(shown.split("Restarts=")[1].split()[0])


def ended(env: dict[str, str], job: str) -> tuple[str, int] | None:
    """The job's last state and restarts once it ended for good; None while it may still run."""
    state, restarts = job_state(env, job)
    waiting = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED")
    return None if state in waiting else (state, restarts)


def stopped_python(env: dict[str, str], job: str, script: str, timeout: float = 120) -> int:
    """The PID of the Python that runs `script` in a batch script's job step (not srun, which
    started it and has the same command line after its own name), once it stopped itself at a
    breakpoint."""

    def found() -> list[int]:
        state = ended(env, job)
        assert state is None, f"job {job} ended ({state[0]}, {state[1]} restarts)"
        return [pid for pid in job_processes(job, script.encode()) if stopped_at(pid)]

    def stopped_at(pid: int) -> bool:
        try:  # the Python itself, stopped (T); a process listed may have ended since
            python = Path(f"/proc/{pid}/cmdline").read_bytes().startswith(sys.executable.encode())
            return python and Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2][:3] == " T "
        except OSError:
            return False

    return until(f"job {job}'s {script} at a breakpoint", found, timeout)[0]  # type: ignore[index]


def pending(pid: int, signum: int) -> bool:
    """Whether signal `signum` waits for process `pid` (a stopped one) to take it."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    masks = [int(line.split()[1], 16) for line in lines if line.startswith(("SigPnd", "ShdPnd"))]
    return any(mask >> (signum - 1) & 1 for mask in masks)


def time_limit_signal_at(env: dict[str, str], job: str, pid: int) -> None:
    """SLURM's time-limit signal to the job, taken where its stopped Python goes on from."""
    slurm(env, "scancel", "--signal=USR2", job)
    until("the signal at the job's Python", lambda: pending(pid, signal.SIGUSR2))
    os.kill(pid, signal.SIGCONT)


@pytest.mark.slow
def test_a_time_limit_signal_after_main_training_requeues_once_never_after_the_run(
    slurm_env, tmp_path
):
    """A batch script's `srun python train.py` (no submitit) gets the time-limit signal as its
    test pass starts, main training over: the job requeues itself at once (the signal's default
    action would end it, not requeued, without summary.json). The requeued attempt finds the
    fit finished; the signal in its test pass requeues nothing (it trained no epoch: requeued,
    it would start where it did), nor does one after summary.json. It validates and tests the
    trained weights once: the numbers of an uninterrupted run here, bit for bit."""
    run = tmp_path / "run"
    args = [*AFTER_TRAINING, *BREAKPOINTS, f"hydra.run.dir={run}"]
    job = sbatch(slurm_env, tmp_path, [sys.executable, "train.py", *args])
    first = stopped_python(slurm_env, job, "train.py", timeout=180)  # its test pass starts
    assert last_epoch(run) == 1 and not (run / "summary.json").exists()
    time_limit_signal_at(slurm_env, job, first)
    here = run_entry("train.py", [*AFTER_TRAINING, f"hydra.run.dir={tmp_path / 'here'}"])
    assert here.returncode == 0, here.stderr[-3000:]
    output = tmp_path / f"slurm-{job}.out"
    second = stopped_python(slurm_env, job, "train.py", timeout=180)  # the requeued attempt's
    assert second != first, output.read_text()[-3000:]
    assert job_state(slurm_env, job) == ("RUNNING", 1) and not (run / "summary.json").exists()
    time_limit_signal_at(slurm_env, job, second)
    assert stopped_python(slurm_env, job, "train.py") == second  # at the job's end
    assert (run / "summary.json").exists()
    time_limit_signal_at(slurm_env, job, second)
    state = until("the job's end", lambda: ended(slurm_env, job))
    assert state == ("COMPLETED", 1), output.read_text()[-3000:]  # requeued once, then done

    log = (run / "train.log").read_text()
    assert "caught SIGUSR2 after main training: requeueing SLURM job" in log
    assert "not requeued, this attempt trained no epoch" in log
    assert "caught SIGUSR2 after the test pass: the run is ending, not requeued" in log
    assert summary(run)["slurm"]["restarts"] == 1
    same_weights(tmp_path / "here" / "checkpoints" / "last.ckpt", run / "checkpoints" / "last.ckpt")
    for key in ("test_accuracy", "val_accuracy"):
        assert summary(run)[key] == summary(tmp_path / "here")[key], key
    ran, reference = summary(run)["stages"]["train"], summary(tmp_path / "here")["stages"]["train"]
    assert ran["samples"] == reference["samples"]


# RequeueOnSignal in a job that submitit runs, on a real Trainer, the signal sent to this process.


class Tiny(L.LightningModule):
    """A linear classifier of 64 fixed points: a fit of a blink."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def test_step(self, batch: Any, index: int) -> None:
        x, y = batch
        self.log("test/loss", torch.nn.functional.cross_entropy(self.layer(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return self.points()

    def test_dataloader(self) -> DataLoader:
        return self.points()

    @staticmethod
    def points() -> DataLoader:
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=16)


class SignalAt(L.Callback):
    """Sends this process the time-limit signal once: at the last epoch's first batch
    ("last epoch"), or the test pass's ("test")."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self.where == "last epoch" and trainer.current_epoch == trainer.max_epochs - 1:
            self.send()

    def on_test_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self.where == "test":
            self.send()

    def send(self) -> None:
        self.where = ""
        os.kill(os.getpid(), signal.SIGUSR2)


class SubmititHandler:
    """What RequeueOnSignal finds installed where submitit runs the job: a handler that
    requeues the job and exits. It records the last epoch checkpointed in `run` each time."""

    def __init__(self, run: Path) -> None:
        self.run = run
        self.requeued: list[int] = []

    def __call__(self, signum: int, frame: Any) -> None:
        self.requeued.append(last_epoch(self.run))
        sys.exit(-1)


@pytest.fixture
def submitit_handler(tmp_path, monkeypatch) -> Iterator[SubmititHandler]:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # the job the log lines name
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    handler = SubmititHandler(tmp_path / "run")
    saved = signal.signal(signal.SIGUSR2, handler)
    yield handler
    signal.signal(signal.SIGUSR2, saved)


def tiny_trainer(run: Path, *callbacks: L.Callback, epochs: int = 2) -> L.Trainer:
    """A Trainer with main training's rolling checkpoint (lipt.stages.training_plan)."""
    last = ModelCheckpoint(
        dirpath=run / "checkpoints",
        filename="last",
        enable_version_counter=False,
        save_on_train_epoch_end=True,
    )
    return L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=run,
        callbacks=[last, *callbacks],
    )


@pytest.mark.filterwarnings("ignore:Checkpoint directory")  # the requeued attempt's, the same
def test_a_signal_in_the_last_epoch_requeues_at_the_fits_end_then_none_without_training(
    submitit_handler, tmp_path, caplog
):
    """The signal in the last epoch is noted, and the job requeues at the fit's end, the last
    epoch checkpointed (left for later, the test pass would meet the time limit). The requeued
    attempt, its fit finished, tests on through the signal (it trained no epoch: requeued, it
    would start where it did), and one after its test pass is only logged (summary.json's
    time: a finished job requeued). After an attempt's training, one requeues at once."""
    run = tmp_path / "run"
    with pytest.raises(SystemExit):
        tiny_trainer(run, RequeueOnSignal(), SignalAt("last epoch")).fit(Tiny())
    assert submitit_handler.requeued == [1]  # at the fit's end, its last epoch (1) saved

    module, trainer = Tiny(), tiny_trainer(run, RequeueOnSignal(), SignalAt("test"))
    trainer.fit(module, ckpt_path=str(run / "checkpoints" / "last.ckpt"))  # nothing left
    assert trainer.test(module, verbose=False)  # the signal in its test pass
    os.kill(os.getpid(), signal.SIGUSR2)  # after it
    time.sleep(0.1)  # the handler runs by then
    assert submitit_handler.requeued == [1]
    assert "not requeued, this attempt trained no epoch" in caplog.text
    assert "after the test pass: the run is ending, not requeued" in caplog.text

    submitit_handler.run = tmp_path / "other"
    module = Tiny()
    trainer = tiny_trainer(submitit_handler.run, RequeueOnSignal(), SignalAt("test"), epochs=1)
    trainer.fit(module)
    with pytest.raises(SystemExit):
        trainer.test(module, verbose=False)
    assert submitit_handler.requeued == [1, 0]  # in the test pass, at once


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
    # where to go on from (a ${now:} in the sweep folder would be a new folder each time)
    assert f"submit the same command again with hydra.sweep.dir={tmp_path} " in lines[0]


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
