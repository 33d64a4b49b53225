"""Why SLURM keeps a job pending where it will never start it: what the cluster allows a job
(its partition's nodes and CPUs, its QOS's and account's limits) is below what the job asks
for. lipt.run.slurm_launcher's wait asks this of its pending jobs, so that a sweep ends with a
line that names the job and the setting to change, never a wait without end.
"""

from __future__ import annotations

import math
import subprocess
from typing import Any

from lipt.run.slurm import slurm_client

# Why SLURM keeps a job pending (squeue's reason) where it will never start it: what the
# cluster allows a job is below what it asks for. Without this the wait would never end.
# PartitionNodeLimit and PartitionConfig only where the partition lacks the nodes or a node the
# CPUs: SLURM gives them too while nodes are down or drained, which passes.
NEVER_STARTS = {
    "PartitionTimeLimit": "its time limit is above the partition's (lower "
    "hydra.launcher.timeout_min, or choose another hydra.launcher.partition)",
    "PartitionNodeLimit": "it asks for more nodes than the partition has (hydra.launcher.nodes)",
    "PartitionConfig": "it asks for more CPUs on a node than the partition's nodes have "
    "(hydra.launcher's tasks_per_node, cpus_per_task)",
    "BadConstraints": "no node meets its constraints (hydra.launcher.constraint, gres...)",
    "InvalidQOS": "the cluster has no such hydra.launcher.qos for it",
    "InvalidAccount": "the cluster has no such hydra.launcher.account for it",
}


def never_starting(jobs: list[Any]) -> tuple[Any, str] | None:
    """A job of `jobs` that SLURM keeps pending for a reason of NEVER_STARTS (or a per-job
    limit of its QOS or account), and why; None when each may still start."""
    by_id = {str(job.job_id): job for job in jobs}
    raw = sorted({job_id.split("_")[0] for job_id in by_id})
    pending = slurm_answer(
        "squeue", "-h", "-r", "-t", "PENDING", "-j", ",".join(raw), "-o", "%i %D %C %P %r"
    )
    judged: dict[tuple[str, ...], bool] = {}  # an array's tasks pend alike: one sinfo for them
    for line in pending.splitlines():
        job_id, nodes, cpus, partition, reason = [*line.split(maxsplit=4), "", "", "", ""][:5]
        if job_id not in by_id:
            continue
        if reason in ("PartitionNodeLimit", "PartitionConfig"):
            asked = (nodes, cpus, partition, reason)
            if asked not in judged:
                judged[asked] = more_than_partition_has(*asked)
            if not judged[asked]:
                continue  # nodes down or drained, or another limit: it may start later
        if reason in NEVER_STARTS:
            return by_id[job_id], f"{reason}, {NEVER_STARTS[reason]}"
        if reason.endswith("PerJobLimit"):
            return by_id[job_id], (
                f"{reason}, it asks for more than its QOS or account allows a job "
                "(hydra.launcher's timeout_min, nodes, cpus_per_task...; sacctmgr show qos)"
            )
    return None


def slurm_answer(*args: str) -> str:
    """A SLURM client's answer ('' where the controller did not answer: the next look asks
    again)."""
    try:
        return slurm_client(*args, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def more_than_partition_has(nodes: str, cpus: str, partition: str, reason: str) -> bool:
    """Whether a job of `nodes` nodes and `cpus` CPUs can never start on `partition` (several:
    a,b; on none of them), as sinfo says: more nodes than it has in any state, or outside the
    MinNodes..MaxNodes it lets a job have (PartitionNodeLimit); more CPUs on each node than its
    largest node's, where sinfo tells it (PartitionConfig)."""
    if not (nodes.isdigit() and cpus.isdigit()) or int(nodes) < 1:
        return False
    answer = slurm_answer("sinfo", "-h", "-p", partition, "-o", "%R %D %s %c")
    has: dict[str, int] = {}  # nodes of each partition, summed over sinfo's lines of states
    least: dict[str, int] = {}  # MinNodes of a job
    most: dict[str, float] = {}  # MaxNodes of a job, CPUs of its largest node
    unsure: set[str] = set()  # "64+": nodes of several sizes in a line, the largest unsaid
    try:
        for line in answer.splitlines():
            name, count, sizes, node_cpus = line.split()
            low, _, top = sizes.partition("-")
            has[name] = has.get(name, 0) + int(count)
            if reason == "PartitionNodeLimit":
                least[name] = int(low) if low.isdigit() else 1
                most[name] = int(top) if top.isdigit() else math.inf
            elif "+" in node_cpus:
                unsure.add(name)
            else:
                most[name] = max(most.get(name, 0), int(node_cpus))
    except ValueError:
        return False
    if not has or unsure or set(most) != set(has):
        return False
    if reason == "PartitionNodeLimit":
        need = int(nodes)
        return all(need > min(has[p], most[p]) or need < least[p] for p in has)
    return all(int(cpus) / int(nodes) > most[p] for p in has)
