"""Stage 1: pre-train a model whose gradients rank the data (`pretrain` config group).

Each option of the group names its strategy with `_target_`: `none` keeps the common initial
model and `full` is the classic warm-up over the whole pool, the tax lipt cuts (lipt.warmup);
`jigsaw` is the paper's method (lipt.jigsaw.strategy.JigsawPretraining). A strategy is called as
`strategy(ctx, dm, model, seed) -> Pretrained` (lipt.jigsaw.context.Strategy). `run` is
`pretrain.py`'s body.

`ranking_models` is what selection and lipt's dynamic pruning rank the pool with: the
checkpoint at `ckpt_path` (select.py), or the strategy run `selector.repeats` times.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from lipt.core.artifacts import load_checkpoint
from lipt.core.errors import UserError
from lipt.core.job import run_dir
from lipt.core.seeding import repeat_seed
from lipt.core.settings import MODEL_RUN_KEYS
from lipt.jigsaw.context import Pretrained, data_split, heads_from_payload
from lipt.jigsaw.strategy import JigsawPretraining, check_saved_seeds
from lipt.selection import LearnerHeads
from lipt.stages.build import Parts, build_parts
from lipt.stages.jigsaw import run_learner_job
from lipt.stages.pretrain_outputs import write_pretrain_outputs
from lipt.stages.run import Run

log = logging.getLogger(__name__)


def pretrain_model(parts: Parts, seed: int) -> Pretrained:
    """Run the configured strategy from the common initial model of `seed`. Its `seconds`: this
    attempt's wall time, plus the training seconds of jigsaw learners an earlier attempt saved
    and this one reused (the stage's whole cost, as `learner_seconds` counts them too)."""
    start = time.perf_counter()
    dm = parts.dm
    log.info(parts.pretrain.describe(parts.context, len(dm.pool_indices)))
    result = parts.pretrain(parts.context, dm, parts.initial_model(seed), seed)
    result.seconds = time.perf_counter() - start + result.reused_seconds
    if result.report:
        log.info(soup_line(result.report))
    return result


def soup_line(report: Mapping[str, Any]) -> str:
    """The soup's held-out accuracy beside the best learner's, under the pre-training line."""
    kept, n = len(report.get("kept", [])), report.get("num_learners", 0)
    return (
        f"  soup: held-out {report['soup_accuracy']:.3f} (best learner "
        f"{report['best_learner_accuracy']:.3f}, kept {kept} of {n})"
    )


def pretrain_stats(results: list[Pretrained]) -> dict[str, Any] | None:
    """summary.json's stages.pretrain, summed over the models (None: nothing was trained)."""
    totals: dict[str, Any] = {"seconds": 0.0, "samples": 0, "unique_samples": 0}
    for result in results:
        for key, value in result.stats().items():
            totals[key] = totals.get(key, 0) + value
    rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in totals.items()}
    return rounded if results[0].trained else None


@dataclass
class Ranking:
    """The model(s) whose outputs rank the pool, and the jigsaw learners' heads of the first
    one (None unless it is a jigsaw soup). `pretrained`: the first pre-training made in this run
    (None when loaded from ckpt_path); `pretrain_stats`: summary.json's stages.pretrain, summed
    over `selector.repeats` (None when nothing was trained here)."""

    models: list[nn.Module]
    heads: LearnerHeads | None = None
    pretrained: Pretrained | None = None
    pretrain_stats: dict[str, Any] | None = None
    # The pre-training of a checkpoint loaded from ckpt_path, as it records it (a subset's
    # label; None: the run's `pretrain` made the models).
    loaded_pretrain: str | None = None


def ranking_models(run: Run, parts: Parts, made: Pretrained | None = None) -> Ranking:
    """The checkpoint at `ckpt_path` (select.py), or the `pretrain` strategy run
    `selector.repeats` times from `repeat_seed(seed, r)`; `made`: the first of them, already
    pre-trained in this run (for label cleaning), is not made again."""
    repeats = 1 if run.selector is None else run.selector.repeats
    settings = run.settings
    ckpt_path = settings.ckpt_path if settings.stage == "select" else None
    if isinstance(parts.pretrain, JigsawPretraining) and not ckpt_path:
        seeds = [repeat_seed(settings.seed, r) for r in range(repeats)]
        check_saved_seeds(parts.pretrain, seeds, settings.seed)  # before the first merge
    if made is not None and not ckpt_path:
        rest = [pretrain_model(parts, repeat_seed(settings.seed, r)) for r in range(1, repeats)]
        models = [made, *rest]
        return Ranking([r.model for r in models], made.learner_heads, made, pretrain_stats(models))
    if ckpt_path:
        if repeats > 1:
            raise UserError(
                "selector.repeats > 1 needs several models; drop ckpt_path to pre-train in-process"
            )
        path = Path(ckpt_path)
        payload = load_checkpoint(path)
        model = load_pretrained(run, parts, path, payload)
        made_by = payload.get("pretrain")
        return Ranking(
            [model], heads_from_payload(payload), loaded_pretrain=made_by and str(made_by)
        )
    results = [pretrain_model(parts, repeat_seed(settings.seed, r)) for r in range(repeats)]
    first = results[0]
    return Ranking([r.model for r in results], first.learner_heads, first, pretrain_stats(results))


def load_pretrained(
    run: Run, parts: Parts, path: Path, payload: Mapping[str, Any] | None = None
) -> nn.Module:
    """The model of the pretrain.ckpt at `path` (`payload`: its contents, read already), for
    this run's data and model.

    Raises:
        UserError: it was pre-trained on another data set, another split or labelling of it, or
            does not fit the model.
    """
    payload = load_checkpoint(path) if payload is None else payload
    check_is_pretrain_checkpoint(path, payload)
    data_name = parts.dm.data_name
    if payload.get("data") is None:
        raise UserError(
            f"ckpt_path={path} records no data set it was pre-trained on, so it is no "
            "pretrain.ckpt of pretrain.py; give the pretrain.ckpt pretrain.py wrote, or rank "
            "with a model of your own through the Python API (lipt.select(model, ...))"
        )
    if payload.get("data") != data_name:
        raise UserError(
            f"{path} was pre-trained on {payload.get('data')!r}, this run uses {data_name!r}; "
            "pass a checkpoint for this data set"
        )
    check_split(path, payload.get("split"), data_split(parts.dm))
    here = run.node("model")
    differ = model_difference(payload.get("model"), here)
    if differ:
        raise UserError(
            f"{path} was pre-trained with another model ({differ}); pass the model settings "
            "it was pre-trained with, or pre-train again with this run's"
        )
    model = parts.initial_model(run.settings.seed)
    try:
        model.load_state_dict(unwrapped(payload["state_dict"], model), strict=True)
    except RuntimeError as e:
        # torch's first line only names the class: its first reason says what differs
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        reason = lines[1] if len(lines) > 1 else lines[0] if lines else type(e).__name__
        raise UserError(f"{path} does not fit model={here['_target_']} ({reason})") from e
    return model


# What wrappers put before a module's own keys, leaving its weights as they are: DataParallel
# and DistributedDataParallel (`module.`), torch.compile's OptimizedModule (`_orig_mod.`).
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def unwrapped(state_dict: Mapping[str, Any], model: nn.Module) -> dict[str, Any]:
    """`state_dict` with the wrapper prefixes that every one of its keys carries removed, where
    `model`'s own keys have none (a soup saved from a DDP- or torch.compile-wrapped model)."""
    own = set(model.state_dict())
    keys = dict(state_dict)
    while keys and not own & set(keys):
        prefix = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in keys)), None)
        if prefix is None:
            break
        keys = {k.removeprefix(prefix): v for k, v in keys.items()}
    return keys


def model_difference(saved: Any, here: Mapping[str, Any]) -> str:
    """The `model` settings a checkpoint records (pretrain.ckpt's `model`) that differ from this
    run's, as `model.width=8, this run 16` ("" where none do, or it records none)."""
    if not isinstance(saved, Mapping):
        return ""
    keys = sorted((set(saved) | set(here)) - MODEL_RUN_KEYS)
    return ", ".join(
        f"model.{key}={saved.get(key)!r}, this run {here.get(key)!r}"
        for key in keys
        if saved.get(key) != here.get(key)
    )


def check_is_pretrain_checkpoint(path: Path, payload: Mapping[str, Any]) -> None:
    """Refuse the checkpoints that are not a pre-training's soup: main training's Lightning
    checkpoint (last.ckpt, best.ckpt) and one jigsaw learner's (learners/learner_<i>.ckpt),
    which records no data split to be checked against this run's."""
    if "pytorch-lightning_version" in payload:
        raise UserError(
            f"ckpt_path={path} is a checkpoint of main training (train.py), not of a "
            "pre-training; give the pretrain.ckpt that pretrain.py (or a learner multirun's soup "
            "callback) wrote"
        )
    if "learner" in payload and "recipe" in payload:
        raise UserError(
            f"ckpt_path={path} is one jigsaw learner's checkpoint, not the soup; give the "
            "pretrain.ckpt of its run, or merge the learners into one with pretrain.py "
            f"pretrain.merge_from={path.parent} and the learner jobs' overrides"
        )


def check_split(path: Path, saved: dict[str, Any] | None, here: dict[str, Any]) -> None:
    """Refuse a pretrain.ckpt whose training split (lipt.jigsaw.context.data_split) is not this
    run's: its model trained on rows this run holds out to validate, or on other labels. One
    that records none (written before pretrain.ckpt recorded it) is accepted with a warning."""
    if saved is None:
        log.warning("%s records no data split: not checked against this run's", path)
        return
    # The first cause only: another validation split also changes the pool and its labels.
    seeds = [key for key in ("val_size", "split_seed") if saved.get(key) != here[key]]
    if seeds:
        was = ", ".join(f"{key} {saved.get(key)!r}, this run {here[key]!r}" for key in seeds)
        fix = ", ".join(f"dataset.{key}={saved.get(key)!r}" for key in seeds)
    elif saved.get("pool_size") != here["pool_size"]:
        was = f"a pool of {saved.get('pool_size')} rows, this run {here['pool_size']}"
        fix = "dataset.pool_size as it was"
    elif saved.get("labels") != here["labels"]:
        was, fix = "other labels", "dataset.label_noise and dataset.train_labels as they were"
    else:
        return
    raise UserError(
        f"{path} was pre-trained on another split of the training data ({was}); pass {fix}, "
        "or pre-train again with this run's split"
    )


def run(run: Run) -> dict[str, Any]:
    """`pretrain.py`, on the run's typed settings (lipt.run.config.validate builds them):
    pretrain.ckpt, merge_report.json (jigsaw) and summary.json."""
    if run.node("pretrain").get("learners") is not None:
        # One job of a learner multirun (pretrain=jigsaw's key): no soup here (the soup
        # callback merges at the end).
        return run_learner_job(run)
    out = run_dir(run.folder)
    parts = build_parts(run)
    result = pretrain_model(parts, run.settings.seed)
    return write_pretrain_outputs(run, parts.dm, parts.context, result, out)
