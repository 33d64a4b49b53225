"""Jigsaw pre-training for any model and data: `jigsaw_pretrain(factory, data)` trains n learners
from one common init (`factory()` under the seed) on disjoint shards of the pool, prunes each
once and merges them into a greedy soup scored on the validation split (README.md in this
folder has the method). Each learner is the model inside lipt's `Classifier` (cross-entropy, SGD
with a cosine schedule) on a single device.

`train_and_merge` is the one path of the learners and the soup: lipt's own stage
(lipt.jigsaw.strategy, `pretrain=jigsaw`) calls it too, with learner checkpoints on disk.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from numbers import Integral, Real
from typing import Any, cast

import lightning as L
import torch
from torch import Tensor, nn

from lipt.core import console
from lipt.core.errors import one_line
from lipt.core.schema import check_mapping, fields_of
from lipt.core.seeding import torch_threads
from lipt.core.settings import LearnerOptim
from lipt.data import LearnerData
from lipt.jigsaw.context import PretrainContext, Pretrained
from lipt.jigsaw.inputs import (
    PARTS,
    check_forward,
    check_learner_data,
    check_parts,
    check_pretrain_args,
    head_name,
)
from lipt.jigsaw.learner import Learner, learner_shards, quiet_lightning, train_learner
from lipt.jigsaw.merge import HeldOut, bn_positions, merge_learners, soup_result
from lipt.jigsaw.parts import (
    GreedyInterpMerge,
    JigsawSettings,
    MagnitudePruning,
    Merge,
    NoAugment,
    Pruning,
    RandAugment,
)
from lipt.models.classifier import PAPER_SGD, QUIET_TRAINER, Classifier
from lipt.models.schedules import LEARNER_SCHEDULES
from lipt.selection.api import seed_of

# (learner id, its shard) -> the trained, pruned learner
TrainOne = Callable[[int, Tensor], Learner]


def train_and_merge(
    ctx: PretrainContext,
    settings: JigsawSettings,
    dm: LearnerData,
    init: nn.Module,
    seed: int,
    train_one: TrainOne | None = None,
) -> tuple[Pretrained, list[Learner]]:
    """All n learners in this process from the common `init`, then the soup: the soup (a dense
    copy of `init`), its cost and merge report, the learners' heads; and the learners.
    `train_one`: how learner i is obtained (default: trained now, `train_learner`; the stage
    reuses or writes checkpoints)."""
    if train_one is None:

        def train_one(i: int, shard: Tensor) -> Learner:
            return train_learner(ctx, settings, dm, init, seed, i, shard)

    with torch_threads(settings.num_threads):
        shards = learner_shards(settings, dm, seed)
        # Built before training so each learner is scored as it finishes (for the bar and the
        # log); the soup reuses those scores, so the merge computes exactly what it did before.
        positions = bn_positions(settings, ctx.merge, dm, seed)
        evaluate = HeldOut(ctx.merge, ctx.device, dm, init, seed, positions)
        learners = []
        with console.progress("pre-training: learners", len(shards)) as step:
            for i, shard in enumerate(shards):
                learners.append(train_one(i, shard))
                score = evaluate.score_learner(learners[-1])
                shown = "left out" if score is None else f"held-out {score:.3f}"
                console.detail.info("learner %d/%d: %s", i + 1, len(shards), shown)
                step(info=f"learner {i}: {shown}")
        soup, report = merge_learners(ctx, settings, dm, init, seed, learners, evaluate)
    return soup_result(soup, learners, report, ctx.head, trained_here=True), learners


def learner_trainer(accelerator: str, **overrides: Any) -> L.Trainer:
    """A quiet single-device trainer: no logger, no checkpoints, no bars, no validation."""
    return L.Trainer(**{"accelerator": accelerator, "devices": 1, **QUIET_TRAINER, **overrides})


def check_accelerator(accelerator: str) -> None:
    """Raise ValueError for an `accelerator` the learners' trainer cannot run on here: a name
    Lightning does not know (`"cuda:0"`: the learners take one device, `"cuda"`), or a device
    this machine lacks (`"gpu"` without CUDA). Lightning would refuse it in every learner, each
    left out as failed, and the soup would find none to merge."""
    try:
        with quiet_lightning():
            learner_trainer(accelerator)
    except Exception as e:
        raise ValueError(
            f"accelerator={accelerator!r} cannot train the learners here ({one_line(e)}): give "
            '"cpu", "gpu" (or "cuda") on a machine with CUDA, or "auto"'
        ) from e


def check_optim(optim: Any, spell: str = "{}") -> None:
    """Raise ValueError for an `optim` that is not None or a mapping of the learners' optimiser
    settings (lipt.core.settings.LearnerOptim: lr, weight_decay, scheduler) in their ranges.
    `spell`: as check_pretrain_args's."""
    name = spell.format("optim")
    if optim is None:
        return
    if not isinstance(optim, Mapping):
        raise ValueError(
            f"{name} must be a dict of the learners' lr, weight_decay and scheduler, or None, "
            f"not {optim!r}"
        )
    declared = fields_of(LearnerOptim)
    assert declared is not None, "LearnerOptim is a TypedDict"
    check_mapping(name, {k: _plain(v) for k, v in optim.items()}, declared, False)


def check_jigsaw_keywords(data: LearnerData, keywords: Mapping[str, Any], spell: str) -> None:
    """`check_pretrain_args` and `check_parts` on the keywords a caller will hand
    jigsaw_pretrain, its defaults for those not given (lipt.find_label_issues's `jigsaw=`,
    spelled `spell`)."""
    defaults = {
        key: param.default
        for key, param in inspect.signature(jigsaw_pretrain).parameters.items()
        if key in ("num_learners", "batches_per_learner", "local_epochs", "min_learners")
    }
    given = {**defaults, **{k: v for k, v in keywords.items() if k in defaults}}
    check_pretrain_args(data, **given, spell=spell)
    check_parts(spell, **{k: v for k, v in keywords.items() if k in PARTS})
    check_optim(keywords.get("optim"), spell)


def _common_init(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    """`factory()` under `seed`, the learners' common init; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        init = factory()
    if not isinstance(init, nn.Module):
        raise ValueError(f"factory must return an nn.Module, not {type(init).__name__}")
    return init


def _scoring_device(accelerator: str) -> torch.device:
    """Where held-out scoring runs for `accelerator`: CUDA for "gpu" and "cuda", and for "auto"
    where CUDA is available; else the CPU."""
    device = torch.device("cuda" if accelerator in ("gpu", "cuda") else "cpu")
    if accelerator == "auto" and torch.cuda.is_available():
        device = torch.device("cuda")
    return device


def _paper_classifier(classes: int) -> Callable[..., Classifier]:
    """The context's `classifier` for a `classes`-way model: (model, **optim) -> a learner's
    Lightning module."""

    def classifier(
        model: nn.Module,
        lr: float | None = None,
        weight_decay: float | None = None,
        scheduler: str | None = None,
        **options: Any,
    ) -> Classifier:
        # A learner's `optim` (lr, weight_decay, scheduler) on the paper's SGD and cosine.
        sgd = {"lr": lr, "weight_decay": weight_decay}
        optimizer = functools.partial(PAPER_SGD, **{k: v for k, v in sgd.items() if v is not None})
        schedule = LEARNER_SCHEDULES[scheduler] if scheduler is not None else None
        return Classifier(model, classes, optimizer=optimizer, scheduler=schedule, **options)

    return classifier


def _plain(value: Any) -> Any:
    """A number as Python's int or float (a numpy scalar, say, of a sweep drawn with numpy,
    which the settings' checks do not know); anything else as it is."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return value
    return int(value) if isinstance(value, Integral) else float(value)


def _no_run_dir() -> Any:
    """The context's `run_dir`: never asked for, the API's learners stay in memory."""
    raise AssertionError("jigsaw_pretrain keeps its learners in memory")


def jigsaw_pretrain(
    factory: Callable[[], nn.Module],
    data: LearnerData,
    *,
    num_learners: int = 10,
    batches_per_learner: int = 1,
    local_epochs: int = 10,
    prune: Pruning | None = None,
    merge: Merge | None = None,
    augment: NoAugment | RandAugment | None = None,
    head: str | None = None,
    optim: dict[str, Any] | None = None,
    min_learners: int | None = None,
    seed: int = 0,
    accelerator: str = "cpu",
) -> Pretrained:
    """The jigsaw soup of `factory()`'s model on the pool of `data` (a `PoolDataModule` with a
    validation split, on which the soup is scored).

    n = `num_learners` learners, each on its own M = `batches_per_learner` minibatches of the
    pool for K = `local_epochs` passes, with `optim` (the paper's SGD at its `lr` and
    `weight_decay`, and its `scheduler`: cosine, linear or constant), then pruned once by `prune`
    (default: global magnitude pruning at a density from U[0.85, 0.95]); `merge` (default:
    greedy interpolation, `merge=greedy_interp`) makes the soup. `augment`: NoAugment (the
    default: the data set's own transforms augment the shards) or lipt's RandAugment (lipt's
    image data only). `head`: the name of the model's final nn.Linear, whose learners' copies
    come back as `learner_heads` (default: `model.classifier`, else the model's last
    nn.Linear). `accelerator`: where learners train and the soup is scored.

    Returns lipt.jigsaw.context.Pretrained: `.model` the soup, `.learner_heads`, `.report`
    (every learner's and candidate soup's held-out score), `.samples`, `.counts`.

    Raises:
        ValueError: before any training, for `data` that is not a lipt data module, a `seed`
            that is not an integer, an `optim` other than a dict of lr, weight_decay and
            scheduler in their ranges, a factory whose model has no nn.Linear `head`
            (or one with a single output), whose forward fails on the pool's first items or
            returns other than the logits [batch, the head's outputs], a `prune`, `merge` or
            `augment` that is not an instance of its lipt.jigsaw.parts classes, data without a
            validation split, a pool too small for n x M minibatches, counts that are not
            integers >= 1, a `min_learners` outside 1..`num_learners`, or an `accelerator`
            Lightning cannot run here (an unknown name, a GPU on a machine without one); and for
            fewer than `min_learners` (default: half) usable learners at the end.
    """
    check_learner_data(data)
    check_pretrain_args(data, num_learners, batches_per_learner, local_epochs, min_learners)
    check_parts(prune=prune, merge=merge, augment=augment)
    check_optim(optim)
    seed = seed_of(seed)
    check_accelerator(accelerator)
    init = _common_init(factory, seed)
    head, classes = head_name(init, head)
    device = _scoring_device(accelerator)
    check_forward(init, data, head, classes, device)
    ctx = PretrainContext(
        data_name=type(data).__name__,
        num_classes=classes,
        model_config={},
        pretrain_name="jigsaw",
        run_seed=seed,
        fraction=1.0,
        main_epochs=1,
        device=device,
        run_dir=_no_run_dir,
        classifier=_paper_classifier(classes),
        trainer=lambda **overrides: learner_trainer(accelerator, **overrides),
        augment=NoAugment() if augment is None else augment,
        prune=MagnitudePruning("omp", 0.85, 0.95) if prune is None else prune,
        merge=GreedyInterpMerge("greedy_interp") if merge is None else merge,
        head=head,
    )
    settings = JigsawSettings(
        num_learners=int(num_learners),
        batches_per_learner=int(batches_per_learner),
        local_epochs=int(local_epochs),
        optim=cast(LearnerOptim, {k: _plain(v) for k, v in optim.items()}) if optim else None,
        min_learners=None if min_learners is None else int(min_learners),
    )
    learner_shards(settings, data, seed)  # what the shards refuse fails here, before any learner
    result, _ = train_and_merge(ctx, settings, data, init, seed)
    return result
