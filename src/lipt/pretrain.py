"""Stage 1: pre-train a model whose gradients rank the data (`pretrain` config group).

`none` keeps the common initial model, `full` is the classic warm-up over the whole pool (the tax
lipt cuts), `jigsaw` is the paper's method (lipt.jigsaw). `run` is `pretrain.py`'s body.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf
from torch import nn

from lipt import console
from lipt.artifacts import save_checkpoint, write_json
from lipt.build import (
    build_classifier,
    build_datamodule,
    build_model,
    quiet_trainer,
    run_dir,
    state_dict_cpu,
)
from lipt.config import validate
from lipt.data import DataModule
from lipt.errors import UserError
from lipt.selection.types import LearnerHeads
from lipt.summary import summary_payload


@dataclass
class Pretrained:
    """A pre-trained model and what it cost."""

    model: nn.Module
    seconds: float = 0.0
    samples: int = 0  # training samples passed forward and backward
    unique_samples: int = 0  # distinct training-set items read
    report: dict[str, Any] = field(default_factory=dict)  # e.g. the jigsaw merge report
    # Further checkpoints the strategy wrote as it went, by path, e.g. every jigsaw learner's
    # (written when each finished, so a killed run keeps them); payloads load with
    # torch.load(weights_only=True).
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Further counts for summary.json, e.g. jigsaw's learners_merged / learners_failed.
    counts: dict[str, int] = field(default_factory=dict)
    # The jigsaw learners' final layers, handed to selection (and saved in pretrain.ckpt) so a
    # selector can use the learners' ensemble without running them again.
    learner_heads: LearnerHeads | None = None

    def stats(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "samples": self.samples,
            "unique_samples": self.unique_samples,
            **self.counts,
        }


def warmup_epochs(cfg: DictConfig) -> int:
    """Epochs of `pretrain=full`: `pretrain.epochs`, or with `pretrain.kappa` GradMatch's
    warm-start T_f = kappa * T_s * fraction (T_s: main training epochs), rounded up
    (Killamsetty et al., ICML 2021, https://arxiv.org/abs/2103.00123, section 4)."""
    kappa = cfg.pretrain.get("kappa")
    if kappa is None:
        return int(cfg.pretrain.epochs)
    return max(1, math.ceil(float(kappa) * int(cfg.trainer.max_epochs) * float(cfg.fraction)))


def pretrain_model(cfg: DictConfig, dm: DataModule, seed: int) -> Pretrained:
    """Run the configured strategy from the common initial model of `seed`."""
    start = time.perf_counter()
    name = cfg.pretrain.name
    console.stage(console.describe_pretrain(cfg, len(dm.pool_indices)))
    model = build_model(cfg, seed)
    if name == "none":
        return Pretrained(model, time.perf_counter() - start)
    if name == "full":
        module = build_classifier(cfg, model)
        L.seed_everything(seed, workers=True, verbose=False)
        trainer = quiet_trainer(
            cfg, max_epochs=warmup_epochs(cfg), enable_progress_bar=console.bars_enabled()
        )
        dm.set_subset(None)
        trainer.fit(module, train_dataloaders=dm.train_dataloader())
        return Pretrained(
            model, time.perf_counter() - start, module.samples_seen, len(dm.pool_indices)
        )
    if name == "jigsaw":
        from lipt.jigsaw import pretrain_jigsaw

        result = pretrain_jigsaw(cfg, dm, model, seed)
        result.seconds = time.perf_counter() - start
        console.stage(console.soup_line(result.report))
        return result
    raise UserError(f"pretrain.name={name!r} is unknown; use pretrain=none, full or jigsaw")


def checkpoint_payload(
    cfg: DictConfig, dm: DataModule, model: nn.Module, heads: LearnerHeads | None = None
) -> dict[str, Any]:
    """Tensors and plain values only (loadable with weights_only=True)."""
    payload: dict[str, Any] = {
        "state_dict": state_dict_cpu(model),
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "data": dm.data_name,
        "num_classes": int(cfg.dataset.num_classes),
        "pretrain": str(cfg.pretrain.name),
        "seed": int(cfg.seed),
    }
    if heads is not None:
        payload["learner_heads"] = {"weight": heads.weight, "bias": heads.bias}
    return payload


def heads_from_payload(payload: dict[str, Any]) -> LearnerHeads | None:
    """The learner heads a pretrain.ckpt carries (None: not a jigsaw checkpoint)."""
    heads = payload.get("learner_heads")
    return None if heads is None else LearnerHeads(heads["weight"], heads["bias"])


def run(cfg: DictConfig) -> dict[str, Any]:
    validate(cfg)
    if cfg.pretrain.name == "jigsaw" and cfg.pretrain.get("learners") is not None:
        # One job of a learner multirun: no soup here (lipt.soup_callback merges at the end).
        from lipt.jigsaw import run_learner_job

        return run_learner_job(cfg)
    out = run_dir(cfg)
    dm = build_datamodule(cfg)
    result = pretrain_model(cfg, dm, int(cfg.seed))
    save_checkpoint(
        out / "pretrain.ckpt", checkpoint_payload(cfg, dm, result.model, result.learner_heads)
    )
    if result.report:
        write_json(out / "merge_report.json", result.report)
    summary = summary_payload(
        cfg, dm, test_accuracy=None, subset_size=None, stages={"pretrain": result.stats()}
    )
    write_json(out / "summary.json", summary)
    return summary
