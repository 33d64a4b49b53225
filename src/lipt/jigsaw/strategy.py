"""LiPT's jigsaw pre-training end to end: independent weak learners merged into one soup.

Ro et al., "Lowering the Pre-training Tax for Gradient-based Subset Training" (ICML 2023,
https://proceedings.mlr.press/v202/ro23a.html), sections 3.2-3.3. From ONE common initial model
(the seeded init), learner i

1. gets its own shard of M minibatches of B samples, disjoint from every other learner's
   (lipt.jigsaw.shards: one seeded permutation of the pool, cut into n pieces);
2. trains a copy of the init on it for K passes in its own Lightning ``Trainer(devices=1)``, with
   RandAugment (group ``augment``) and the SGD settings of ``pretrain.optim`` (learner.py);
3. is pruned once, at its own density drawn from U[low, high] (group ``prune``).

Learners never communicate. The soup (group ``merge``, merge.py) is scored by held-out accuracy
on the validation split carved from the training set, never the test set.

Everything random about learner i is a function of (seed, i) alone (lipt.core.seeding.derive_seed),
never of the global RNG state left by earlier learners, so a learner trained by a job of a
multirun (`run_learner_job`, one process per job) equals the one trained in-process
(`pretrain_jigsaw`), and `merge_learner_dir` (called by the soup callback,
lipt.run.hydra_callbacks.SoupCallback, when the sweep ends) makes the same soup. This module
reads top to bottom as the stage runs: learners, soup, and a multirun job's learners;
lipt.stages.jigsaw builds what these take from a Run (the wiring of the multirun's halves).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor, nn

from lipt.core.artifacts import SHARED_FOLDER_GRACE_S, remove_stale_temporaries
from lipt.core.errors import UserError
from lipt.core.seeding import torch_threads
from lipt.data import DataModule
from lipt.jigsaw.api import train_and_merge
from lipt.jigsaw.checkpoints import learner_dir, learner_file, load_learners, train_or_reuse
from lipt.jigsaw.context import PretrainContext, Pretrained
from lipt.jigsaw.learner import Learner, learner_shard
from lipt.jigsaw.merge import learner_ids_by_status, merge_learners, soup_result
from lipt.jigsaw.parts import JigsawSettings

log = logging.getLogger(__name__)

__all__ = [
    "JigsawPretraining",
    "check_saved_seeds",
    "check_seed_folders",
    "merge_saved",
    "pretrain_jigsaw",
    "seed_folder",
    "train_learner_group",
]


@dataclass(frozen=True)
class JigsawPretraining(JigsawSettings):
    """`pretrain=jigsaw`: the strategy lipt.stages.pretrain runs (configs/pretrain/jigsaw.yaml)."""

    def __call__(
        self, ctx: PretrainContext, dm: DataModule, model: nn.Module, seed: int
    ) -> Pretrained:
        return pretrain_jigsaw(ctx, self, dm, model, seed)

    def describe(self, ctx: PretrainContext, pool_size: int) -> str:
        """n learners x M batches x K passes, augmentation, pruning and soup; or the folder a
        soup is merged from."""
        if self.merge_from:
            return (
                f"pre-training: merging the jigsaw learners saved in {self.merge_from} "
                f"({ctx.merge.name})"
            )
        batches = int(self.batches_per_learner)
        pieces = [
            f"{self.num_learners} learners x {batches} batch{'es' if batches > 1 else ''} x "
            f"{self.local_epochs} passes"
        ]
        if ctx.augment.name != "none":
            pieces.append({"randaugment": "RandAugment"}.get(ctx.augment.name, ctx.augment.name))
        prune = ctx.prune
        if prune.name != "none":
            pieces.append(f"{prune.name.upper()} {prune.density_low}-{prune.density_high}")
        pieces.append(f"soup {ctx.merge.name}")
        return "pre-training: jigsaw, " + ", ".join(pieces)


def pretrain_jigsaw(
    ctx: PretrainContext, settings: JigsawSettings, dm: DataModule, model: nn.Module, seed: int
) -> Pretrained:
    """All n learners in this process from the common init `model`, then the soup.

    Returns the soup (a dense copy of `model`), the samples all learners passed forward and
    backward (n*K*M*B, plus SNIP's batches), the n*M*B distinct samples of their shards and the
    merge report; each learner's checkpoint is written to the learner folder as it finishes, and
    one already there with this recipe is reused. With `pretrain.merge_from`, merges the learner
    checkpoints saved there instead of training.
    """
    if settings.learner_ids() is not None:
        raise UserError(
            "pretrain.learners selects learners for the jobs of a `pretrain.py -m` sweep; "
            "drop it (null) to train and merge all learners in this run"
        )
    if settings.merge_from:
        folder = seed_folder(Path(str(settings.merge_from)).expanduser(), seed, ctx.run_seed)
        return merge_saved(ctx, settings, dm, model, seed, folder)
    folder = seed_folder(learner_dir(ctx, settings, shared=False), seed, ctx.run_seed)
    # A killed attempt's half-written learner files (a pretrain.learner_dir other jobs may share).
    remove_stale_temporaries(folder, SHARED_FOLDER_GRACE_S)

    def train_one(i: int, shard: Tensor) -> Learner:
        # a pretrain.learner_dir of the user's may hold other runs' learners: never replaced
        shared = bool(settings.learner_dir)
        return train_or_reuse(ctx, settings, dm, model, seed, i, shard, folder, shared)

    result, _ = train_and_merge(ctx, settings, dm, model, seed, train_one)
    return result


def seed_folder(folder: Path, seed: int, run_seed: int) -> Path:
    """Where the learners of `seed` are kept in a learner folder: the folder itself for the
    run's own seed, `seed_<seed>` in it for another model of `selector.repeats` (each seed's
    learners apart); `pretrain.merge_from` reads them where a run wrote them."""
    return folder if seed == run_seed else folder / f"seed_{seed}"


def check_saved_seeds(settings: JigsawSettings, seeds: list[int], run_seed: int) -> None:
    """Before any merge: `check_seed_folders` for the run's `pretrain.merge_from`."""
    check_seed_folders(settings.merge_from, seeds, run_seed)


def check_seed_folders(merge_from: str | None, seeds: list[int], run_seed: int) -> None:
    """With `pretrain.merge_from`, every seed of `seeds` (the models `selector.repeats`
    averages) other than the run's own must have a learner checkpoint in its folder
    (`seed_folder`); the run's own seed is merged from the folder itself, whose missing
    learners the merge names. lipt.run.rules checks a config with it before any work (a dry
    run too).

    Raises:
        UserError: a seed without one, named with the folder it was looked for in.
    """
    if not merge_from:
        return
    root = Path(str(merge_from)).expanduser()
    for seed in seeds:
        folder = seed_folder(root, seed, run_seed)
        if seed != run_seed and not any(folder.glob("learner_*.ckpt")):
            raise UserError(
                f"pretrain.merge_from={merge_from} holds no learners of seed {seed} "
                f"(looked in {folder}): each of the {len(seeds)} models of selector.repeats is "
                "merged from learners of its own seed, which a run with selector.repeats "
                "writes to seed_<seed> in its learner folder; drop selector.repeats, or "
                "pretrain.merge_from to train them"
            )


def merge_saved(
    ctx: PretrainContext,
    settings: JigsawSettings,
    dm: DataModule,
    init: nn.Module,
    seed: int,
    folder: Path,
) -> Pretrained:
    """The soup of the learner checkpoints in `folder`, merged exactly as `pretrain_jigsaw`
    merges; samples and unique samples are those the saved learners recorded."""
    learners = load_learners(ctx, settings, dm, seed, folder)
    missing = learner_ids_by_status(learners)["missing"]  # no file there, or an unreadable one
    absent = [i for i in missing if not (folder / learner_file(i)).is_file()]
    unreadable = [i for i in missing if i not in absent]
    if absent:
        log.warning(
            "jigsaw learners %s have no checkpoint in %s (their jobs died or did not run); "
            "re-running the same sweep trains only them",
            absent,
            folder,
        )
    if unreadable:
        log.warning(
            "jigsaw learners %s have an unreadable checkpoint in %s (truncated, or not a "
            "checkpoint); re-running the same sweep trains them again",
            unreadable,
            folder,
        )
    with torch_threads(settings.num_threads):
        soup, report = merge_learners(ctx, settings, dm, init, seed, learners)
    report["learner_dir"] = str(folder)
    return soup_result(soup, learners, report, ctx.head, trained_here=False)


def train_learner_group(
    ctx: PretrainContext,
    settings: JigsawSettings,
    dm: DataModule,
    init: nn.Module,
    seed: int,
    ids: list[int],
) -> tuple[list[Learner], Path]:
    """One job of a multirun (`pretrain.learners=<ids>`): only its learners, each on its own
    shard, their checkpoints written to the learner folder all jobs share (a re-run of the sweep
    trains only those it has no checkpoint of). Returns them and that folder."""
    folder = learner_dir(ctx, settings, shared=True)
    # A killed job's half-written learner files; another job's, being written now, are locked
    # (and young: the locks of a cluster file system may not reach across nodes).
    remove_stale_temporaries(folder, SHARED_FOLDER_GRACE_S)
    learners = []
    with torch_threads(settings.num_threads):
        for i in ids:
            shard = learner_shard(settings, dm, seed, i)
            learner = train_or_reuse(ctx, settings, dm, init, seed, i, shard, folder, shared=True)
            learners.append(learner)
    return learners, folder
