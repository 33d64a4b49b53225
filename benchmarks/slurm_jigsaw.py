"""The jigsaw stage on a SLURM cluster: its learners as a job array over the cluster's CPUs,
against the same learners trained in one process, and where the array's extra seconds go.

    make slurm-up
    python benchmarks/slurm_jigsaw.py --per-task 1 2 5 --json slurm_jigsaw.json

Each row runs the default jigsaw stage (10 learners, Fashion-MNIST, `convnet`) as a user
would, from the command line:

- `in-process`: `python pretrain.py pretrain.num_threads=1` inside one SLURM job (one CPU, as
  the array's tasks get), the job's wall time from sacct;
- `array k`: `python pretrain.py -m 'pretrain.learners=<groups of k>' hydra/callbacks=soup
  hydra/launcher=slurm`: the learner tasks, then the soup's merge as a job of its own; wall
  time from the first task's submission to the merge job's end (sacct).

Where the array's seconds go, per task (sacct and each task's summary.json): waiting in the
queue (submit to start), the task's process before its learners train (start-up: Python, imports,
Hydra, data load), the learners' own training, and the rest; and the merge job. The pre-training
tax is the stage's wall time over one epoch of main training on the same pool (`--epoch-seconds`,
measured by the frontier's reference: its train seconds over its epochs)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NUM_LEARNERS = 10


def sacct(job_ids: list[str]) -> dict[str, dict[str, datetime]]:
    """Submit, start and end time of each job (array tasks by their <array>_<task> id)."""
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", "JobID,Submit,Start,End"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = {}
    for line in out.split():
        job, *times = line.split("|")
        rows[job] = dict(
            zip(("submit", "start", "end"), (datetime.fromisoformat(t) for t in times), strict=True)
        )
    return rows


def seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def submitted(sweep: Path) -> tuple[list[str], list[str]]:
    """The sweep's SLURM array ids and plain job ids, from its .submitit/ folder (an array has a
    folder of its own beside its tasks' <array>_<task> folders)."""
    names = [p.name for p in (sweep / ".submitit").iterdir() if p.is_dir()]
    tops = [n for n in names if "_" not in n]
    arrays = [n for n in tops if any(m.startswith(f"{n}_") for m in names)]
    return arrays, [n for n in tops if n not in arrays]


def in_process(tmp: Path) -> dict[str, Any]:
    run = tmp / "in_process"
    command = [
        "sbatch", "--parsable", "--wait", "-c", "1", "-o", str(tmp / "in_process.out"),
        "--wrap", f"{sys.executable} pretrain.py pretrain.num_threads=1 hydra.run.dir={run}",
    ]  # fmt: skip
    job = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if job.returncode != 0:  # sbatch's refusal, or the job's (its log goes with `tmp`)
        log = tmp / "in_process.out"
        said = (log.read_text() if log.is_file() else job.stderr).strip().splitlines()
        sys.exit(f"error: the in-process job failed: {said[-1] if said else job.returncode}")
    job_id = job.stdout.strip().split(";")[0]
    times = sacct([job_id])[job_id]
    summary = json.loads((run / "summary.json").read_text())["stages"]["pretrain"]
    wall = seconds(times["start"], times["end"])
    return {
        "row": "in-process",
        "wall_s": wall,
        "queue_s": seconds(times["submit"], times["start"]),
        "learners_s": summary["learner_seconds"],
        "merge_s": summary["merge_seconds"],
        "startup_s": wall - summary["seconds"],
    }


def as_array(tmp: Path, per_task: int) -> dict[str, Any]:
    sweep = tmp / f"array_{per_task}"
    ids = list(range(NUM_LEARNERS))
    groups = ",".join(
        "[" + ",".join(map(str, ids[k : k + per_task])) + "]" for k in range(0, len(ids), per_task)
    )
    command = [
        sys.executable, "pretrain.py", "-m", "pretrain.num_threads=1",
        f"pretrain.learners={groups}", "hydra/callbacks=soup", "hydra/launcher=slurm",
        "hydra.launcher.poll_s=1", f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:  # the sweep's own one line (or its traceback's last)
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        sys.exit(f"error: the array of {per_task} learners a task failed: {lines[-1]}")
    (array,), (merge,) = submitted(sweep)  # the learners' array, then the soup's job
    times = sacct([array, merge])
    learners = sorted(
        (j for j in times if j.startswith(f"{array}_")), key=lambda j: int(j[len(array) + 1 :])
    )
    first_submit = min(times[j]["submit"] for j in learners)
    per_job = []
    for num, job in enumerate(learners):  # task i ran the sweep's job i
        stage = json.loads((sweep / str(num) / "summary.json").read_text())["stages"]["pretrain"]
        trained = sum(le["seconds"] for le in stage["learners"])
        run = seconds(times[job]["start"], times[job]["end"])
        per_job.append(
            {
                "queue": seconds(times[job]["submit"], times[job]["start"]),
                "startup": run - stage["seconds"],
                "training": trained,
                "rest": stage["seconds"] - trained,
            }
        )
    soup = json.loads((sweep / "summary.json").read_text())["stages"]["pretrain"]
    return {
        "row": f"array {per_task}",
        "tasks": len(learners),
        "wall_s": seconds(first_submit, times[merge]["end"]),
        "learners_wall_s": seconds(first_submit, max(times[j]["end"] for j in learners)),
        "merge_job_s": seconds(times[merge]["submit"], times[merge]["end"]),
        "merge_s": soup["merge_seconds"],
        **{
            f"task_{key}_s": statistics.mean(t[key] for t in per_job)
            for key in ("queue", "startup", "training", "rest")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-task", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--epoch-seconds", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if any(not 1 <= k <= NUM_LEARNERS for k in args.per_task):
        parser.error(f"--per-task {args.per_task}: give learners a task, 1 to {NUM_LEARNERS}")
    from lipt.core.artifacts import atomic_write_bytes
    from lipt.run.slurm import accounting_problem, slurm_problem

    # no client (sinfo, sbatch), no controller, or no accounting (the timings come from sacct)
    problem = slurm_problem() or accounting_problem()
    if problem is not None:
        sys.exit(f"error: no SLURM cluster answers ({problem}); make slurm-up, or set SLURM_CONF")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="lipt-slurm-jigsaw-") as tmp:
        rows.append(in_process(Path(tmp)))
        for k in args.per_task:
            if args.json:  # as each row lands, atomically: a failed array keeps the rows before
                atomic_write_bytes(args.json, json.dumps(rows, indent=1).encode())
            rows.append(as_array(Path(tmp), k))
    cpus = subprocess.run(["sinfo", "-h", "-o", "%C"], capture_output=True, text=True).stdout
    print(f"SLURM: one node, CPUs (allocated/idle/other/total) {cpus.strip()}")
    print(
        "| row | tasks | wall (s) | learners' wall (s) | merge job (s) "
        "| per task: queue / start-up / training / rest (s) |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for row in rows:
        if row["row"] == "in-process":
            print(
                f"| in-process (one job, one CPU) | 1 | {row['wall_s']:.1f} | "
                f"{row['learners_s']:.1f} (training) | {row['merge_s']:.1f} (merge) | "
                f"{row['queue_s']:.1f} / {row['startup_s']:.1f} / {row['learners_s']:.1f} / "
                f"{row['merge_s']:.1f} |"
            )
            continue
        print(
            f"| {row['row']} learners a task | {row['tasks']} | {row['wall_s']:.1f} | "
            f"{row['learners_wall_s']:.1f} | {row['merge_job_s']:.1f} | "
            f"{row['task_queue_s']:.1f} / {row['task_startup_s']:.1f} / "
            f"{row['task_training_s']:.1f} / {row['task_rest_s']:.1f} |"
        )
    if args.epoch_seconds:
        for row in rows:
            print(f"{row['row']}: pre-training tax {row['wall_s'] / args.epoch_seconds:.2f} epochs")
    if args.json:
        atomic_write_bytes(args.json, json.dumps(rows, indent=1).encode())


if __name__ == "__main__":
    main()
