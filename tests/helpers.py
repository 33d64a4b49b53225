"""What the tests share besides fixtures: the repository's paths, the selectors under test,
quick end-to-end settings, running an entry script as a user would, and writers of the real
on-disk data formats (IDX). conftest.py keeps the fixtures."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from lipt.selection.selectors import SELECTORS as API_SELECTORS

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def compose_train(out: Path, overrides: Sequence[str] = (), config_name: str = "train") -> Any:
    """The config `overrides` compose, writing into `out` (paths.output_dir): conftest's make_cfg,
    for fixtures that outlive a test."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose(config_name, overrides=[f"paths.output_dir={out}", *overrides])


def acting_on_first_refusal(
    check: Callable[[Any, Path], bool], act: Callable[[], Any], refused: list[Path]
) -> Callable[[Any, Path], bool]:
    """A wait's readiness check `check(settings, path)` that, the first time it refuses a file
    (an earlier run's), records the path in `refused` and runs `act` (rank 0's file lands while
    the wait waits: its next look reads it). Not a timer, which could fire before the first look
    and leave the wait untested."""

    def checked(settings: Any, path: Path) -> bool:
        ready = check(settings, path)
        if not ready and not refused:
            refused.append(path)
            act()
        return ready

    return checked


# The selectors under test, by the name of their config in configs/selector/ (the API's table).
SELECTORS = API_SELECTORS

# Small, quick settings for end-to-end runs on the synthetic data set. On the CPU even where a
# GPU is present: tests that compare runs bit for bit would not hold on CUDA with
# `deterministic: false` (the `gpu` marker is for tests meant to run there).
FAST = [
    "dataset=synthetic",
    "trainer.accelerator=cpu",
    "model.width=8",
    "batch_size=32",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
    "logger=none",
    # The whole pool pruned by InfoBatch, which needs no pre-training; tests that exercise the
    # jigsaw stage or lipt's default (budget=lipt) ask for them, and a test that picks a
    # selector adds budget=subset (a budget on the command line wins over the selector's).
    "budget=infobatch",
    "pretrain=none",
]


# What the interpreter and the libraries read once, at start or import: runs that set them
# differently fork from different preloaded Pythons. (PYTHONPATH: the child puts it on sys.path.)
READ_AT_IMPORT = (
    "ATEN_CPU_CAPABILITY",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTHONHASHSEED",
    "CUDA_VISIBLE_DEVICES",
)


def run_entry(
    script: str,
    args: Sequence[str],
    cwd: Path = ROOT,
    timeout: float = 600,
    env: dict | None = None,
    preloaded: bool = True,
    stderr_to_stdout: bool = False,
) -> subprocess.CompletedProcess:
    """Run an entry script as a user would, from the repository root, and wait for it
    (`script="-m"`: python -m args[0] args[1:]).

    By default in a fresh process forked from a Python that imported the libraries already
    (tests.preloaded: a run spends 5-7 s of CPU importing torch, Lightning and Hydra), one
    started with `env`'s settings of what is read at import (READ_AT_IMPORT);
    `preloaded=False` starts a new Python, for runs about the start itself. With
    `stderr_to_stdout`, stderr goes into stdout, in the order written (stderr is None)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if preloaded:
        from tests.preloaded import preloaded_python  # it reads ROOT from here

        server = preloaded_python(full_env)
        if server is not None:
            return server.run(script, args, cwd, timeout, full_env, stderr_to_stdout)
    return subprocess.run(
        [sys.executable, script, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE,
        text=True,
        timeout=timeout,
        env=full_env,
        stdin=subprocess.DEVNULL,
    )


def start_entry(
    script: str, args: Sequence[str], env: dict | None = None, slot: str = "", capture: bool = False
) -> Any:
    """Start an entry script from the repository root in the background, in a process group of
    its own: a run forked from the preloaded Python as run_entry's (tests.preloaded.PreloadedRun,
    which behaves as a subprocess.Popen; `slot`: a server of its own, for a run that goes on
    while the test runs others), or a Popen where none can fork. For runs a test kills, or
    waits for (`capture`: its output is kept, read with tests.helpers.finished; else dropped)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    from tests.preloaded import preloaded_python

    server = preloaded_python(full_env, slot=slot)
    if server is not None:
        return server.start(script, args, ROOT, full_env)
    kept = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, script, *args],
        cwd=ROOT,
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=kept,
        stderr=kept,
        text=True,
        start_new_session=True,
    )


def finished(proc: Any, timeout: float) -> subprocess.CompletedProcess:
    """What a run start_entry(..., capture=True) started wrote, once it ended."""
    if isinstance(proc, subprocess.Popen):
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    proc.wait(timeout)
    done: subprocess.CompletedProcess = proc.output()
    return done


# --- real on-disk formats --------------------------------------------------------------------


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def class_images(labels: np.ndarray, channels: int, size: int, seed: int) -> np.ndarray:
    """Images whose class is visible (a per-class brightness pattern plus noise)."""
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(0, 256, size=(int(labels.max()) + 1, channels, size, size))
    noise = rng.normal(0, 30, size=(len(labels), channels, size, size))
    return np.clip(prototypes[labels] + noise, 0, 255).astype(np.uint8)


class HeadNet(nn.Module):
    """A user's model as `model._target_` takes it: its final nn.Linear is `head`, not lipt's
    `classifier`, with BatchNorm in its body."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 8) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))  # [B, C, H, W] -> [B, num_classes]


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def selector_config(target: str, name: str = "mine") -> str:
    """A selector option of one's own (configs/selector/<name>.yaml) calling `target`, a
    function that needs no model, training its subset."""
    return (
        "defaults:\n  - override /budget@_global_.budget: subset\n  - _self_\n"
        f"name: {name}\nneeds_model: false\nbalance: false\n_target_: {target}\n"
        "_partial_: true\n"
    )


class SimulatedCrashError(RuntimeError):
    """A kill, stood in for by an exception raised in main training (`crash_at`)."""


def crash_at(monkeypatch: Any, epoch: int) -> None:
    """Main training raises at batch 1 of `epoch`: the epochs before it are checkpointed."""
    from lipt.models.classifier import Classifier

    real_step = Classifier.training_step

    def crash(self: Classifier, batch: Any, batch_idx: int) -> Any:
        if self.current_epoch == epoch and batch_idx == 1:
            raise SimulatedCrashError("killed")
        return real_step(self, batch, batch_idx)

    monkeypatch.setattr(Classifier, "training_step", crash)
