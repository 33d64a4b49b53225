"""What the stages hand each other: selection's and main training's typed results
(pre-training's are lipt.jigsaw.context's); docs/DESIGN.md, "Stages and their results".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lipt.cleaning import LabelIssues
from lipt.jigsaw.context import Pretrained


@dataclass
class Cleaned:
    """Label cleaning's result: the flagged labels (`issues.rows`: positions in the training
    split), summary.json's stages.clean, and the jigsaw soup pre-trained for it (None: K-fold
    cleaning, or read back on resume), which selection reuses."""

    issues: LabelIssues
    stats: dict[str, Any]
    pretrained: Pretrained | None = None
    pretrain_stats: dict[str, Any] | None = None  # stages.pretrain of `pretrained`


@dataclass
class Selected:
    """Stage 2's result: the subset (positions in the original training split, ascending, and
    their float32 weights), the selector's diagnostics and what it cost."""

    indices: Tensor
    weights: Tensor
    seconds: float
    diagnostics: dict[str, int]
    pretrained: Pretrained | None = None  # the first model that ranked the pool, if made here
    pretrain_stats: dict[str, Any] | None = None  # summed over selector.repeats
    profile: dict[str, float] = field(default_factory=dict)  # lipt.selection.profile (model used)
    loaded_pretrain: str | None = None  # the pre-training of the ckpt_path that ranked, if any

    def stats(self) -> dict[str, Any]:
        """summary.json's stages.select."""
        figures = {"seconds": round(self.seconds, 3), "diagnostics": self.diagnostics}
        return {**figures, "profile": self.profile} if self.profile else figures

    def stages(self) -> dict[str, dict[str, Any]]:
        """summary.json's stages.pretrain (when pre-trained here) and stages.select."""
        stages = {} if self.pretrain_stats is None else {"pretrain": self.pretrain_stats}
        return {**stages, "select": self.stats()}


@dataclass
class Trained:
    """Stage 3's result: main training's figures."""

    seconds: float
    samples: int
    unique_samples: int
    test_accuracy: float
    val_accuracy: float | None
    reselections: int | None = None
    reselect_seconds: float | None = None
    reselect_profiles: dict[str, dict[str, float]] | None = None  # str(epoch) -> subset profile
    # Dynamic pruning's ledger (lipt.dynamic.DynamicPruning.ledger); None without it.
    dynamic: dict[str, Any] | None = None

    def stats(self) -> dict[str, Any]:
        """summary.json's stages.train."""
        figures: dict[str, Any] = {
            "seconds": round(self.seconds, 3),
            "samples": self.samples,
            "unique_samples": self.unique_samples,
        }
        if self.reselections is not None:
            figures["reselections"] = self.reselections
            figures["reselect_seconds"] = round(float(self.reselect_seconds or 0.0), 3)
        if self.reselect_profiles:
            figures["reselect_profiles"] = self.reselect_profiles
        if self.dynamic is not None:
            figures["dynamic"] = self.dynamic
        return figures


def with_cleaning(
    stages: dict[str, dict[str, Any]], cleaned: Cleaned | None
) -> dict[str, dict[str, Any]]:
    """summary.json's stages with stages.clean first after pre-training; the pre-training
    label cleaning made (clean=lipt) is stages.pretrain when selection did not record it."""
    if cleaned is None:
        return stages
    pretrain = stages.get("pretrain", cleaned.pretrain_stats)
    first = {} if pretrain is None else {"pretrain": pretrain}
    return {**first, "clean": cleaned.stats, **stages}
