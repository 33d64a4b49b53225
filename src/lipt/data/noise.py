"""Wrong labels as a data condition: seeded label noise (`dataset.label_noise`) and a user's own
labels for the training split (`dataset.train_labels`, e.g. CIFAR-10N's human labels).

Both replace the training split's labels before anything reads them, so the pool and the
validation split carry them as a user's would; the test split stays as the reader gives it.
Which items differ from the reader's labels is kept (`LabelChanges`): what label-issue detection
is scored against (lipt.cleaning).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from lipt.core.seeding import generator

NoiseKind = Literal["symmetric", "pairs"]

NPY_MAGIC = b"\x93NUMPY"  # the first bytes of every .npy file (numpy.lib.format)


def pair_map(num_classes: int, pairs: list[int] | None) -> Tensor:
    """Each class's confusable class, [C] int64: `pairs` as given (class c flips to pairs[c]),
    or c -> c + 1 mod C where the data set names none."""
    if pairs is None:
        return (torch.arange(num_classes) + 1) % num_classes
    if len(pairs) != num_classes:
        raise ValueError(f"pairs needs one class per class ({num_classes}), got {len(pairs)}")
    target = torch.tensor(pairs, dtype=torch.int64)
    if int(target.min()) < 0 or int(target.max()) >= num_classes:
        raise ValueError(f"pairs names classes outside 0..{num_classes - 1}: {pairs}")
    if bool((target == torch.arange(num_classes)).any()):
        raise ValueError(f"pairs maps a class to itself: {pairs}; name another class for each")
    return target


def flip_labels(
    labels: Tensor,
    num_classes: int,
    rate: float,
    kind: NoiseKind,
    seed: int,
    pairs: list[int] | None = None,
) -> Tensor:
    """`labels` [N] int64 with round(rate * N) of them, drawn at random, made wrong: `symmetric`
    gives each a uniformly drawn other class, `pairs` its class's confusable class
    (`pair_map`). The draw depends on (N, rate, kind, seed) alone, not on the run's seed, so
    runs with different seeds train on the same noisy labels, and it is independent of the
    validation split's draw, so the pool and the validation split are wrong alike."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"rate must be in [0, 1), got {rate}")
    if kind not in ("symmetric", "pairs"):
        raise ValueError(f"kind must be symmetric or pairs, got {kind!r}")
    n = labels.shape[0]
    # Its own stream: a plain manual_seed(seed) would draw the validation split's permutation
    # (DataModule: randperm with split_seed), making every validation label wrong.
    g = generator(seed, "label_noise")
    flipped = torch.randperm(n, generator=g)[: round(rate * n)]  # [F] positions made wrong
    noisy = labels.clone()
    if kind == "pairs":
        noisy[flipped] = pair_map(num_classes, pairs)[labels[flipped]]
    else:
        # An offset in 1..C-1 never lands on the true class and is uniform over the others.
        offset = torch.randint(1, num_classes, (len(flipped),), generator=g)
        noisy[flipped] = (labels[flipped] + offset) % num_classes
    assert bool((noisy[flipped] != labels[flipped]).all())
    return noisy


def read_train_labels(path: Path, num_classes: int) -> Tensor:
    """A `.npy` of integer labels, [N], as int64; ValueError saying what is wrong with it
    (not a .npy of integers, not one-dimensional, a class outside 0..num_classes-1)."""
    save = "save the labels with numpy.save(path, labels)"
    try:
        with open(path, "rb") as f:
            magic = f.read(len(NPY_MAGIC))
    except OSError as e:
        raise ValueError(f"{path} cannot be read ({e.strerror or e})") from e
    if magic.startswith(b"PK"):  # np.load opens a zip as an archive of arrays, not an array
        raise ValueError(
            f"{path} is a zip archive (a .npz, or torch.save's .pt), not a .npy; {save}"
        )
    if magic != NPY_MAGIC:
        raise ValueError(f"{path} is not a .npy file (it lacks numpy's header); {save}")
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"{path} is not a readable .npy file ({e}); {save}") from e
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{path} holds {array.dtype} values; save integer class labels")
    if array.ndim != 1:
        raise ValueError(f"{path} has shape {array.shape}; save one label per item, shape [N]")
    if array.size and (int(array.min()) < 0 or int(array.max()) >= num_classes):
        raise ValueError(
            f"{path} has labels {int(array.min())}..{int(array.max())}, outside the "
            f"{num_classes} classes 0..{num_classes - 1}"
        )
    return torch.from_numpy(array.astype(np.int64))


@dataclass(frozen=True)
class LabelChanges:
    """The training split's labels as the reader gave them and as the run trains on them."""

    original: Tensor  # [N] int64
    given: Tensor  # [N] int64

    @property
    def wrong(self) -> Tensor:
        """[N] bool: the items whose given label is not the reader's."""
        return self.given != self.original
