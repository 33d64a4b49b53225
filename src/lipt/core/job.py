"""This process's job: its run folder (created and locked), whether an earlier attempt ran in it,
whether it is an extra DDP rank, and the sweep folder of a multirun job."""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

from lipt.core.lock import lock_run_dir


def run_dir(path: Path) -> Path:
    """The run folder, created and locked for this process (lipt.core.lock): a second run
    pointed at it is refused. Extra DDP ranks share their rank 0's folder and lock."""
    path.mkdir(parents=True, exist_ok=True)
    if not is_ddp_child():
        lock_run_dir(path)
    return path


def is_ddp_child() -> bool:
    """True in the extra processes Lightning's DDP launcher starts by re-running the script,
    and in the tasks of an `srun` other than its first (Lightning's SLURM environment)."""
    return (
        os.environ.get("LOCAL_RANK", "0") != "0"
        or os.environ.get("NODE_RANK", "0") != "0"
        or os.environ.get("SLURM_PROCID", "0") != "0"
    )


def wait_for_file(path: Path, seconds: float = 24 * 3600) -> None:
    """Wait until `path` exists: what an extra rank reads of rank 0's work. Lightning's launcher
    starts extra ranks once it is written; srun starts every task at once."""
    deadline = time.monotonic() + seconds
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not write {path} in {seconds:.0f} s")
        time.sleep(1.0)


def sweep_dir_of_job() -> Path | None:
    """The sweep dir of the running multirun job, or None outside one. Derived from the job's
    output dir (sweep dir / subdir) rather than by re-resolving hydra.sweep.dir, whose ${now:}
    a remote job would resolve to another time."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    depth = len(Path(str(hc.sweep.subdir)).parts)
    return Path(str(hc.runtime.output_dir)).parents[depth - 1]


def logged_before_this_process(out: Path) -> bool:
    """Whether an earlier attempt of this run ran in `out`: the run's log file (Hydra's
    <job>.log, which every attempt appends to) opens with a record from before this process
    started. A folder Hydra made for this process (hydra.run.dir forgotten) holds none."""
    started = process_start_time()
    if started is None:
        return False
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            path = Path(handler.baseFilename).resolve()
            first = first_record_time(path) if path.parent == out.resolve() else None
            if first is not None and first < started:
                return True
    return False


def process_start_time() -> float | None:
    """When this process started, in seconds since the epoch, to the clock tick (Linux's /proc;
    None elsewhere): its start in ticks since boot, carried over to the wall clock."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, IndexError, AttributeError):
        return None
    ticks = int(fields[19])  # field 22 of stat(5): starttime
    return time.time() - since_boot + ticks / os.sysconf("SC_CLK_TCK")


def first_record_time(log_file: Path) -> float | None:
    """The time stamp that opens the log file's first record (logging's asctime, local time, as
    Hydra's log format writes it), in seconds since the epoch; None: empty, or another format."""
    try:
        with log_file.open(errors="replace") as f:
            line = f.readline()
    except OSError:
        return None
    stamp = re.match(r"\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)
    if stamp is None:
        return None
    local = time.strptime(stamp[1], "%Y-%m-%d %H:%M:%S")
    return time.mktime(local) + int(stamp[2]) / 1000
