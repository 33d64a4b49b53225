"""The `budget` group's options: how main training spends `fraction` of the whole pool's cost
(trainer.max_epochs epochs of the whole pool). Each is a frozen dataclass, its option's
`_target_`, that owns its arithmetic (`schedule`: the epochs, and the optimiser steps where a
step budget ends the fit) and, for the two that prune the whole pool every epoch, the pruning
method its callback runs (`pruning`: lipt.dynamic's InfoBatch or LiptBudget).

Plain Python, no torch: lipt.run.config builds the option before anything heavy is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from lipt.core.bounds import BELOW_ONE, SHARE
from lipt.core.budget import PoolSizes, Schedule
from lipt.core.settings import Checked

if TYPE_CHECKING:
    from lipt.dynamic.plan import PruningMethod

# The share of an epoch's samples InfoBatch (ratio 0.5) trains on, about (PEERS.md's ~70%). Its
# pruned epochs kept 0.68 and 0.63 of the pool on the frontier (runs of 3 and 9 epochs), but its
# full first and annealing epochs raise a whole run's share to 0.89 and 0.75: the epochs below
# overspend their budget by that much (docs/results/frontier counts the measured cost).
INFOBATCH_KEPT_SHARE = 0.7


def subset_rows(fraction: float, pool: int) -> int:
    """The rows of a `fraction` subset of a pool of `pool` rows (0 where it selects nothing)."""
    return round(fraction * pool)


def limited_batches(batches: int, limit: int | float | None) -> int:
    """An epoch's `batches` as Lightning's Trainer trains them under
    trainer.limit_train_batches `limit`: at most `limit` of them (an int), int(batches x limit)
    (a float, a share of them), all (None)."""
    if limit is None or isinstance(limit, bool):
        return batches
    if isinstance(limit, int):
        return min(batches, limit)
    return int(batches * limit)


def epoch_steps(
    rows: int,
    batch_size: int,
    world_size: int = 1,
    accumulate: int = 1,
    limit: int | float | None = None,
) -> int:
    """Optimiser steps of one epoch on `rows` rows as Lightning's Trainer takes them: each of
    `world_size` processes trains ceil(rows / world_size) of them (the distributed sampler pads
    the last by wrapping), in batches of `batch_size`, up to trainer.limit_train_batches
    `limit` (`limited_batches`), and the optimiser steps every `accumulate` batches and on the
    epoch's last batch."""
    if batch_size < 1 or world_size < 1 or accumulate < 1:
        raise ValueError(
            f"batch_size, world_size and accumulate must be >= 1, got {batch_size}, "
            f"{world_size}, {accumulate}"
        )
    batches = limited_batches(math.ceil(math.ceil(rows / world_size) / batch_size), limit)
    return math.ceil(batches / accumulate)


def subset_steps(
    fraction: float,
    pool: int,
    batch_size: int,
    epochs: int,
    world_size: int = 1,
    accumulate: int = 1,
    limit: int | float | None = None,
) -> int:
    """Optimiser steps of `epochs` epochs on a subset of `fraction` of the pool, on
    `world_size` processes stepping every `accumulate` batches, up to
    trainer.limit_train_batches `limit` an epoch (`epoch_steps`); one at least."""
    rows = max(1, subset_rows(fraction, pool))
    return max(1, epochs * epoch_steps(rows, batch_size, world_size, accumulate, limit))


def schedule_steps(fraction: float, epochs: int, steps_per_epoch: int) -> int:
    """Optimiser steps of the whole pool on `fraction` of a schedule of `epochs` epochs: the
    whole pool for fewer epochs, fractional ones included."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return max(1, round(fraction * epochs * steps_per_epoch))


def infobatch_epochs(fraction: float, full_epochs: int) -> int:
    """InfoBatch's epochs at about `fraction` of the cost of `full_epochs` whole-pool epochs:
    max(1, round(fraction x E / 0.7)), as it trains on about 70% of each epoch, and at most E
    (above fraction 0.7 more epochs would cost more than the whole pool's run)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if full_epochs < 1:
        raise ValueError(f"full_epochs must be >= 1, got {full_epochs}")
    return min(full_epochs, max(1, round(fraction * full_epochs / INFOBATCH_KEPT_SHARE)))


@dataclass(frozen=True)
class BudgetOption(Checked):
    """What the options share: their keys are `budget.*`, and by default an option trains the
    whole pool, unpruned (`pruning` None); each overrides what it does differently."""

    PREFIX: ClassVar[str] = "budget"
    trains_subset: ClassVar[bool] = False
    prunes: ClassVar[bool] = False
    needs_ensemble: ClassVar[bool] = False

    @property
    def counts_steps(self) -> bool:
        return False

    def pruning(self, fraction: float) -> PruningMethod | None:
        return None


@dataclass(frozen=True)
class Subset(BudgetOption):
    """`budget=subset`: the selector's subset of `fraction` of the pool (or a saved one,
    subset_path), trained trainer.max_epochs epochs."""

    trains_subset: ClassVar[bool] = True

    name: str = "subset"

    def schedule(self, sizes: PoolSizes) -> Schedule:
        return Schedule(sizes.max_epochs)


@dataclass(frozen=True)
class WholePool(BudgetOption):
    """`budget=full|full_steps|full_schedule`: the whole pool, unpruned, for
    - `steps: all`: every epoch of trainer.max_epochs (fraction unused: the reference);
    - `steps: subset`: as many optimiser steps as a subset of `fraction` takes in as many epochs;
    - `steps: schedule`: round(fraction x max_epochs x steps per epoch) optimiser steps, the
      schedule annealed over them (the whole pool on a shorter schedule). The steps per epoch
      are the pool's before label cleaning dropped any: a cleaned pool spends as much.
    Steps are optimiser steps as the Trainer takes them (`epoch_steps`: its processes, its
    gradient accumulation and its trainer.limit_train_batches counted), so a step budget trains
    as many samples on any number of devices, accumulating or not, and a limited epoch's
    schedule is `fraction` of the limited epochs' (which the run then spans to its end)."""

    name: str = "full"
    steps: Literal["all", "subset", "schedule"] = "all"

    @property
    def counts_steps(self) -> bool:
        return self.steps != "all"

    def schedule(self, sizes: PoolSizes) -> Schedule:
        if self.steps == "all":
            return Schedule(sizes.max_epochs)
        stepping = (sizes.batch_size, sizes.world_size, sizes.accumulate, sizes.limit_batches)
        if self.steps == "subset":
            steps = subset_steps(
                sizes.fraction,
                sizes.pool,
                sizes.batch_size,
                sizes.max_epochs,
                sizes.world_size,
                sizes.accumulate,
                sizes.limit_batches,
            )
            return Schedule(sizes.max_epochs, steps)
        budget_steps = epoch_steps(sizes.pool_before_cleaning, *stepping)
        steps = schedule_steps(sizes.fraction, sizes.max_epochs, budget_steps)
        per_epoch = max(1, epoch_steps(sizes.pool, *stepping))
        return Schedule(math.ceil(steps / per_epoch), steps)


@dataclass(frozen=True)
class InfoBatchEpochs(BudgetOption):
    """`budget=infobatch`: the whole pool pruned every epoch by InfoBatch as published
    (lipt.dynamic.InfoBatch: `ratio`, `delta`), for the epochs `fraction` of the cost buys
    (`epochs: fraction`, infobatch_epochs, at most trainer.max_epochs) or for
    trainer.max_epochs (`epochs: all`, the published protocol, whose saving follows the
    losses)."""

    prunes: ClassVar[bool] = True

    name: str = "infobatch"
    ratio: Annotated[float, BELOW_ONE] = 0.5
    delta: Annotated[float, SHARE] = 0.875
    epochs: Literal["fraction", "all"] = "fraction"

    def schedule(self, sizes: PoolSizes) -> Schedule:
        if self.epochs == "all":
            return Schedule(sizes.max_epochs)
        return Schedule(infobatch_epochs(sizes.fraction, sizes.max_epochs))

    def pruning(self, fraction: float) -> PruningMethod:
        from lipt.dynamic.plan import InfoBatch  # torch: only once training is built

        return InfoBatch(name=self.name, ratio=self.ratio, delta=self.delta)


@dataclass(frozen=True)
class SoupInfoBatchEpochs(InfoBatchEpochs):
    """`budget=infobatch_soup`: InfoBatch for the same epochs, epoch 0 scored by the jigsaw
    soup and its learners' heads (as budget=lipt's) rather than all equal, so it prunes from the
    first epoch; later epochs by the training losses, as published. Needs a pre-training."""

    needs_ensemble: ClassVar[bool] = True

    name: str = "infobatch_soup"

    def pruning(self, fraction: float) -> PruningMethod:
        from lipt.dynamic.plan import InfoBatch  # torch: only once training is built

        return InfoBatch(name=self.name, ratio=self.ratio, delta=self.delta, start="ensemble")


@dataclass(frozen=True)
class LiptDynamic(BudgetOption):
    """`budget=lipt`: the whole pool for trainer.max_epochs epochs on `fraction` of their cost,
    pruned every epoch by lipt's dynamic pruning (lipt.dynamic.LiptBudget): epoch 0 scored by
    the jigsaw soup and its learners' heads, later ones by the training losses."""

    prunes: ClassVar[bool] = True
    needs_ensemble: ClassVar[bool] = True

    name: str = "lipt"
    # in (0, 1]: the last (1 - delta) share of the epochs anneals on full data while the budget
    # affords it (fewer annealing epochs, or none, for a small budget)
    delta: Annotated[float, SHARE] = 0.875
    floor: Annotated[float, SHARE] = 0.25  # least keep probability, a share of the kept share

    def schedule(self, sizes: PoolSizes) -> Schedule:
        return Schedule(sizes.max_epochs)

    def pruning(self, fraction: float) -> PruningMethod:
        from lipt.dynamic.plan import LiptBudget  # torch: only once training is built

        return LiptBudget(name=self.name, budget=fraction, delta=self.delta, floor=self.floor)


Pruning = InfoBatchEpochs | LiptDynamic
