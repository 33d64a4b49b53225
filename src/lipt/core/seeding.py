"""Seeds and threads: every random stream of a run derived from its seed alone, and the torch
intra-op thread count set for a block (CPU float results depend on it).

Imports only the standard library, NumPy and torch: the pure selectors use it too.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = [
    "derive_seed",
    "derived_seed",
    "generator",
    "global_rng_states",
    "repeat_seed",
    "reselect_seed",
    "seeded",
    "set_global_rng_states",
    "torch_threads",
]


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 32-bit seed that depends on (seed, keys) alone: the same in every process and job
    (hashlib, not the salted built-in hash), and independent across keys. The jigsaw learners'
    streams (shards, learner i's training, density, masks, held-out subset)."""
    text = ":".join(str(k) for k in (int(seed), *keys))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def generator(seed: int, *keys: int | str) -> torch.Generator:
    """A CPU generator seeded with `derive_seed(seed, *keys)`."""
    return torch.Generator().manual_seed(derive_seed(seed, *keys))


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed Python, NumPy and torch (CPU and CUDA) for the block, then restore their states, so
    what runs inside (a learner's shuffling and augmentation) does not depend on what ran
    before it."""
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count()))
    with torch.random.fork_rng(devices=devices):
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def global_rng_states() -> dict[str, Any]:
    """Python's, NumPy's and torch's global random states (CPU, and each CUDA device): what a
    checkpoint needs so a resumed run continues the streams instead of re-seeding them. Plain
    values and tensors only, so `torch.load(weights_only=True)` reads them."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray), type(keys)  # the legacy form: MT19937's 624 words
    return {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state(d) for d in range(torch.cuda.device_count())],
    }


def set_global_rng_states(states: dict[str, Any]) -> None:
    """Restore what `global_rng_states` returned (CUDA states only for devices present)."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    for device, state in enumerate(states["cuda"][: torch.cuda.device_count()]):
        torch.cuda.set_rng_state(state, device)


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with `count` torch intra-op threads (None: unchanged), then restore the
    count. Fixing it makes CPU float results reproducible across processes (multirun and
    in-process jigsaw learners are bit-identical), and one thread spares a greedy loop of tiny
    ops the threads' synchronisation."""
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(count))
    try:
        yield
    finally:
        torch.set_num_threads(before)


# Purposes of the derived random streams of selection (the first word of a SeedSequence key).
REPEAT_STREAM, RESELECT_STREAM = 1, 2


def derived_seed(seed: int, purpose: int, index: int) -> int:
    """A 32-bit seed for the `index`-th draw of `purpose` in the run of `seed`, from
    `numpy.random.SeedSequence(seed, spawn_key=(purpose, index))`: streams of different runs,
    purposes or indices share nothing (seed + index would give runs 0 and 1 nine of their ten
    GraNd warm-up models in common). Index 0 is the run's own seed, so the initial selection and
    the first pre-trained model stay what they always were."""
    if index == 0:
        return int(seed)
    sequence = np.random.SeedSequence(int(seed), spawn_key=(purpose, index))
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


def repeat_seed(seed: int, repeat: int) -> int:
    """The seed of the `repeat`-th model a selector averages over (GraNd's `repeats`)."""
    return derived_seed(seed, REPEAT_STREAM, repeat)


def reselect_seed(seed: int, epoch: int) -> int:
    """The seed of the selector's generator when it re-selects after `epoch` epochs."""
    return derived_seed(seed, RESELECT_STREAM, epoch)
