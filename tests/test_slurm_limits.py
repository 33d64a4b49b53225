"""When the SLURM launcher stops waiting on a pending job: only where the partition can never
run it, as sinfo describes the partition (here a stand-in sinfo on PATH that prints a partition
table, so the decision is tested without a cluster; tests/test_slurm.py runs it on one)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from lipt.run.slurm_pending import more_than_partition_has

# sinfo -h -p <partitions> -o "%R %D %s %c": one line per partition and node state
TABLE = {
    "short": ["short 1 1-2 2", "short 9 1-2 2"],  # 10 nodes, jobs of at most 2
    "wide": ["wide 3 1-infinite 2", "wide 1 1-infinite 2"],  # 4 nodes (one drained), no max
    "two": ["two 2 1-infinite 2"],
    "mixed": ["mixed 4 1-infinite 64+"],  # nodes of different sizes
    # idle nodes of 32 CPUs; the allocated line mixes sizes ("32+": some have more)
    "gpu": ["gpu 4 1-infinite 32", "gpu 2 1-infinite 32+"],
    "big": ["big 10 4-infinite 32"],  # jobs of at least 4 nodes
}


@pytest.fixture
def fake_sinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "table"
    table.write_text("\n".join(line for lines in TABLE.values() for line in lines) + "\n")
    sinfo = tmp_path / "sinfo"
    sinfo.write_text(
        "#!/bin/sh\n"
        'while [ "$1" != "-p" ]; do shift; done\n'
        f'for p in $(echo "$2" | tr , " "); do grep "^$p " {table}; done\n'
    )
    sinfo.chmod(sinfo.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(
    ("nodes", "cpus", "partition", "reason", "never"),
    [
        ("4", "4", "short", "PartitionNodeLimit", True),  # above the partition's MaxNodes
        ("2", "2", "short", "PartitionNodeLimit", False),
        ("4", "4", "wide", "PartitionNodeLimit", False),  # one node drained: it may start
        ("5", "5", "wide", "PartitionNodeLimit", True),  # more nodes than it has at all
        ("3", "3", "two,wide", "PartitionNodeLimit", False),  # wide may run it
        ("3", "3", "two,short", "PartitionNodeLimit", True),  # neither can
        ("1", "4", "two", "PartitionConfig", True),  # 4 CPUs on a node of 2
        ("2", "4", "two", "PartitionConfig", False),
        ("1", "4", "mixed", "PartitionConfig", False),  # node sizes sinfo does not list
        ("x", "4", "two", "PartitionConfig", False),  # squeue said nothing readable
        ("1", "48", "gpu", "PartitionConfig", False),  # a node of the 32+ line may have 48
        ("1", "8", "big", "PartitionNodeLimit", True),  # below the partition's MinNodes
    ],
)
def test_a_pending_job_is_given_up_only_where_its_partition_can_never_run_it(
    fake_sinfo: None, nodes: str, cpus: str, partition: str, reason: str, never: bool
) -> None:
    assert more_than_partition_has(nodes, cpus, partition, reason) is never
