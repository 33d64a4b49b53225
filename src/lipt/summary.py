"""`summary.json`: the one file other tools read after a run (see DESIGN.md, "Interfaces")."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from lipt.data import DataModule


def summary_payload(
    cfg: DictConfig,
    dm: DataModule,
    test_accuracy: float | None,
    subset_size: int | None,
    stages: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    return {
        "test_accuracy": None if test_accuracy is None else float(test_accuracy),
        "train_size": len(dm.pool_indices),
        "dataset_train_size": len(dm.train_source),
        "subset_size": subset_size,
        "stages": stages,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
