"""Dynamic data pruning during main training (`budget=infobatch`, `budget=lipt`): a plan of
kept samples and loss weights per epoch from each sample's last training loss. The pure plans
are in `plan`, the Lightning callback in `callback`; lipt.stages.dynamic wires them into train.py;
README.md in this folder is the one-page card."""

from lipt.dynamic.callback import DynamicPruning
from lipt.dynamic.plan import (
    EpochPlan,
    InfoBatch,
    LiptBudget,
    PruningMethod,
    budget_plan,
    budget_schedule,
    ensemble_losses,
    infobatch_plan,
    keep_probabilities,
    pruned_epochs,
)

__all__ = [
    "DynamicPruning",
    "EpochPlan",
    "InfoBatch",
    "LiptBudget",
    "PruningMethod",
    "budget_plan",
    "budget_schedule",
    "ensemble_losses",
    "infobatch_plan",
    "keep_probabilities",
    "pruned_epochs",
]
