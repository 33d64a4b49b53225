"""This process's job: its run folder (created and locked), whether an earlier attempt ran in it,
whether it is an extra DDP rank (and ends with the rank 0 that started it), and the sweep folder
of a multirun job."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from lipt.core.lock import lock_run_dir

# Rank 0's process id, which the extra ranks Lightning's launcher starts from it inherit.
LAUNCHER_PID = "LIPT_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1  # prctl(2)


def run_dir(path: Path) -> Path:
    """The run folder, created and locked for this process (lipt.core.lock): a second run
    pointed at it is refused, and so is one where a folder has the name of a file lipt writes
    there (or the reverse). Extra DDP ranks share their rank 0's folder and lock, and end
    with the rank 0 that started them (`end_with_launcher`)."""
    path.mkdir(parents=True, exist_ok=True)
    if is_ddp_child():
        end_with_launcher()
    else:
        # a multirun job's folder is <sweep dir>/<job>: another hydra.run.dir changes nothing
        lock_run_dir(path, "hydra.run.dir" if sweep_dir_of_job() is None else "hydra.sweep.dir")
        from lipt.core.artifacts import check_run_folder_entries  # imports torch: not up top

        check_run_folder_entries(path)
        os.environ[LAUNCHER_PID] = str(os.getpid())  # for the ranks Lightning starts from here
    return path


def launcher_pid() -> int | None:
    """The rank 0 that started this extra rank by running the script again (Lightning's
    launcher: this process's parent, or its parent until it ended); None where none did (rank
    0 itself, srun's and torchrun's ranks, which their own launchers start)."""
    pid = os.environ.get(LAUNCHER_PID, "")
    # srun's tasks after the first (inside `srun --pty bash`, every process has SLURM_PROCID=0
    # and Lightning's launcher starts the ranks), and torchrun's
    started_by_cluster = (
        os.environ.get("SLURM_PROCID", "0") != "0" or "TORCHELASTIC_RUN_ID" in os.environ
    )
    if not is_ddp_child() or started_by_cluster or not pid.isdigit():
        return None
    return int(pid)


def end_with_launcher() -> None:
    """In an extra rank Lightning's launcher started: be killed when its rank 0 ends, however it
    ends. A rank 0 killed (SIGKILL, the out-of-memory killer) before the ranks met left them
    waiting up to the process group's 30-minute timeout, holding the data and the device's
    memory. Linux only (prctl); elsewhere a no-op.

    Raises:
        SystemExit: rank 0 ended already, before this rank started.
    """
    launcher = launcher_pid()
    if launcher is None or not sys.platform.startswith("linux"):
        return
    if os.getppid() == launcher:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() == launcher:  # still there once the signal is set: it will come
            return
    if process_start_time(launcher) is not None:  # alive, and not this process's parent
        return
    raise SystemExit(f"rank 0 (process {launcher}) ended before this extra DDP rank started")


def is_ddp_child() -> bool:
    """True in the extra processes Lightning's DDP launcher starts by re-running the script,
    in the tasks of an `srun` other than its first (Lightning's SLURM environment), and in
    torchrun's ranks other than 0 (RANK: on a second node its first rank has LOCAL_RANK=0) and
    LSF's (jsrun's JSM_NAMESPACE_RANK, which Lightning's LSF environment reads)."""
    return any(
        os.environ.get(key, "0") != "0"
        for key in ("LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "RANK", "JSM_NAMESPACE_RANK")
    )


def wait_for_file(
    path: Path, seconds: float = 24 * 3600, ready: Callable[[Path], bool] | None = None
) -> None:
    """Wait until `path` exists (and is `ready`: this attempt's, not an earlier run's left in
    the folder): what an extra rank reads of rank 0's work. Lightning's launcher starts extra
    ranks once it is written; srun starts every task at once."""
    deadline = time.monotonic() + seconds
    pause = 0.05  # doubled up to a second: a file written soon is read soon, a long wait idles
    while not path.is_file() or (ready is not None and not ready(path)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not write {path} in {seconds:.0f} s")
        time.sleep(pause)
        pause = min(2 * pause, 1.0)


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
    output = Path(str(hc.runtime.output_dir))
    depth = len(Path(str(hc.sweep.subdir)).parts)  # 0 for subdir=.: the job's folder is the sweep's
    return output.parents[depth - 1] if depth else output


def logged_before_this_process(out: Path) -> bool:
    """Whether an earlier attempt of this run ran in `out`: the run's log file (Hydra's
    <job>.log, which every attempt appends to) opens with a record from before this attempt
    started. A folder Hydra made for this process (hydra.run.dir forgotten) holds none. An
    extra rank Lightning started reads every log in `out` against its rank 0's start: its own,
    <job>_ddp_process_<r>.log, is new where the earlier attempts ran on one device."""
    launcher = launcher_pid()
    started = process_start_time("self" if launcher is None else launcher)
    if started is None:
        return False
    logs = {
        Path(handler.baseFilename).resolve()
        for handler in logging.getLogger().handlers
        if isinstance(handler, logging.FileHandler)
    }
    if launcher is not None:
        logs |= {path.resolve() for path in out.glob("*.log")}
    for path in logs:
        first = first_record_time(path) if path.parent == out.resolve() else None
        if first is not None and first < started:
            return True
    return False


def process_start_time(pid: int | str = "self") -> float | None:
    """When process `pid` (this one by default) started, in seconds since the epoch, to the
    clock tick (Linux's /proc; None elsewhere, or where no such process is): its start in ticks
    since boot, carried over to the wall clock."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
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
