"""How main training spends `fraction` of the whole pool's cost: the `budget` config group
(a subset, the whole pool on fewer steps, InfoBatch's epochs, lipt's dynamic pruning). The
options and their arithmetic are in `modes`; README.md in this folder is the one-page card."""

from lipt.budget.modes import (
    InfoBatchEpochs,
    LiptDynamic,
    Pruning,
    SoupInfoBatchEpochs,
    Subset,
    WholePool,
    epoch_steps,
    infobatch_epochs,
    schedule_steps,
    subset_rows,
    subset_steps,
)
from lipt.core.budget import Budget, PoolSizes, Schedule

__all__ = [
    "Budget",
    "InfoBatchEpochs",
    "LiptDynamic",
    "PoolSizes",
    "Pruning",
    "Schedule",
    "SoupInfoBatchEpochs",
    "Subset",
    "WholePool",
    "epoch_steps",
    "infobatch_epochs",
    "schedule_steps",
    "subset_rows",
    "subset_steps",
]
