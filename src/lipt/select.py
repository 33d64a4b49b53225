"""Stage 2: rank the training pool with pre-trained gradients and choose a subset.

`choose_subset` wires a pure selector (lipt.selection, chosen by the `selector` config group) to
models and data; `run` is `select.py`'s body: it loads `ckpt_path` or pre-trains in-process,
then writes subset.npz and summary.json.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from lipt.artifacts import load_checkpoint, save_subset, write_json
from lipt.build import build_datamodule, build_model, run_dir
from lipt.config import validate
from lipt.data import DataModule
from lipt.errors import UserError
from lipt.pretrain import heads_from_payload, pretrain_model
from lipt.selection import (
    LearnerHeads,
    PoolOutputs,
    SelectionInputs,
    model_outputs,
    select_balanced,
)
from lipt.summary import summary_payload

# Keys of a selector config that are lipt's, not the selector function's.
RESERVED_SELECTOR_KEYS = ("name", "balance", "needs_model", "repeats")


def budget_for(cfg: DictConfig, pool_size: int) -> int:
    budget = round(float(cfg.fraction) * pool_size)
    if budget < 1:
        raise UserError(
            f"fraction={cfg.fraction} of a pool of {pool_size} selects nothing; raise fraction"
        )
    return budget


def needs_model(cfg: DictConfig) -> bool:
    return cfg.selector.name != "full" and bool(cfg.selector.get("needs_model", True))


def selection_models(
    cfg: DictConfig, dm: DataModule, stages: dict[str, Any]
) -> tuple[list[nn.Module], LearnerHeads | None]:
    """The model(s) whose outputs rank the pool: the checkpoint at `ckpt_path` (select.py), or
    the `pretrain` strategy run `selector.repeats` times from seeds seed, seed+1, ...; and the
    jigsaw learners' heads of the first one (None unless it is a jigsaw soup)."""
    repeats = int(cfg.selector.get("repeats", 1))
    ckpt_path = cfg.get("ckpt_path") if cfg.get("stage") == "select" else None
    if ckpt_path:
        if repeats > 1:
            raise UserError(
                "selector.repeats > 1 needs several models; drop ckpt_path to pre-train in-process"
            )
        path = Path(str(ckpt_path))
        return [load_pretrained(cfg, dm, path)], heads_from_payload(load_checkpoint(path))
    heads = None
    models, totals = [], {"seconds": 0.0, "samples": 0, "unique_samples": 0}
    for r in range(repeats):
        result = pretrain_model(cfg, dm, int(cfg.seed) + r)
        models.append(result.model)
        for key, value in result.stats().items():
            totals[key] += value
        if r == 0:
            heads = result.learner_heads
            if result.report:
                stages["merge_report"] = result.report
    if cfg.pretrain.name != "none":
        stages["pretrain"] = {**totals, "seconds": round(totals["seconds"], 3)}
    return models, heads


def load_pretrained(cfg: DictConfig, dm: DataModule, path: Path) -> nn.Module:
    payload = load_checkpoint(path)
    if payload.get("data") != dm.data_name:
        raise UserError(
            f"{path} was pre-trained on {payload.get('data')!r}, this run uses {dm.data_name!r}; "
            "pass a checkpoint for this data set"
        )
    model = build_model(cfg, int(cfg.seed))
    try:
        model.load_state_dict(payload["state_dict"], strict=True)
    except RuntimeError as e:
        first = str(e).splitlines()[0]
        raise UserError(f"{path} does not fit model={cfg.model._target_} ({first})") from e
    return model


def choose_subset(
    cfg: DictConfig,
    dm: DataModule,
    models: list[nn.Module],
    seed: int,
    learner_heads: LearnerHeads | None = None,
) -> tuple[Tensor, Tensor]:
    """Positions in the original training split (ascending) and their float32 weights.
    `learner_heads` (the jigsaw learners', fitting models[0]'s embeddings) go to the selector."""
    pool_size = len(dm.pool_indices)
    budget = budget_for(cfg, pool_size)
    generator = torch.Generator().manual_seed(seed)
    node = cfg.selector
    fn = instantiate(
        OmegaConf.masked_copy(node, [k for k in node if k not in RESERVED_SELECTOR_KEYS])
    )
    if models:
        device = next(models[0].parameters()).device
        pools = [model_outputs(m, dm.pool_dataloader(), device) for m in models]
        val = model_outputs(models[0], dm.val_dataloader(), device) if len(dm.val_indices) else None
        head = models[0].classifier
        assert isinstance(head, nn.Linear), "lipt models end in a `classifier` nn.Linear"
        inputs = SelectionInputs(
            pool=pools[0],
            val=val,
            extra_pools=tuple(pools[1:]),
            classifier_weight=head.weight.detach().cpu(),
            classifier_bias=head.bias.detach().cpu(),
            learner_heads=learner_heads,
        )
    else:
        inputs = SelectionInputs(pool=labels_only(dm))
    if node.get("balance", False):
        selection = select_balanced(fn, inputs, budget, generator=generator)
    else:
        selection = fn(inputs, budget, generator=generator)
    assert len(selection.rows) == budget and len(torch.unique(selection.rows)) == budget
    # Rows are positions in the pool; the artifact speaks positions in the original split.
    indices = inputs.pool.indices[selection.rows]
    order = torch.argsort(indices)
    return indices[order], selection.weights[order].float()


def labels_only(dm: DataModule) -> PoolOutputs:
    """The pool as a selector that needs no model (random) sees it: labels and positions."""
    idx = dm.pool_indices
    n = len(idx)
    return PoolOutputs(
        logits=torch.zeros(n, dm.num_classes),
        embeddings=torch.zeros(n, 0),
        targets=dm.train_source.labels[idx],
        indices=idx,
    )


def subset_meta(cfg: DictConfig, dm: DataModule) -> dict[str, Any]:
    """What a later run checks before it trusts a subset file."""
    return {
        "dataset": dm.data_name,
        "dataset_train_size": len(dm.train_source),
        "val_size": len(dm.val_indices),
        "split_seed": int(cfg.dataset.split_seed),
        "selector": str(cfg.selector.name),
        "pretrain": str(cfg.pretrain.name),
        "fraction": float(cfg.fraction),
        "seed": int(cfg.seed),
    }


def run(cfg: DictConfig) -> dict[str, Any]:
    validate(cfg)
    if cfg.selector.name == "full":
        raise UserError("selector=full selects nothing; choose a selector, e.g. selector=glister")
    out = run_dir(cfg)
    dm = build_datamodule(cfg)
    stages: dict[str, Any] = {}
    models, heads = selection_models(cfg, dm, stages) if needs_model(cfg) else ([], None)
    report = stages.pop("merge_report", None)
    start = time.perf_counter()
    indices, weights = choose_subset(cfg, dm, models, int(cfg.seed), heads)
    stages["select"] = {"seconds": round(time.perf_counter() - start, 3)}
    save_subset(out / "subset.npz", indices, weights, subset_meta(cfg, dm))
    if report:
        write_json(out / "merge_report.json", report)
    summary = summary_payload(cfg, dm, None, len(indices), stages)
    write_json(out / "summary.json", summary)
    return summary
