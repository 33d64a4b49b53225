"""The run folder is guarded: one run at a time (a lock the kernel drops when the run dies), a
full disk leaves the previous artifacts intact, and a legal but degenerate subset is reported."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from lipt.core.artifacts import (
    LEARNERS_DIR,
    RUN_SUBFOLDERS,
    TEMPORARY_NAME,
    AtomicCheckpointIO,
    save_checkpoint,
    save_subset,
)
from lipt.core.errors import UserError
from lipt.core.lock import RunDirLockedError, lock_run_dir, released_after
from lipt.run.config import run_of, validate
from lipt.stages import select as select_stage
from lipt.stages import train as train_stage
from tests.helpers import FAST, ROOT, finished, run_entry, start_entry

HOLDER = """
import sys
from pathlib import Path
from lipt.core import lock
folder = Path(sys.argv[1]).resolve()
# taken as a run takes it; its clean-up of killed writes, which imports torch (seconds of a
# Python that only holds a lock), marked done: the tests' folders have no temporaries to clean
lock._cleaned.add(folder)
lock.lock_run_dir(folder)
print("locked", flush=True)
sys.stdin.read()  # hold it until killed
"""


def _hold(folder: Path) -> subprocess.Popen:
    """Another process that holds `folder`'s lock, as a running lipt run does."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_second_run_on_a_busy_run_folder_is_refused_and_touches_nothing(tmp_path):
    folder = tmp_path / "run"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("the first run's config\n")
    holder = _hold(folder)
    try:
        before = _snapshot(folder)
        out = run_entry("train.py", [*FAST, f"hydra.run.dir={folder}"], timeout=300)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 2, out.stderr[-2000:]
        assert len(lines) == 1 and "is in use by another lipt run" in lines[0], lines
        assert _snapshot(folder) == before  # Hydra wrote nothing into the other run's folder
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_is_released_when_its_run_is_killed(make_cfg, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    holder = _hold(folder)
    cfg = make_cfg([*FAST, "selector=random", "budget=subset", f"paths.output_dir={folder}"])
    with pytest.raises(RunDirLockedError, match="in use by another lipt run"):
        train_stage.run(validate(cfg))  # the stage itself refuses too (not only the entry script)
    assert folder.is_dir()  # the other run's folder is left alone
    os.kill(holder.pid, signal.SIGKILL)  # no clean-up runs: the kernel drops the lock
    holder.wait()
    lock_run_dir(folder)  # free again
    train_stage.run(validate(cfg))
    assert (folder / "summary.json").is_file()


def test_a_job_lets_go_of_its_folder_when_it_ends_in_a_process_that_goes_on(make_cfg, tmp_path):
    # a joblib worker runs job after job: each job's folder is free once that job has ended
    from lipt.core.lock import released_after

    folders = [tmp_path / "job0", tmp_path / "job1"]
    for folder in folders:
        cfg = make_cfg([*FAST, "selector=random", "budget=subset", f"paths.output_dir={folder}"])
        with released_after(folder):
            train_stage.run(validate(cfg))
    for folder in folders:  # another process can hold them now
        holder = _hold(folder)
        holder.kill()
        holder.wait()
    with pytest.raises(ValueError, match="boom"), released_after(folders[0]):
        lock_run_dir(folders[0])
        raise ValueError("boom")  # a job that fails lets go too
    holder = _hold(folders[0])
    holder.kill()
    holder.wait()


@pytest.mark.slow
def test_the_lock_is_released_when_a_run_exits(tmp_path):
    folder = tmp_path / "run"
    for _ in range(2):  # the second run finds the folder free after the first ends
        out = run_entry(
            "train.py",
            [*FAST, "selector=random", "budget=subset", f"hydra.run.dir={folder}"],
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
    assert "checkpoints" in os.listdir(folder)


def test_a_refused_run_removes_only_the_folder_made_for_it(tmp_path):
    """A run refused once the data is read leaves no folder it made, but a folder that was there
    before it started is kept: an earlier attempt's (a resume), or the user's with its own logs."""
    import numpy as np

    labels = tmp_path / "labels.npy"
    np.save(labels, np.zeros(5, dtype=np.int64))  # the training split has 600 items
    made = tmp_path / "made"
    earlier = tmp_path / "earlier"
    (earlier / ".hydra").mkdir(parents=True)
    (earlier / "train.log").write_text("an earlier attempt\n")
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.log").write_text("the user's\n")
    for folder in (made, earlier, users):
        args = [*FAST, f"dataset.train_labels={labels}", f"hydra.run.dir={folder}"]
        out = run_entry("train.py", args, timeout=300)
        assert out.returncode == 2, out.stderr[-2000:]
        assert "dataset.train_labels has 5 labels" in out.stderr
    assert not made.exists()
    assert (earlier / "train.log").read_text().startswith("an earlier attempt\n")
    assert (users / "notes.log").read_text() == "the user's\n"


@pytest.mark.parametrize(
    ("stop", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["sigterm", "ctrl-c"]
)
def test_a_signal_ends_a_run_with_one_line_on_how_to_resume_and_its_exit_code(tmp_path, stop, code):
    """Lightning ends the fit on SIGTERM with a SystemExit whose code is 0, and on Ctrl-C
    (SIGINT) with code 1, its note in the log file only: a run stopped either way says how to
    resume and exits 128 + the signal, as a process the signal ended does; its last epoch's
    checkpoint is kept."""
    folder = tmp_path / "run"
    args = [*FAST, "trainer.max_epochs=1000", f"hydra.run.dir={folder}"]
    if stop == signal.SIGTERM:  # forked from the preloaded Python, as run_entry's runs
        proc = start_entry("train.py", args, capture=True)
    else:
        proc = subprocess.Popen(
            [sys.executable, "train.py", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Python raises KeyboardInterrupt only where SIGINT was not ignored when it started
            # (a job a shell ran in the background ignores it, and so would the preloaded
            # Python's forks): a new Python, with SIGINT's default
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    last = folder / "checkpoints" / "last.ckpt"  # an epoch done: the fit is under way
    deadline = time.monotonic() + 120
    while not last.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, stop)
    done = finished(proc, timeout=120)
    stderr = done.stderr
    assert done.returncode == code, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == (
        f"stopped by {stop.name}; resume with ckpt_path=last hydra.run.dir={folder}"
    )
    assert "Traceback" not in stderr and not (folder / "summary.json").exists()
    assert last.is_file()


# ------------------------------------------------------- temporaries of killed atomic writes

WRITER = """
import os, sys, threading
from pathlib import Path
import torch
from lipt.core import artifacts

said = threading.Lock()
told = Path(sys.argv[1])  # the temporary files, a line each, as the writes made them

def fsync(fd):  # each write stops on its way to the disk, its temporary file written and open
    with said, open(told, "a") as out:
        out.write(os.readlink(f"/proc/self/fd/{fd}") + "\\n")
    threading.Event().wait()

artifacts.os.fsync = fsync
folder = Path(sys.argv[2])
writes = {
    "checkpoints/last.ckpt": lambda p: artifacts.AtomicCheckpointIO().save_checkpoint(
        {"state_dict": {"w": torch.zeros(1 << 18)}}, p
    ),
    "subsets/epoch_2.npz": lambda p: artifacts.save_subset(p, torch.arange(9), torch.ones(9), {}),
    "learners/learner_1.ckpt": lambda p: artifacts.save_checkpoint(p, {"state_dict": {}}),
    "summary.json": lambda p: artifacts.write_json(p, {"stage": "train"}),
}
for name in sys.argv[3:]:
    threading.Thread(target=writes[name], args=(folder / name,), daemon=True).start()
threading.Event().wait()  # writing until killed
"""


def _writing(folder: Path, *names: str) -> tuple[Any, list[Path]]:
    """Another process in the middle of lipt's atomic writes of `names` in `folder` (a run, or
    a learner job, that the test kills there), forked from the preloaded Python (start_entry:
    torch imported already); its temporary files, as it made them (listed beside `folder`)."""
    script, told = folder.parent / "writer.py", folder.parent / "writes.txt"
    script.write_text(WRITER)
    proc = start_entry(str(script), [str(told), str(folder), *names])
    deadline = time.monotonic() + 120
    lines: list[str] = []
    while len(lines) < len(names):  # whole lines only: a write may be under way
        assert proc.poll() is None and time.monotonic() < deadline, "the writes did not start"
        time.sleep(0.02)
        lines = told.read_text().split("\n")[:-1] if told.is_file() else []
    temporaries = [Path(line) for line in lines]
    assert all(p.is_file() for p in temporaries), temporaries
    return proc, temporaries


def _kill(proc: Any) -> None:
    os.kill(proc.pid, signal.SIGKILL)  # no clean-up runs in it
    proc.wait()


def test_a_run_removes_the_temporaries_its_killed_attempt_left_and_nothing_else(tmp_path):
    sweep = tmp_path / "sweep"
    folder = sweep / "0"  # one job's run folder in a sweep
    last = folder / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"epoch": 0}, last)
    names = ["checkpoints/last.ckpt", "subsets/epoch_2.npz", "learners/learner_1.ckpt"]
    proc, temporaries = _writing(folder, *names, "summary.json")
    assert sorted(p.relative_to(folder).parent.name for p in temporaries) == [
        "",
        "checkpoints",
        "learners",
        "subsets",
    ]
    assert all(TEMPORARY_NAME.fullmatch(p.name) for p in temporaries)
    checkpoint = next(p for p in temporaries if p.parent.name == "checkpoints")
    assert checkpoint.stat().st_size > 1_000_000  # a checkpoint's worth of disk
    _kill(proc)
    # Files of names lipt's writes never make, and folders that are not this run's to clean:
    # the parent folder other jobs of the sweep share, the sweep's learner folder, a folder of
    # the run that lipt does not write (a user's, or another run's inside it).
    kept = [
        folder / ".notes.tmp",
        folder / "checkpoints" / ".keep.tmp",
        folder / ".last.ckpt.abc.tmp",
        folder / "summary.json.abcdefgh.tmp",
        folder / ".summary.json.ABCDEFGH.tmp",
        folder / "mine" / ".model.ckpt.abcdefgh.tmp",
        sweep / ".pretrain.ckpt.abcdefgh.tmp",
        sweep / "learners" / ".learner_3.ckpt.abcdefgh.tmp",
    ]
    for path in kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"not a leftover of this run")
    assert all(p.is_file() for p in temporaries)  # nothing else removes them
    with released_after(folder):
        lock_run_dir(folder)  # the next attempt takes the folder
    assert not any(p.exists() for p in temporaries)
    assert all(p.read_bytes() == b"not a leftover of this run" for p in kept)
    assert torch.load(last, weights_only=True) == {"epoch": 0}  # the last good one, intact


def test_a_temporary_being_written_now_is_left_to_its_writer(tmp_path):
    """An extra DDP rank, or a SLURM learner task writing into the run's learners/: still alive
    (its flock on the file held), it keeps its file; dead, the next attempt removes it."""
    folder = tmp_path / "run"
    folder.mkdir()
    proc, temporaries = _writing(folder, "learners/learner_1.ckpt", "summary.json")
    try:
        with released_after(folder):
            lock_run_dir(folder)
        assert all(p.is_file() for p in temporaries)
        assert proc.poll() is None  # still writing
    finally:
        _kill(proc)
    with released_after(folder):
        lock_run_dir(folder)
    assert not any(p.exists() for p in temporaries)


def test_a_write_whose_new_temporary_was_taken_for_a_leftover_makes_another(tmp_path, monkeypatch):
    """A clean-up that found the temporary file in the instant between its making and its lock
    removed it: the write makes another and goes on."""
    real = fcntl.flock
    removed: list[str] = []

    def flock(fd: int, operation: int) -> None:
        if not removed:
            removed.append(os.readlink(f"/proc/self/fd/{fd}"))
            os.unlink(removed[0])  # what remove_stale_temporaries does with an unlocked one
        real(fd, operation)

    monkeypatch.setattr("lipt.core.artifacts.fcntl.flock", flock)
    save_checkpoint(tmp_path / "a.ckpt", {"state_dict": {"w": torch.ones(3)}})
    assert removed and TEMPORARY_NAME.fullmatch(Path(removed[0]).name)
    assert torch.equal(torch.load(tmp_path / "a.ckpt")["state_dict"]["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["a.ckpt"]


def test_the_folders_cleaned_are_those_lipt_writes():
    from lipt.data.seen import SEEN_DIR
    from lipt.dynamic.callback import AUDIT_DIR

    assert {SEEN_DIR, AUDIT_DIR, LEARNERS_DIR, "checkpoints", "subsets"} == set(RUN_SUBFOLDERS)


# --------------------------------------------------------------------------- a full disk


def _disk_full_after(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Every write of a file called `name` fails with ENOSPC once it reaches the disk (fsync)."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name.startswith(f".{name}."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr("lipt.core.artifacts.os.fsync", fsync)


@pytest.mark.parametrize("kind", ["subset", "checkpoint", "lightning"])
def test_a_full_disk_keeps_the_previous_file_and_says_so(tmp_path, monkeypatch, kind):
    path = tmp_path / {"subset": "subset.npz", "checkpoint": "pretrain.ckpt"}.get(kind, "last.ckpt")

    def write(value: float) -> None:
        if kind == "subset":
            save_subset(path, torch.arange(1000), torch.full((1000,), value), {"dataset": "x"})
        elif kind == "checkpoint":
            save_checkpoint(path, {"state_dict": {"w": torch.full((1000,), value)}})
        else:
            AtomicCheckpointIO().save_checkpoint({"epoch": int(value)}, path)

    write(1.0)
    before = path.read_bytes()
    _disk_full_after(monkeypatch, path.name)
    with pytest.raises(UserError, match=r"no space left .*\(the previous file is unchanged\)"):
        write(2.0)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_other_write_errors_are_not_reported_as_a_full_disk(tmp_path, monkeypatch):
    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr("lipt.core.artifacts.os.fsync", fsync)
    with pytest.raises(OSError) as caught:
        save_checkpoint(tmp_path / "a.ckpt", {"state_dict": {}})
    assert not isinstance(caught.value, UserError) and caught.value.errno == errno.EIO


def test_a_run_whose_disk_fills_keeps_its_last_checkpoint_and_resumes(
    make_cfg, tmp_path, monkeypatch
):
    cfg = make_cfg([*FAST, "selector=random", "budget=subset", "trainer.max_epochs=2"])
    last = tmp_path / "checkpoints" / "last.ckpt"
    real = os.fsync

    def fsync(fd: int) -> None:  # the disk fills up once epoch 1's checkpoint is on it
        target = os.readlink(f"/proc/self/fd/{fd}")
        if Path(target).name.startswith(".last.ckpt.") and last.is_file():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr("lipt.core.artifacts.os.fsync", fsync)
    with pytest.raises(UserError, match="no space left"):
        train_stage.run(validate(cfg))
    assert torch.load(last, weights_only=True)["epoch"] == 0  # epoch 1's, intact
    monkeypatch.undo()  # space freed: resume
    resumed = make_cfg(
        [*FAST, "selector=random", "budget=subset", "trainer.max_epochs=2", "ckpt_path=last"]
    )
    summary = train_stage.run(validate(resumed))
    assert torch.load(last, weights_only=True)["epoch"] == 1
    assert summary["stages"]["train"]["samples"] == 2 * summary["subset_size"]


# --------------------------------------------------------------------------- degenerate subsets


def test_a_subset_smaller_than_the_classes_is_warned_about_and_counted(make_cfg, tmp_path, caplog):
    # 0.004 of the 500-image pool: 2 images for 4 classes.
    cfg = make_cfg(
        [*FAST, "selector=random", "budget=subset", "fraction=0.004"], config_name="select"
    )
    with caplog.at_level(logging.WARNING, logger="lipt.stages.summary"):
        summary = select_stage.run(validate(cfg))
    counts = summary["subset_class_counts"]
    assert len(counts) == 4 and sum(counts) == 2 and counts.count(0) >= 2
    assert "fewer than the 4 classes" in caplog.text
    assert f"{counts.count(0)} of 4 classes have no sample" in caplog.text
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["subset_class_counts"] == counts


def test_a_healthy_subset_records_its_class_counts_without_a_warning(make_cfg, tmp_path, caplog):
    import numpy as np

    from lipt.stages.build import build_datamodule

    cfg = make_cfg([*FAST, "selector=random", "budget=subset", "fraction=0.2"])
    with caplog.at_level(logging.WARNING, logger="lipt.stages.summary"):
        summary = train_stage.run(validate(cfg))
    assert caplog.text == ""
    with np.load(tmp_path / "subset.npz") as data:
        indices = torch.from_numpy(data["indices"])
    labels = build_datamodule(run_of(cfg)).train_source.labels[indices]
    assert summary["subset_class_counts"] == torch.bincount(labels, minlength=4).tolist()
    assert sum(summary["subset_class_counts"]) == 100 and min(summary["subset_class_counts"]) > 0
