"""Files other tools rely on: `summary.json`, `subset.npz` and model checkpoints.

Every write goes to a temporary file in the same directory and is renamed into place, so a run
killed mid-write never leaves a half-written file that a later run would read. The temporary
file of a killed write is left behind, though (a checkpoint's is as large as the checkpoint): its
writer holds an flock on it while it writes, which the kernel drops when the writer dies, so
`remove_stale_temporaries` tells a dead writer's leftovers from a live writer's file, whoever
wrote it (a run takes them out of its folder when it takes the folder's lock, lipt.core.lock).
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import logging
import os
import re
import stat
import tempfile
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from torch import Tensor

from lipt.core.errors import UserError

log = logging.getLogger(__name__)

SUBSET_FORMAT_VERSION = 1
# A run's jigsaw learner checkpoints, learner_<i>.ckpt (lipt.jigsaw.checkpoints), and the records
# of the array tasks that trained them on SLURM: in this folder of the run.
LEARNERS_DIR = "learners"
# The folders of a run folder that lipt writes files into with `atomic_write_bytes`, besides the
# run folder itself: Lightning's checkpoints (lipt.stages.training_plan), re-selected subsets
# (lipt.selection.reselection), jigsaw learners, the subsets seen per epoch and rank
# (lipt.data.seen.SEEN_DIR) and dynamic pruning's audits (lipt.dynamic.callback.AUDIT_DIR).
RUN_SUBFOLDERS = ("checkpoints", "subsets", LEARNERS_DIR, "seen", "dynamic")
# The files the stages write in a run folder itself (lipt.stages.select, .clean, .pretrain_outputs,
# lipt.cleaning.issues_csv, .datalab, lipt.report.pictures).
RUN_FILES = (
    "summary.json",
    "stages.json",
    "subset.npz",
    "subset.png",
    "pretrain.ckpt",
    "merge_report.json",
    "clean.json",
    "label_issues.csv",
    "label_issues.png",
    "datalab_issues.csv",
    "datalab_summary.json",
)
_UMASK = os.umask(0)
os.umask(_UMASK)


# A full disk or an exhausted quota: the user can free space and run again.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


# The name of a write's temporary file: `.<target's name>.<8 characters>.tmp` beside its target,
# as tempfile.mkstemp makes it (its 8 random characters are of [a-z0-9_]). Only files of this
# name are ever removed as a killed write's leftovers.
TEMPORARY_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename. When the disk fills up
    mid-write, the temporary file is removed, the previous `path` (if any) is left as it was,
    and a UserError says so. The temporary file is flock'ed until it is renamed: a leftover of
    a killed write is told from this live one by that lock (`remove_stale_temporaries`)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _locked_temporary(path)
    except OSError as e:
        _raise_if_no_space(e, path)
        raise
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; artifacts are for other tools too
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)  # before the file (and its lock) is let go
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            _raise_if_no_space(e, path)
        if isinstance(e, IsADirectoryError):  # a folder of the file's name, made during the run
            raise UserError(f"{path} is a folder, not lipt's file; move it, and run again") from e
        raise


def _locked_temporary(path: Path) -> tuple[int, str]:
    """A new temporary file for `path`, open and flock'ed by this process. A clean-up that
    found it in the instant before it was locked took it for a leftover and removed it: then
    another one is made."""
    while True:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits only while a clean-up looks at it
        except OSError as e:
            if e.errno in (errno.ENOLCK, errno.EINVAL, errno.ENOTSUP, errno.ENOSYS):
                return fd, tmp  # no locks on this file system: a clean-up keeps every file
            os.close(fd)
            Path(tmp).unlink(missing_ok=True)
            raise
        if os.fstat(fd).st_nlink > 0:
            return fd, tmp
        os.close(fd)


# A folder that jobs on other nodes write at the same time (a sweep's learner folder): a cluster
# file system may keep flocks to each node (BeeGFS by default, Lustre's localflock, NFS with
# nolock), so there an unlocked temporary is removed only once no write could still be making it.
SHARED_FOLDER_GRACE_S = 3600.0


def remove_stale_temporaries(folder: Path, min_age_s: float = 0.0) -> list[tuple[Path, int]]:
    """Remove the temporary files in `folder` (not its subfolders) that a killed write left
    behind: those of `TEMPORARY_NAME`'s exact name whose writer is gone (no flock on them), and
    last written at least `min_age_s` ago (`SHARED_FOLDER_GRACE_S` for a folder other nodes'
    jobs write). A file being written now (by this process or any other), any other file, and
    any file this process may not open for writing are kept. Returns the removed files and
    their sizes."""
    try:
        entries = [e for e in os.scandir(folder) if TEMPORARY_NAME.fullmatch(e.name)]
    except OSError:  # no such folder (yet), or not ours to list
        return []
    removed = []
    for entry in entries:
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            fd = os.open(entry.path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its writer lives
            held, now = os.fstat(fd), os.lstat(entry.path)
            same = (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)  # still the one locked
            old_enough = time.time() - held.st_mtime >= min_age_s
            if stat.S_ISREG(held.st_mode) and same and old_enough:
                os.unlink(entry.path)
                removed.append((Path(entry.path), held.st_size))
        except OSError:  # being written (BlockingIOError), gone, or no locks here: kept
            continue
        finally:
            os.close(fd)
    return removed


def remove_leftover_temporaries(run_folder: Path) -> list[tuple[Path, int]]:
    """`remove_stale_temporaries` in a run folder and the folders of it lipt writes
    (`RUN_SUBFOLDERS`), none deeper: what the killed attempts of the run left there. Logged
    when there were any."""
    folder = Path(run_folder)
    removed = remove_stale_temporaries(folder)
    for name in RUN_SUBFOLDERS:
        removed += remove_stale_temporaries(folder / name)
    if removed:
        size = sum(n for _, n in removed)
        log.info(
            "removed %d temporary file%s (%.1f MB) that killed writes left in %s",
            len(removed),
            "" if len(removed) == 1 else "s",
            size / 1e6,
            folder,
        )
    return removed


def check_run_folder_entries(folder: Path) -> None:
    """Refuse a run folder where one of lipt's files is a folder, or one of its folders a file
    (the user's, of the same name): each write there would fail, the last ones after all the
    work (summary.json).

    Raises:
        UserError: naming the first such entry.
    """
    kinds = [(name, False) for name in RUN_FILES] + [(name, True) for name in RUN_SUBFOLDERS]
    for name, folder_kind in kinds:
        entry = Path(folder) / name
        if entry.exists() and entry.is_dir() != folder_kind:
            was, wanted = ("file", "folder") if folder_kind else ("folder", "file")
            raise UserError(
                f"{entry} is a {was}, where lipt writes its {name} {wanted}; move it out of "
                "the run folder, or pass another hydra.run.dir"
            )


def _raise_if_no_space(e: OSError, path: Path) -> None:
    if e.errno in _NO_SPACE:
        kept = "the previous file is unchanged" if path.exists() else "nothing was written"
        raise UserError(
            f"no space left on the device while writing {path} ({kept}); free some space and "
            # without ckpt_path=last, train.py would start over on the epochs saved
            "run again in the same folder (train.py: with ckpt_path=last, to go on from there)"
        ) from e


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(payload, indent=2, sort_keys=False) + "\n").encode())


# --- subset.npz ----------------------------------------------------------------------------


def save_subset(path: Path, indices: Tensor, weights: Tensor, meta: Mapping[str, Any]) -> None:
    """`indices` are positions in the data set's original training split (int64); `weights`
    float32; `meta` identifies the data and split so another data set's subset is refused."""
    buffer = io.BytesIO()
    np.savez(
        buffer,
        indices=indices.detach().cpu().numpy().astype(np.int64),
        weights=weights.detach().cpu().numpy().astype(np.float32),
        meta=np.array(json.dumps({"format_version": SUBSET_FORMAT_VERSION, **meta})),
    )
    atomic_write_bytes(path, buffer.getvalue())


def load_subset(path: Path) -> tuple[Tensor, Tensor, dict[str, Any]]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"subset file {path} does not exist; set subset_path to a subset.npz")
    try:
        with np.load(path, allow_pickle=False) as data:
            indices = data["indices"]
            weights = data["weights"]
            meta = json.loads(str(data["meta"]))
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as e:  # EOF: empty
        raise UserError(
            f"{path} is not a readable lipt subset file ({type(e).__name__}); re-run select.py"
        ) from e
    if indices.ndim != 1 or indices.shape != weights.shape or indices.dtype.kind not in "iu":
        raise UserError(f"{path}: indices and weights must be 1-D arrays of the same length")
    return (
        torch.from_numpy(indices.astype(np.int64)),
        torch.from_numpy(weights.astype(np.float32)),
        meta,
    )


def check_subset(
    path: Path,
    indices: Tensor,
    weights: Tensor,
    meta: Mapping[str, Any],
    expected: Mapping[str, Any],
    dataset_train_size: int,
    val_indices: Tensor,
) -> None:
    """Refuse a subset made for other data, or one with out-of-range, duplicate or held-out
    indices, or non-positive weights."""
    for key, value in expected.items():
        if meta.get(key) != value:
            if key == "dataset" and _both_image_folders(meta.get(key), value):
                raise UserError(
                    f"{path} was made for dataset={meta.get(key)!r}, this run has "
                    f"dataset={value!r}: another ImageFolder tree, or this one before its files "
                    "changed (the hex part digests its files; an older lipt's file has none); "
                    "select a subset for this tree (select.py)"
                )
            raise UserError(
                f"{path} was made for {key}={meta.get(key)!r}, this run has {key}={value!r}; "
                "select a subset for this data set (select.py) or fix the overrides"
            )
    if len(indices) == 0:
        raise UserError(f"{path} holds an empty subset; re-run select.py")
    if int(indices.min()) < 0 or int(indices.max()) >= dataset_train_size:
        raise UserError(
            f"{path} has indices outside 0..{dataset_train_size - 1}; it was made for other data"
        )
    if len(torch.unique(indices)) != len(indices):
        raise UserError(f"{path} has duplicate indices; re-run select.py")
    if bool(torch.isin(indices, val_indices).any()):
        raise UserError(
            f"{path} has indices in the validation split; it was made with another "
            "dataset.val_size or dataset.split_seed"
        )
    if not bool(torch.isfinite(weights).all()) or bool((weights <= 0).any()):
        raise UserError(f"{path} has non-positive or non-finite weights; re-run select.py")


def _both_image_folders(recorded: Any, expected: Any) -> bool:
    """Two data identities of ImageFolder trees (lipt.data.sources.load_image_folder)."""
    return all(isinstance(v, str) and v.startswith("imagefolder:") for v in (recorded, expected))


# --- checkpoints -----------------------------------------------------------------------------


def save_checkpoint(path: Path, payload: Mapping[str, Any]) -> None:
    """Tensors and plain Python values only, so `torch.load(weights_only=True)` reads it."""
    buffer = io.BytesIO()
    torch.save(dict(payload), buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_checkpoint(path: Path) -> dict[str, Any]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist; set ckpt_path to a pretrain.ckpt")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated or foreign files
        raise UserError(
            f"{path} is not a readable checkpoint ({type(e).__name__}); re-run pretrain.py"
        ) from e
    if not isinstance(payload, dict) or "state_dict" not in payload:
        raise UserError(f"{path} is not a lipt pretrain checkpoint (no state_dict)")
    return payload


# What Lightning reads first when a fit resumes from a checkpoint.
LIGHTNING_KEYS = ("pytorch-lightning_version", "state_dict")


def check_lightning_checkpoint(path: Path, key: str) -> dict[str, Any]:
    """Refuse, in one line naming the setting `key` (e.g. "ckpt_path=last"), a file main
    training cannot resume from: unreadable (truncated, not a torch file) or not a Lightning
    checkpoint (a jigsaw learner's, pretrain.ckpt). Returns its payload. Cheap: the tensors are
    mapped, not read."""
    path = Path(path).expanduser()
    named = key if key.endswith(str(path)) else f"{key}: {path}"
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # torch raises many types for truncated or foreign files
        raise UserError(
            f"{named} is not a readable checkpoint ({type(e).__name__}); give another "
            "one main training saved (a run's checkpoints/), or delete it to start main "
            "training over"
        ) from e
    missing = [k for k in LIGHTNING_KEYS if not isinstance(payload, dict) or k not in payload]
    if missing:
        raise UserError(
            f"{named} is not a Lightning checkpoint of main training (no "
            f"{', '.join(missing)}); ckpt_path resumes main training: give a run's "
            "checkpoints/last.ckpt, or ckpt_path=last in that run's folder"
        )
    return cast(dict[str, Any], payload)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, through a temporary file and a rename: a run killed while
    saving keeps the previous `last.ckpt` intact for `ckpt_path=last`."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        atomic_write_bytes(Path(path), buffer.getvalue())
