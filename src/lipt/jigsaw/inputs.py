"""What jigsaw_pretrain refuses before any training, each a ValueError of one line: data that is
no lipt data module the learners can train on, counts, shard sizes and a validation split that
cannot make n learners and score their soup, parts that are no instances of lipt.jigsaw.parts'
classes, and a model whose head has no name or one output, or whose forward does not give the
logits on the pool's first items. `head_name` names the head whose learners' copies come back.
"""

from __future__ import annotations

import copy
from numbers import Integral
from typing import Any

import torch
from torch import Tensor, nn

from lipt.core.errors import one_line
from lipt.data import LearnerData
from lipt.jigsaw.parts import Merge, NoAugment, Pruning, RandAugment
from lipt.selection.gradients import resolve_head


def check_pretrain_args(
    data: LearnerData,
    num_learners: int,
    batches_per_learner: int,
    local_epochs: int,
    min_learners: int | None = None,
    spell: str = "{}",
) -> None:
    """Raise ValueError for a learner count, shard size or epoch count that is not an integer
    >= 1, a `min_learners` outside 1..num_learners, data whose validation split (on which the
    soup is scored) is empty, or a pool too small for n x M minibatches. `spell`: how the
    caller's API names a keyword ("{}": as jigsaw_pretrain's; "jigsaw[{!r}]")."""
    for key, value in (
        ("num_learners", num_learners),
        ("batches_per_learner", batches_per_learner),
        ("local_epochs", local_epochs),
    ):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"{spell.format(key)} must be an integer >= 1, got {value!r}")
    if min_learners is not None and (
        isinstance(min_learners, bool)
        or not isinstance(min_learners, Integral)
        or not 1 <= min_learners <= num_learners
    ):
        raise ValueError(
            f"{spell.format('min_learners')} must be an integer in 1..num_learners "
            f"({num_learners}) or None (half of them), got {min_learners!r}"
        )
    if len(data.val_indices) == 0:
        raise ValueError(
            "the jigsaw soup is scored on the validation split, which is empty: give the data "
            "module one (PoolDataModule(..., val_size=0.1))"
        )
    needed = int(num_learners) * int(batches_per_learner) * data.batch_size
    if needed > len(data.pool_indices):
        raise ValueError(
            f"the jigsaw learners need {num_learners} x {batches_per_learner} minibatch(es) of "
            f"{data.batch_size} = {needed} distinct items, but the pool has "
            f"{len(data.pool_indices)}: lower {spell.format('num_learners')} or "
            f"{spell.format('batches_per_learner')}, or the data module's batch_size "
            "(lipt.PoolDataModule(..., batch_size=))"
        )


# jigsaw_pretrain's parts: the classes each keyword takes an instance of, and examples.
PARTS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "prune": (
        Pruning,
        'MagnitudePruning("omp", 0.85, 0.95), RandomPruning, SnipPruning, NoPruning',
    ),
    "merge": (Merge, 'GreedyInterpMerge("greedy_interp"), GreedyMerge, UniformMerge'),
    "augment": ((NoAugment, RandAugment), "NoAugment(), RandAugment()"),
}


def check_learner_data(data: Any) -> None:
    """ValueError unless `data` is a lipt data module the learners can train on (a
    PoolDataModule): a bare data set has no pool, validation split or shards."""
    needed = ("pool_indices", "val_indices", "batch_size", "shard_dataloader", "eval_loader")
    if not all(hasattr(data, name) for name in needed):
        raise ValueError(
            f"data must be a lipt data module, not a {type(data).__name__}: wrap your data set "
            "in lipt.PoolDataModule(dataset, val_size=0.1), whose validation split scores the soup"
        )


def check_parts(spell: str = "{}", **parts: Any) -> None:
    """Raise ValueError for a `prune`, `merge` or `augment` that is neither None (the default)
    nor an instance of lipt.jigsaw.parts' classes for it (a name, say: the config's spelling).
    `spell`: as check_pretrain_args's."""
    for key, value in parts.items():
        kinds, examples = PARTS[key]
        if value is not None and not isinstance(value, kinds):
            raise ValueError(
                f"{spell.format(key)} must be an instance of lipt.jigsaw.parts' {key} classes "
                f"({examples}) or None for the default, not {value!r}"
            )


def head_name(model: nn.Module, head: str | None = None) -> tuple[str, int]:
    """The name of `model`'s final nn.Linear and its out_features, the classes: `head`, else
    `model.classifier`, else the last nn.Linear (lipt.selection.gradients.resolve_head). The
    learners' heads are read from their weights by this name.

    Raises:
        ValueError: a `head` that is not a name, no such nn.Linear, one that is the model
            itself (it has no name), or one with fewer than 2 outputs (a logit per class).
    """
    if head is not None and not isinstance(head, str):
        # the learners are copies of factory()'s model: a layer object is in none of them
        raise ValueError(
            f"head must be the name of the model's final nn.Linear (a str such as "
            f'"net.head"), not a {type(head).__name__}'
        )
    layer = resolve_head(model, head)
    name = head if head is not None else next(n for n, m in model.named_modules() if m is layer)
    if not name:
        raise ValueError(
            "the model is itself an nn.Linear: wrap it (nn.Sequential(layer)) so its head has a "
            'name, and pass head="0"'
        )
    if layer.out_features < 2:
        raise ValueError(
            f"the model's head {name!r} has {layer.out_features} output: it must give a logit "
            "per class, at least 2; name the final classification layer with head="
        )
    return name, layer.out_features


def check_forward(init: nn.Module, data: LearnerData, head: str, classes: int, device: Any) -> None:
    """A copy of `init` in eval mode, on `device`, once over the first items of the pool: what
    the learners train with cross-entropy must be the logits, [batch, classes] for the head's
    `classes`. The copy leaves `init`, its buffers and the RNG as they were.

    Raises:
        ValueError: a forward that fails on the data's inputs (another dtype or shape, another
            device), returns something other than one tensor, or returns logits of another
            width than the head's outputs (the head named is not the model's final layer).
    """
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # a DataLoader draws a seed
        x = next(iter(data.eval_loader(data.pool_indices[:2])))[0]
        model = copy.deepcopy(init).to(device).eval()
        try:
            out = model(x.to(device))
        except Exception as e:
            raise ValueError(
                f"factory()'s model fails on the data's inputs ({type(e).__name__}: "
                f"{one_line(e)}): make its forward take a batch of the data set's inputs "
                f"({tuple(x.shape)}, {x.dtype}), its weights of their dtype"
            ) from e
    if not isinstance(out, Tensor):
        raise ValueError(
            f"factory()'s model returns a {type(out).__name__}: the jigsaw learners train its "
            f"output with cross-entropy, so its forward must return the logits [batch, {classes}]"
        )
    if out.shape != (len(x), classes):
        raise ValueError(
            f"factory()'s model returns {tuple(out.shape)} for a batch of {len(x)}, but its head "
            f"{head!r} has {classes} outputs: the head must be the model's final nn.Linear, "
            "whose outputs are the logits; name it with head="
        )
