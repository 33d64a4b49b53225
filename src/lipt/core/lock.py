"""One run per run folder: an exclusive `flock` on the folder itself.

The kernel drops the lock when the process ends, however it ends (exit, exception, SIGKILL), so
a crashed run never leaves a stale lock behind, and no lock file is left in the folder. What a
killed attempt did leave, the temporary files of the atomic writes it was making when it died, is
removed when the next attempt takes the lock (lipt.core.artifacts.remove_leftover_temporaries).
A run started on a folder another process holds is refused in one line naming that process.
"""

from __future__ import annotations

import atexit
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lipt.core.errors import UserError


class RunDirLockedError(UserError):
    """Another process holds the run folder: the folder is theirs, leave it as it is."""


_held: dict[Path, int] = {}  # folder -> open descriptor holding its lock, for this process
_cleaned: set[Path] = set()  # held folders whose killed writes' leftovers were removed


def _refusal(path: Path, setting: str) -> RunDirLockedError:
    """The one line that refuses `path`, naming its holder and the `setting` that picks another
    folder (hydra.sweep.dir in a multirun's job: its folder is <sweep dir>/<job>, where another
    hydra.run.dir changes nothing)."""
    holder = lock_holder(path)
    who = f" (process {holder})" if holder is not None else ""
    return RunDirLockedError(
        f"run folder {path} is in use by another lipt run{who}; wait for it to end, or pass "
        f"another {setting}"
    )


def lock_holder(path: Path) -> int | None:
    """The process holding the flock on folder `path`, from the kernel's table of locks
    (Linux's /proc/locks); None where it cannot be told (elsewhere, another PID namespace)."""
    try:
        st = os.stat(path)
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF": major and minor in hex, then the inode
    here = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if "->" not in fields and len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == here:
            pid = int(fields[4]) if fields[4].isdigit() else 0
            return pid if pid > 0 else None
    return None


def _take(key: Path, setting: str) -> None:
    """flock the existing folder `key` for this process, or refuse. A folder removed and made
    again while this waited (another's dry run letting go of a folder it made) is taken anew:
    a lock on a removed folder guards nothing."""
    while True:
        fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _refusal(key, setting) from None
        held = os.fstat(fd)
        try:
            now: os.stat_result | None = os.stat(key)
        except FileNotFoundError:  # removed: opening it again says so, or takes the new one
            now = None
        if now is not None and (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
            _held[key] = fd
            return
        os.close(fd)


def lock_run_dir(path: Path, setting: str = "hydra.run.dir") -> None:
    """Hold `path` (an existing folder) for this process until it exits; a no-op when this
    process holds it already. Once held, the temporary files that killed writes left in it (and
    in the folders of it lipt writes) are removed: a file being written now is not (its writer
    holds an flock on it: an extra DDP rank's, or a SLURM learner task's in learners/).
    `setting`: the one that names another folder, which a refusal says to change.

    Raises:
        RunDirLockedError: another process holds it.
    """
    key = Path(path).resolve()
    if key not in _held:
        _take(key, setting)
    if key in _cleaned:
        return
    _cleaned.add(key)  # once per hold: the leftovers of killed attempts, not of this one
    from lipt.core.artifacts import remove_leftover_temporaries  # imports torch: not up top

    remove_leftover_temporaries(key)


def claim_run_dir(path: Path, setting: str = "hydra.run.dir") -> None:
    """Hold the run folder `path` for this process from now on, making it if it is not there,
    before Hydra writes .hydra/ and the log into it: two runs started at once on one folder
    both passed `check_unlocked`, and the one refused when its stage took the lock had already
    replaced the other's .hydra/config.yaml and overrides.yaml with its own. A folder made here
    and still empty when this process exits (a dry run, a refusal) is removed: nothing written.
    Not for extra DDP ranks and srun tasks, which share their rank 0's folder: it holds it.
    `setting`: the one that named the folder (hydra.sweep.dir: a multirun's own folder, held
    by the sweep's process while its jobs hold theirs), which a refusal says to change.

    Raises:
        RunDirLockedError: another process holds it.
    """
    folder = Path(path).expanduser().absolute()
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    if made:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:  # unwritable, a file in the way: the caller's checks say so in one line
            return
    key = folder.resolve()
    if not key.is_dir() or key in _held:
        return
    try:
        _take(key, setting)
    except FileNotFoundError:  # another run's claim let go of it and removed it just now
        claim_run_dir(path, setting)
        return
    if made:
        atexit.register(_remove_if_empty, key, made)


def _remove_if_empty(key: Path, made: list[Path]) -> None:
    """Remove the folders `claim_run_dir` made (the deepest first), where nothing was written
    and this process holds the run folder still (let go, it may be another's now)."""
    if key not in _held:
        return
    for folder in made:
        try:
            folder.rmdir()
        except OSError:  # written into, or gone: kept as it is
            return


def release_run_dir(path: Path) -> None:
    """Let go of `path` if this process holds it (a no-op otherwise)."""
    key = Path(path).resolve()
    _cleaned.discard(key)
    fd = _held.pop(key, None)
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
    """Refuse now if another process holds `path` (before anything is written into it). A
    probe: the lock is let go at once, so two runs starting together both pass it;
    `claim_run_dir` holds the folder from then on."""
    key = Path(path).expanduser().resolve()
    if not key.is_dir() or key in _held:
        return
    fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        raise _refusal(key, "hydra.run.dir") from None
    finally:
        os.close(fd)
