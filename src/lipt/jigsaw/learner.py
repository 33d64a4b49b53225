"""One jigsaw learner: its shard, its training from the common init, its pruning.

Ro et al., ICML 2023, https://proceedings.mlr.press/v202/ro23a.html, sections 3.2-3.3. Learner i
trains a copy of the common initial model on its own shard of M minibatches of B samples for K
passes (RandAugment, `pretrain.optim`), then is pruned once at its own density. Everything
random about it is a function of (seed, i) alone (lipt.core.seeding.derive_seed), so a multirun job
trains the same learner as the in-process stage.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lipt.core import console
from lipt.core.errors import UserError
from lipt.core.seeding import derive_seed, generator, seeded
from lipt.data import LearnerData
from lipt.jigsaw.context import PretrainContext
from lipt.jigsaw.parts import JigsawSettings
from lipt.jigsaw.pruning import draw_density
from lipt.jigsaw.shards import make_shards, shard_for_learner
from lipt.jigsaw.weights import StateDict, is_finite_state_dict
from lipt.models.classifier import DivergedError

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- shards


def shard_sizes(settings: JigsawSettings, dm: LearnerData) -> tuple[int, int, int, int]:
    """(pool size, n, M, B): what lipt.jigsaw.shards cuts the pool by."""
    return (
        len(dm.pool_indices),
        int(settings.num_learners),
        int(settings.batches_per_learner),
        dm.batch_size,
    )


def learner_shards(settings: JigsawSettings, dm: LearnerData, seed: int) -> list[Tensor]:
    """Every learner's shard, as positions in the original training split."""
    try:
        shards = make_shards(*shard_sizes(settings, dm), generator=generator(seed, "shards"))
    except ValueError as e:
        raise UserError(str(e)) from e
    return [dm.pool_indices[s] for s in shards]


def learner_shard(settings: JigsawSettings, dm: LearnerData, seed: int, learner: int) -> Tensor:
    """Learner `learner`'s shard alone (a multirun job reads only this): equal to
    ``learner_shards(settings, dm, seed)[learner]``."""
    try:
        shard = shard_for_learner(
            *shard_sizes(settings, dm), learner, generator=generator(seed, "shards")
        )
    except ValueError as e:
        raise UserError(str(e)) from e
    return dm.pool_indices[shard]


# --------------------------------------------------------------------------- the learner


@dataclass
class Learner:
    """One jigsaw learner: its shard, its pruned weights and what it cost.

    status: "ok" (an ingredient), "diverged" (non-finite weights), "failed" (training raised) or
    "missing" (a multirun job wrote no readable checkpoint). Only "ok" learners are merged.
    """

    id: int
    shard: Tensor  # positions in the original training split
    state_dict: StateDict | None = None
    init_digest: str = ""
    density: float = 1.0
    samples: int = 0  # forward+backward samples: K*M*B, plus one batch for SNIP
    seconds: float = 0.0
    status: str = "ok"
    error: str | None = None
    reused: bool = False  # read from an earlier attempt's checkpoint, not trained in this process

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "density": None if self.state_dict is None else round(self.density, 6),
            "nonzero_prunable": self.nonzero_prunable,
            "samples": self.samples,
            "unique_samples": len(self.shard),
            "seconds": round(self.seconds, 3),
            "error": self.error,
        }

    @property
    def nonzero_prunable(self) -> int | None:
        """Non-zero conv/linear weights (rank >= 2 tensors named *weight) after pruning."""
        if self.state_dict is None:
            return None
        return sum(
            int(torch.count_nonzero(t))
            for key, t in self.state_dict.items()
            if key.endswith("weight") and t.ndim >= 2
        )


def reused_seconds(learners: Iterable[Learner]) -> float:
    """The training seconds of the learners read from an earlier attempt's checkpoints: part of
    a stage's cost though not of this process's wall time."""
    return sum(le.seconds for le in learners if le.reused)


def state_digest(state_dict: StateDict) -> str:
    """sha256 of a state dict's names and bytes: learners must all start from this one init."""
    h = hashlib.sha256()
    for key, value in state_dict.items():
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def state_dict_cpu(model: nn.Module) -> StateDict:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Ten learners would print Lightning's device banner and data-loader hints ten times."""
    names = ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda")
    with console.loggers_at(logging.WARNING, *names), warnings.catch_warnings():
        # Expected for a learner (few workers, no val loader) and Lightning-internal.
        for message in ("does not have many workers", "no `val_dataloader`", "treespec"):
            warnings.filterwarnings("ignore", message=f".*{message}.*")
        yield


def train_learner(
    ctx: PretrainContext,
    settings: JigsawSettings,
    dm: LearnerData,
    init: nn.Module,
    seed: int,
    learner: int,
    shard: Tensor,
) -> Learner:
    """Train a copy of `init` on `shard` for K passes, then prune it. A learner that raises is
    returned with status "failed" (and a warning); one whose loss or weights go non-finite as
    "diverged" (it stops at the first non-finite loss)."""
    start = time.perf_counter()
    model = copy.deepcopy(init)
    result = Learner(id=learner, shard=shard, init_digest=state_digest(model.state_dict()))
    module = ctx.classifier(model, **settings.learner_optim())
    try:
        with seeded(derive_seed(seed, "learner", learner)), quiet_lightning():
            # Classifier.training_step stops a learner at its first non-finite loss.
            trainer = ctx.trainer(max_epochs=int(settings.local_epochs))
            loader = dm.shard_dataloader(shard, ctx.augment.randaugment())
            trainer.fit(module, train_dataloaders=loader)
        result.samples = module.samples_seen
        result.density, extra = prune_learner(ctx, dm, model, seed, learner, shard)
        result.samples += extra
    except DivergedError as e:  # kept (its checkpoint says so): a re-run would diverge again
        result.status = "diverged"
        result.error = f"non-finite loss (loss {e.loss} at step {e.step})"
        result.samples = module.samples_seen
        result.state_dict = state_dict_cpu(model)
        result.seconds = time.perf_counter() - start
        log.warning("jigsaw learner %d diverged (%s) and is left out", learner, result.error)
        return result
    except UserError:
        raise  # a config problem: every learner would hit it
    except Exception as e:  # a learner that breaks is left out of the soup, not the whole stage
        result.status, result.error = "failed", f"{type(e).__name__}: {e}"
        result.samples = module.samples_seen
        log.warning("jigsaw learner %d failed and is left out: %s", learner, result.error)
        result.seconds = time.perf_counter() - start
        return result
    result.state_dict = state_dict_cpu(model)
    if not is_finite_state_dict(result.state_dict):
        result.status, result.error = "diverged", "non-finite weights"
        log.warning("jigsaw learner %d diverged (non-finite weights) and is left out", learner)
    result.seconds = time.perf_counter() - start
    return result


def prune_learner(
    ctx: PretrainContext, dm: LearnerData, model: nn.Module, seed: int, learner: int, shard: Tensor
) -> tuple[float, int]:
    """Prune `model` in place at the learner's own density (group `prune`); returns (density,
    samples that went forward and backward for it: SNIP's one batch)."""
    pruning = ctx.prune
    if not pruning.prunes:
        return 1.0, 0
    # Its own generators: the density and a random mask do not depend on how training went.
    density = draw_density(
        pruning.density_low, pruning.density_high, generator=generator(seed, "density", learner)
    )
    batch = None
    if pruning.needs_batch:
        # The learner's first minibatch, un-augmented: the data it owns, as it is.
        x, y, _ = next(iter(dm.eval_loader(shard[: dm.batch_size], dm.batch_size)))
        batch = (x, y)
        model.train()  # the loss the learner trained on (BatchNorm on batch statistics)
    pruning.apply(model, density, generator(seed, "prune", learner), batch)
    return density, 0 if batch is None else len(batch[1])
