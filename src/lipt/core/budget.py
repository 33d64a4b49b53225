"""What the stages ask of a `budget` option (lipt.budget): the sizes its arithmetic reads and
the schedule it answers. Here, below the stages and the options both, so that lipt.core.settings'
Run can hold the option. Plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True)
class PoolSizes:
    """What a budget's arithmetic reads."""

    pool: int  # rows main training draws from (the training pool, after label cleaning)
    pool_before_cleaning: int  # the pool as read: a step budget is the uncleaned pool's
    batch_size: int
    max_epochs: int  # trainer.max_epochs: the whole pool's full schedule
    fraction: float  # the share of that schedule's cost to spend, in (0, 1]
    # How the Trainer steps, which a step budget counts: its processes (devices x nodes), each
    # on its own share of an epoch, and the batches each takes per optimiser step.
    world_size: int = 1
    accumulate: int = 1  # trainer.accumulate_grad_batches
    # trainer.limit_train_batches: the batches of each process's epoch it trains, at most (an
    # int) or a share of them (a float); None: all
    limit_batches: int | float | None = None


@dataclass(frozen=True)
class Schedule:
    """Main training's length: `epochs`, and the optimiser `steps` at which the fit stops
    mid-epoch (None: it runs every epoch through)."""

    epochs: int
    steps: int | None = None


class Budget(Protocol):
    """What the stages ask of a `budget` option."""

    name: str  # a label (messages, reports)
    trains_subset: ClassVar[bool]  # a selector's subset (else the whole pool)
    prunes: ClassVar[bool]  # the whole pool, pruned anew every epoch (`pruning`)
    needs_ensemble: ClassVar[bool]  # its pruning scores epoch 0 with the jigsaw ensemble

    @property
    def counts_steps(self) -> bool:
        """Whether its schedule stops at a number of optimiser steps (a step budget)."""
        ...

    def schedule(self, sizes: PoolSizes) -> Schedule: ...

    def pruning(self, fraction: float) -> Any:
        """The pruning method (lipt.dynamic.PruningMethod) its callback runs; None: none."""
