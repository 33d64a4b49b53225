"""The jigsaw learners of a run as a SLURM job array: which learners a run still needs, how they
are grouped into array tasks, and the function each task runs.

Learners never communicate (LiPT, https://proceedings.mlr.press/v202/ro23a.html, section 3.2),
so each group is an independent task. A group pays a job's start (a Python process, its imports,
a data load and the scheduler's latency) once for all of its learners. Every task writes its
learners' checkpoints into the run's learners folder (`learners/`, or pretrain.learner_dir),
where the run's in-process jigsaw stage finds them and merges them as it merges its own
(lipt.jigsaw.checkpoints.train_or_reuse): the soup is the in-process one, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lipt.core.settings import SelectorSettings
from lipt.jigsaw.checkpoints import LEARNERS_DIR, learner_file
from lipt.run.groups import locate


@dataclass(frozen=True)
class LearnerGroup:
    """One array task: these learners of the run in `run_dir`, trained by `config`'s recipe."""

    run_dir: Path
    ids: list[int]
    config: dict[str, Any]  # the run's config, resolved, without `hydra`

    @property
    def folder(self) -> Path:
        return learners_folder(self.run_dir, self.config)

    @property
    def job_dir(self) -> Path:
        """The task's own folder (its summary.json and log): learners/jobs/<first id>."""
        return self.folder / "jobs" / f"{self.ids[0]}"


def uses_jigsaw_learners(config: dict[str, Any]) -> int:
    """How many jigsaw learners a run's in-process pre-training trains (0: none), from its
    resolved config: pretrain=jigsaw without `learners` or `merge_from`, in a run that
    pre-trains (a selector that ranks with a model, lipt's dynamic pruning or label cleaning)."""
    pretrain = config.get("pretrain") or {}
    if pretrain.get("name") != "jigsaw" or pretrain.get("learners") is not None:
        return 0
    if pretrain.get("merge_from") or config.get("subset_path"):
        return 0
    selector = SelectorSettings.of(config.get("selector"))
    ranks = selector is not None and selector.needs_model
    budget = config.get("budget") or {}
    # lipt's pruning scores with the ensemble: asked of the option, not of its label
    prunes = "_target_" in budget and bool(locate(str(budget["_target_"])).needs_ensemble)
    cleans = (config.get("clean") or {}).get("name") == "lipt"
    pretrains = ranks or prunes or cleans
    return int(pretrain.get("num_learners", 0)) if pretrains else 0


def learners_folder(run_dir: Path, config: dict[str, Any]) -> Path:
    """Where the run's in-process stage looks for its learners (lipt.jigsaw.checkpoints.
    learner_dir): `pretrain.learner_dir` when set, else the run's learners/ folder."""
    explicit = (config.get("pretrain") or {}).get("learner_dir")
    return Path(str(explicit)).expanduser() if explicit else run_dir / LEARNERS_DIR


def missing_learners(folder: Path, count: int) -> list[int]:
    """Ids in 0..count-1 whose checkpoint is not in `folder` (learners_folder) yet."""
    return [i for i in range(count) if not (folder / learner_file(i)).is_file()]


def groups_of(ids: list[int], per_task: int) -> list[list[int]]:
    """`ids` in consecutive groups of at most `per_task`."""
    if per_task < 1:
        raise ValueError(f"learners per task must be at least 1, not {per_task}")
    return [ids[k : k + per_task] for k in range(0, len(ids), per_task)]


class LearnerTask:
    """`train_learner_group` as an array task runs it: a task that reaches its time limit
    (submitit's signal before it) is requeued for its group, as a preempted one is, and the
    learners it wrote are reused (lipt.jigsaw.checkpoints). A plain function is not requeued at
    its time limit: the learner in training was lost and the task spent a retry. An attempt
    that wrote none of its learners is not requeued (one learner longer than the time limit
    would be, max_num_timeout times): it fails, and the launcher's learner_retries decide."""

    def __init__(self) -> None:
        self.missing_at_start: list[int] | None = None

    def __call__(self, group: LearnerGroup) -> dict[str, Any]:
        self.missing_at_start = unwritten(group)
        return train_learner_group(group)

    def checkpoint(self, group: LearnerGroup) -> Any:
        """What submitit submits again in this task's place (its requeue); None (no requeue)
        where this attempt wrote no learner."""
        from submitit.helpers import DelayedSubmission

        if self.missing_at_start is not None and unwritten(group) == self.missing_at_start:
            return None
        return DelayedSubmission(self, group)


def unwritten(group: LearnerGroup) -> list[int]:
    """The group's learners without a checkpoint in its folder yet."""
    return [i for i in group.ids if not (group.folder / learner_file(i)).is_file()]


def train_learner_group(group: LearnerGroup) -> dict[str, Any]:
    """What an array task runs: the group's learners from their shards, each checkpoint written
    into the run's learners/ folder as soon as it is trained (lipt.stages.jigsaw's job half).
    Returns the task's stages.pretrain (seconds, samples, learners)."""
    from omegaconf import OmegaConf

    from lipt.run.config import run_of
    from lipt.stages.jigsaw import run_learner_job

    # The run's config was checked whole when the sweep was submitted; this task reads only
    # what the learners need of it.
    cfg = OmegaConf.create(group.config)
    cfg.pretrain.learners = list(group.ids)
    cfg.pretrain.learner_dir = str(group.folder)
    cfg.paths.output_dir = str(group.job_dir)
    summary = run_learner_job(run_of(cfg))
    stats: dict[str, Any] = summary["stages"]["pretrain"]
    return stats
