"""One run per run folder: an exclusive `flock` on the folder itself.

The kernel drops the lock when the process ends, however it ends (exit, exception, SIGKILL), so
a crashed run never leaves a stale lock behind, and no lock file is left in the folder. What a
killed attempt did leave, the temporary files of the atomic writes it was making when it died, is
removed when the next attempt takes the lock (lipt.core.artifacts.remove_leftover_temporaries).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lipt.core.errors import UserError


class RunDirLockedError(UserError):
    """Another process holds the run folder: the folder is theirs, leave it as it is."""


_held: dict[Path, int] = {}  # folder -> open descriptor holding its lock, for this process


def _refusal(path: Path) -> RunDirLockedError:
    return RunDirLockedError(
        f"run folder {path} is in use by another lipt run; wait for it to end, or pass another "
        "hydra.run.dir"
    )


def lock_run_dir(path: Path) -> None:
    """Hold `path` (an existing folder) for this process until it exits; a no-op when this
    process holds it already. Once held, the temporary files that killed writes left in it (and
    in the folders of it lipt writes) are removed: a file being written now is not (its writer
    holds an flock on it: an extra DDP rank's, or a SLURM learner task's in learners/).

    Raises:
        RunDirLockedError: another process holds it.
    """
    key = Path(path).resolve()
    if key in _held:
        return
    fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _refusal(key) from None
    _held[key] = fd
    from lipt.core.artifacts import remove_leftover_temporaries  # imports torch: not up top

    remove_leftover_temporaries(key)


def release_run_dir(path: Path) -> None:
    """Let go of `path` if this process holds it (a no-op otherwise)."""
    fd = _held.pop(Path(path).resolve(), None)
    if fd is not None:
        os.close(fd)  # its only descriptor: closing it drops the flock


@contextmanager
def released_after(path: Path) -> Iterator[None]:
    """A job's run folder, let go when the job ends, however it ends: a process that runs one
    job after another (a joblib worker of a sweep) must not keep every folder it ran locked."""
    try:
        yield
    finally:
        release_run_dir(path)


def check_unlocked(path: Path) -> None:
    """Refuse now if another process holds `path` (before anything is written into it)."""
    key = Path(path).expanduser().resolve()
    if not key.is_dir() or key in _held:
        return
    fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        raise _refusal(key) from None
    finally:
        os.close(fd)
