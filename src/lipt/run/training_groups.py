"""What the groups `optimizer`, `scheduler`, `callbacks` and `hparams_search` need besides their
YAML: the checks that build them before any stage starts (lipt.run.preflight), and the number a
task returns to a sweeper that optimises it (`optimized_metric`).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from lipt.core.errors import UserError
from lipt.run.checks import innermost

# summary.json's keys a sweeper may optimise (choose on the validation split, never the test).
OPTIMIZABLE = ("val_accuracy",)


def check_optimized_metric(cfg: DictConfig) -> None:
    """`optimized_metric` names a number train.py's summary.json will hold."""
    metric = cfg.get("optimized_metric")
    if metric is None:
        return
    if metric not in OPTIMIZABLE:
        raise UserError(
            f"optimized_metric={metric!r} is invalid: use val_accuracy (or null for the summary)"
        )
    if cfg.get("stage", "train") != "train":
        raise UserError(f"optimized_metric is train.py's; drop it for {cfg.stage}.py")
    if metric == "val_accuracy" and float(cfg.dataset.val_size) == 0:
        raise UserError(
            "optimized_metric=val_accuracy needs a validation split, but dataset.val_size=0; "
            "set dataset.val_size > 0"
        )


def task_result(cfg: DictConfig, summary: dict[str, Any]) -> Any:
    """What the stage returns to Hydra: the summary, or, with `optimized_metric`, that number
    of it (a float, as the Optuna sweeper asks)."""
    metric = cfg.get("optimized_metric")
    if metric is None:
        return summary
    value = summary.get(str(metric))
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise UserError(f"optimized_metric={metric}: this run's summary.json has no number there")
    return float(value)


def check_optimizer(cfg: DictConfig) -> None:
    """Build the `optimizer` on one parameter and the `scheduler` on it, and step both once:
    a value the optimiser or the schedule refuses fails now, not when training starts."""
    import torch

    from lipt.models.schedules import Clock, is_torch_scheduler, linear
    from lipt.run.checks import resolved
    from lipt.stages.build import build_part

    try:
        parameter = torch.nn.Parameter(torch.zeros(1))
        optimizer = build_part(resolved(cfg.optimizer))([parameter])
    except Exception as e:  # TypeError (a key it does not take), ValueError (a value it refuses)
        raise UserError(f"optimizer settings are invalid: {innermost(e)}; fix optimizer.*") from e
    try:
        make = build_part(resolved(cfg.scheduler))
        if is_torch_scheduler(make):
            schedule = make(optimizer)
        else:
            schedule = make(optimizer, Clock(total_steps=lambda: 10))
        parameter.grad = torch.zeros(1)
        optimizer.step()
        if schedule is not None:
            schedule.step()
    except Exception as e:
        raise UserError(f"scheduler settings are invalid: {innermost(e)}; fix scheduler.*") from e
    # A decay to zero over the budget needs the budget's end in steps; a clock ends the run
    # wherever the learning rate then is.
    target = getattr(make, "func", make)
    if target is linear and cfg.trainer.get("max_time") is not None:
        raise UserError(
            f"scheduler=linear decays to zero over the run's steps, but trainer.max_time="
            f"{cfg.trainer.max_time} ends it by the clock; drop trainer.max_time or use "
            "scheduler=cosine|constant"
        )


def check_callbacks(cfg: DictConfig) -> None:
    """Build each callback of the `callbacks` group; what one monitors must be a metric the
    Lightning module logs."""
    from lipt.models.classifier import LOGGED_METRICS
    from lipt.run.checks import resolved
    from lipt.stages.build import build_part

    for name, node in (cfg.get("callbacks") or {}).items():
        if node is None or "_target_" not in node:
            continue
        try:
            build_part(resolved(node))
        except Exception as e:
            raise UserError(
                f"callbacks.{name} settings are invalid: {innermost(e)}; fix callbacks.{name}.*"
            ) from e
        monitor = node.get("monitor")
        if monitor is not None and monitor not in LOGGED_METRICS:
            raise UserError(
                f"callbacks.{name}.monitor={monitor} is not a metric the model logs; use one "
                f"of {', '.join(LOGGED_METRICS)}"
            )
