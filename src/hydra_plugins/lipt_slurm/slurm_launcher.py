"""`hydra/launcher=slurm`: Hydra's submitit SlurmLauncher with lipt's launch
(lipt.run.slurm_launcher.launch). Hydra loads launchers only from this namespace, and imports it
whenever it starts, so the class is thin and the logic is imported when a sweep is launched."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import (
    SlurmLauncher as SubmititSlurmLauncher,
)


class LiptSlurmLauncher(SubmititSlurmLauncher):
    """Its own keys (lipt.run.slurm_launcher.OWN_KEYS) are taken here; the rest go to submitit."""

    def __init__(
        self,
        learner_array: bool = True,
        learners_per_task: int = 5,
        learner_retries: int = 1,
        poll_s: float = 10.0,
        **params: Any,
    ) -> None:
        super().__init__(**params)
        self.learner_array = learner_array
        self.learners_per_task = learners_per_task
        self.learner_retries = learner_retries
        self.poll_s = poll_s

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from lipt.run.slurm_launcher import launch

        return launch(self, job_overrides, initial_job_idx)
