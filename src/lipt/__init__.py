"""lipt: cheap pre-training for gradient-based subset training (Lightning + Hydra).

Implements "Lowering the Pre-training Tax for Gradient-based Subset Training: A Lightweight
Distributed Pre-Training Toolkit" (Ro et al., ICML 2023, https://proceedings.mlr.press/v202/ro23a.html).

The names below are lipt's Python API for your own LightningModule and data set (docs/API.md):
they are imported on first use, so `import lipt` (and checking a config) stays light.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from lipt.cleaning.datalab import DatalabReport
    from lipt.data.pool import PoolDataModule
    from lipt.dynamic.callback import DynamicPruning, ensemble_scores
    from lipt.dynamic.plan import InfoBatch, LiptBudget
    from lipt.jigsaw.api import jigsaw_pretrain
    from lipt.models.classifier import Classifier
    from lipt.models.loss import weighted_loss
    from lipt.selection.api import Subset, select
    from lipt.selection.reselection import Reselection
    from lipt.selection.selectors import SELECTORS
    from lipt.stages.label_issues import FoundIssues, datalab_report, find_label_issues

# name -> the module that defines it
_API = {
    "PoolDataModule": "lipt.data.pool",
    "select": "lipt.selection.api",
    "Subset": "lipt.selection.api",
    "SELECTORS": "lipt.selection.selectors",
    "Reselection": "lipt.selection.reselection",
    "DynamicPruning": "lipt.dynamic.callback",
    "ensemble_scores": "lipt.dynamic.callback",
    "InfoBatch": "lipt.dynamic.plan",
    "LiptBudget": "lipt.dynamic.plan",
    "weighted_loss": "lipt.models.loss",
    "Classifier": "lipt.models.classifier",
    "jigsaw_pretrain": "lipt.jigsaw.api",
    "find_label_issues": "lipt.stages.label_issues",
    "FoundIssues": "lipt.stages.label_issues",
    "datalab_report": "lipt.stages.label_issues",
    "DatalabReport": "lipt.cleaning.datalab",
}

__all__ = [
    "SELECTORS",
    "Classifier",
    "DatalabReport",
    "DynamicPruning",
    "FoundIssues",
    "InfoBatch",
    "LiptBudget",
    "PoolDataModule",
    "Reselection",
    "Subset",
    "datalab_report",
    "ensemble_scores",
    "find_label_issues",
    "jigsaw_pretrain",
    "select",
    "weighted_loss",
]


# lipt's packages, imported on first use too: `lipt.selection.select_gradmatch` after `import lipt`
PACKAGES = frozenset(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


def __getattr__(name: str) -> Any:
    if name in PACKAGES:
        return importlib.import_module(f"lipt.{name}")
    if name not in _API:
        raise AttributeError(f"module 'lipt' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
