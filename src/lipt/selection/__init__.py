"""Subset selectors: pure tensor functions over what a model said about the training pool.

Each selector is `select_<name>(inputs, budget, *, generator, **hyper_params) -> Selection`;
`select_balanced(fn, inputs, budget, generator=g)` runs one per class. Gradient selectors use
the closed-form last-layer gradients of `lipt.selection.gradients`.
"""

from lipt.selection.ccs import select_ccs
from lipt.selection.common import Selector, select_balanced, split_budget
from lipt.selection.coverage import ensemble_difficulty, select_coverage
from lipt.selection.craig import select_craig
from lipt.selection.glister import GlisterRun, glister_greedy, glister_pick_order, select_glister
from lipt.selection.gradients import (
    LastLayerGradient,
    bias_gradients,
    gradient_dots,
    gradient_gram,
    gradient_sq_norms,
    gradient_sum,
    last_layer_gradients,
    model_outputs,
)
from lipt.selection.gradmatch import select_gradmatch
from lipt.selection.profile import subset_profile
from lipt.selection.scores import (
    SCORES,
    mean_score,
    pool_score,
    select_el2n,
    select_grand,
    select_random,
    select_uncertainty,
)
from lipt.selection.types import LearnerHeads, PoolOutputs, Selection, SelectionInputs

__all__ = [
    "SCORES",
    "GlisterRun",
    "LastLayerGradient",
    "LearnerHeads",
    "PoolOutputs",
    "Selection",
    "SelectionInputs",
    "Selector",
    "bias_gradients",
    "ensemble_difficulty",
    "glister_greedy",
    "glister_pick_order",
    "gradient_dots",
    "gradient_gram",
    "gradient_sq_norms",
    "gradient_sum",
    "last_layer_gradients",
    "mean_score",
    "model_outputs",
    "pool_score",
    "select_balanced",
    "select_ccs",
    "select_coverage",
    "select_craig",
    "select_el2n",
    "select_glister",
    "select_gradmatch",
    "select_grand",
    "select_random",
    "select_uncertainty",
    "split_budget",
    "subset_profile",
]
