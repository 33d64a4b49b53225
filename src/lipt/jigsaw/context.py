"""What a pre-training strategy receives (`PretrainContext`) and returns (`Pretrained`), and the
payload of pretrain.ckpt: the contract (`Strategy`) between stage 1 (lipt.stages.pretrain, which
builds the context from the config through lipt.stages.build) and any strategy of the `pretrain`
group (jigsaw's, the full warm-up, none), or the Python API (lipt.jigsaw.api)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import lightning as L
import torch
from torch import Tensor, nn

from lipt.data import DataModule
from lipt.jigsaw.parts import Merge, NoAugment, Pruning, RandAugment
from lipt.models.classifier import Classifier
from lipt.selection.types import LearnerHeads


@dataclass(frozen=True)
class PretrainContext:
    """What a pre-training strategy needs of the run, built from the config by the stage
    (lipt.stages.build.build_parts) or by the Python API (lipt.jigsaw.api)."""

    data_name: str
    num_classes: int
    model_config: dict[str, Any]  # the `model` node, resolved: checkpoints record it
    pretrain_name: str
    run_seed: int  # `seed` (a strategy may run from another one: selector.repeats)
    fraction: float
    main_epochs: int  # trainer.max_epochs of main training
    device: torch.device  # where held-out scoring runs
    run_dir: Callable[[], Path]  # the run folder (the API has none: asking fails)
    classifier: Callable[..., Classifier]  # (model, **optim overrides) -> Lightning module
    trainer: Callable[..., L.Trainer]  # (**overrides) -> a quiet single-device trainer
    augment: NoAugment | RandAugment
    prune: Pruning
    merge: Merge
    # The `optimizer` node, resolved: each learner's optimiser is it at pretrain.optim's lr and
    # weight decay, and its checkpoint records both.
    optimizer: dict[str, Any] = field(default_factory=dict)
    # The `trainer` node, resolved: `trainer` builds each learner's trainer from it, and a
    # learner's checkpoint records the keys that change its weights (precision, max_steps, ...).
    trainer_config: dict[str, Any] = field(default_factory=dict)
    # The model's final nn.Linear, by name: the learners' heads (None: `classifier`, lipt's
    # models', else the last nn.Linear, lipt.selection.gradients.resolve_head).
    head: str | None = None


@dataclass
class Pretrained:
    """Stage 1's result: a pre-trained model and what it cost."""

    model: nn.Module
    seconds: float = 0.0
    samples: int = 0  # training samples passed forward and backward
    unique_samples: int = 0  # distinct training-set items read
    report: dict[str, Any] = field(default_factory=dict)  # e.g. the jigsaw merge report
    # Further counts for summary.json, e.g. jigsaw's learners_merged / learners_failed.
    counts: dict[str, int] = field(default_factory=dict)
    # The jigsaw learners' final layers, handed to selection (and saved in pretrain.ckpt) so a
    # selector can use the learners' ensemble without running them again.
    learner_heads: LearnerHeads | None = None
    # Each head's learner's shard (positions in the training split), in the heads' order: the
    # rows a head has trained on (label cleaning leaves them out). None: not known here.
    head_shards: list[Tensor] | None = None
    trained: bool = True  # False: the common initial model as it is (pretrain=none)
    # Jigsaw's parts of `seconds`: the learners' training (in this process; a learner reused
    # from a checkpoint counts the seconds it took then) and the merge (held-out scoring of the
    # learners and candidate soups, BatchNorm re-estimates, the soup). None: not measured here.
    learner_seconds: float | None = None
    merge_seconds: float | None = None
    # The training seconds of the learners an earlier attempt saved and this one reused: the
    # stage adds them to this attempt's wall time, so `seconds` is the whole stage's cost.
    reused_seconds: float = 0.0

    def stats(self) -> dict[str, Any]:
        """summary.json's stages.pretrain."""
        parts = {"learner_seconds": self.learner_seconds, "merge_seconds": self.merge_seconds}
        return {
            "seconds": round(self.seconds, 3),
            **{name: round(value, 3) for name, value in parts.items() if value is not None},
            "samples": self.samples,
            "unique_samples": self.unique_samples,
            **self.counts,
        }


class Strategy(Protocol):
    """A `pretrain` option (`_target_`): pre-train from the common initial `model` of `seed`."""

    def __call__(
        self, ctx: PretrainContext, dm: DataModule, model: nn.Module, seed: int
    ) -> Pretrained: ...

    def describe(self, ctx: PretrainContext, pool_size: int) -> str:
        """The line that opens pre-training: the strategy and its parts."""
        ...


def pretrain_payload(
    ctx: PretrainContext, dm: DataModule, model: nn.Module, heads: LearnerHeads | None = None
) -> dict[str, Any]:
    """pretrain.ckpt: tensors and plain values only (loadable with weights_only=True)."""
    payload: dict[str, Any] = {
        "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "model": ctx.model_config,
        "data": ctx.data_name,
        "split": data_split(dm),
        "num_classes": ctx.num_classes,
        "pretrain": ctx.pretrain_name,
        "seed": ctx.run_seed,
    }
    if heads is not None:
        payload["learner_heads"] = {"weight": heads.weight, "bias": heads.bias}
    return payload


def data_split(dm: DataModule) -> dict[str, Any]:
    """How the training split was divided and labelled for a pre-training, as pretrain.ckpt
    records it: a run that loads the model with another validation split would select with a
    model trained on its validation rows."""
    return {
        "val_size": dm.val_size,
        "split_seed": int(dm.split_seed),
        "pool_size": len(dm.pool_indices),
        "labels": pool_labels_digest(dm),
    }


def pool_labels_digest(dm: DataModule) -> str:
    """The pool's labels as a short digest: a model or learner trained on other labels (another
    label_noise, train_labels or cleaning) is not this pool's, even with every setting equal."""
    labels = dm.train_source.labels[dm.pool_indices]  # [pool]
    return hashlib.sha256(labels.long().cpu().numpy().tobytes()).hexdigest()[:16]


def heads_from_payload(payload: dict[str, Any]) -> LearnerHeads | None:
    """The learner heads a pretrain.ckpt carries (None: not a jigsaw checkpoint)."""
    heads = payload.get("learner_heads")
    return None if heads is None else LearnerHeads(heads["weight"], heads["bias"])
