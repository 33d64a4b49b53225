"""`Run`: one run as the stages see it, built once by the entry layer (lipt.run.config) from the
composed config. It lives with the stages because only they take it: the methods below get
objects and values, never the run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from lipt.core.budget import Budget
from lipt.core.settings import DatasetSettings, RunSettings, SelectorSettings


@dataclass(frozen=True)
class Run:
    """One run as the stages see it. lipt.run.config builds it once from the composed config
    (`validate`, `run_of`), every value checked against its declared type and range; below
    that, nothing reads the composed config. The group nodes (model,
    optimizer, trainer, pretrain, ...) stay in `config`, resolved to plain values, for
    lipt.stages.build to instantiate, each against its `_target_`'s own signature."""

    settings: RunSettings
    dataset: DatasetSettings
    selector: SelectorSettings | None  # None: selector=none, which selects nothing
    budget: Budget  # the `budget` group's option (lipt.budget), built from its node
    config: Mapping[str, Any]  # the whole config, resolved: summary.json records it

    @property
    def folder(self) -> Path:
        """The run folder (paths.output_dir): each stage creates and locks it first
        (lipt.core.job.run_dir); what the stages build writes there."""
        return Path(self.settings.paths["output_dir"])

    def node(self, group: str) -> dict[str, Any]:
        """A group's resolved node ({} where this run has none)."""
        node = self.config.get(group)
        return dict(node) if isinstance(node, Mapping) else {}

    @property
    def main_epochs(self) -> int:
        """trainer.max_epochs: the whole pool's full schedule, which `fraction` is a share of
        (a budget may train fewer: `Budget.schedule`)."""
        return int(self.node("trainer")["max_epochs"])

    @property
    def pretrain_name(self) -> str:
        return str(self.node("pretrain").get("name"))

    @property
    def gives_way_to_saved_subset(self) -> bool:
        """A saved subset (subset_path) replaces the selection, and with it a whole-pool
        budget: the subset trains trainer.max_epochs, unpruned."""
        return bool(self.settings.subset_path) and not self.budget.trains_subset

    @property
    def main_budget(self) -> Budget:
        """What main training spends: the budget, or budget=subset's where a saved subset
        replaces a whole-pool budget (`gives_way_to_saved_subset`)."""
        from lipt.budget import Subset  # the budget options, built by lipt.run.config

        # a frozen dataclass: its `name` is read-only, which the Protocol's attribute is not
        return cast(Budget, Subset()) if self.gives_way_to_saved_subset else self.budget

    def unvalidated_period(self, epochs: int) -> int | None:
        """trainer.check_val_every_n_epoch where `optimized_metric` needs a validation that
        main training's `epochs` end before (the first comes at epoch N); else None."""
        every = self.node("trainer").get("check_val_every_n_epoch")
        if self.settings.optimized_metric is None or type(every) is not int or every <= epochs:
            return None
        return every

    @property
    def trains_subset(self) -> bool:
        """Main training takes a subset: budget=subset, or a saved subset (subset_path)."""
        return self.budget.trains_subset or bool(self.settings.subset_path)

    @property
    def prunes(self) -> bool:
        """Main training prunes the whole pool anew every epoch: budget=infobatch or
        budget=lipt, where no saved subset replaces it."""
        return self.budget.prunes and not self.gives_way_to_saved_subset
