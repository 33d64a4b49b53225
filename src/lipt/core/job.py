"""This process's job: its run folder (created and locked), whether it is an extra DDP rank,
and the sweep folder of a multirun job."""

from __future__ import annotations

import os
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
