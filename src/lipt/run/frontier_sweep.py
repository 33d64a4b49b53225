"""The frontier as a Hydra multirun: a sweeper that adds the reference job, and a callback that
pins each job to a core of its own. Any launcher runs the jobs (basic, joblib, submitit).

- `FrontierSweeper` (`hydra/sweeper=frontier`; hydra_plugins.lipt_frontier, as Hydra loads
  sweepers from that namespace only) is Hydra's basic sweeper, the cartesian product
  of the sweep's axes (`+approach`, `fraction`, `seed`, ...), plus the reference: one more job
  per combination of the axes that are not a method's point (`point_keys`: the approach and
  the budget), with `reference`'s overrides in their place. The references come first: every
  speed-up needs them.
- `PinToCore` (`hydra/callbacks=pin`) claims a free core for each job (a lock file per core,
  held while the job runs), pins the job's process to it and gives torch one thread; it undoes
  both when the job ends. Jobs then pay the same one-core rate whatever launcher runs them
  (the basic one, one after another, or joblib, as many at once as cores), and each job's
  summary.json records it (lipt.core.host).

    python train.py -m +experiment=frontier_small hydra/launcher=joblib hydra.launcher.n_jobs=2
    make report SWEEP=multirun/frontier_small      # -> frontier.md, frontier.png
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from lipt.core.errors import UserError
from lipt.core.host import allowed_cores

SWEEPER = "hydra_plugins.lipt_frontier.frontier_sweeper.FrontierSweeper"
PIN = "lipt.run.frontier_sweep.PinToCore"


def check_frontier_settings(sweeper: Any, callbacks: Any) -> None:
    """The frontier sweeper's and the pinning callback's settings (the composed `hydra.sweeper`
    and `hydra.callbacks`), checked before Hydra builds them: a UserError names the key."""
    if str(sweeper.get("_target_")) == SWEEPER:
        reference = sweeper.get("reference")
        if not reference:
            raise UserError(
                "hydra.sweeper.reference is empty; give the reference job's overrides, e.g. "
                "'hydra.sweeper.reference=[+approach=full_data]'"
            )
        if not sweeper.get("point_keys"):
            raise UserError(
                "hydra.sweeper.point_keys is empty; name the keys a method's point sets, e.g. "
                "'hydra.sweeper.point_keys=[approach,fraction]'"
            )
    for name, node in (callbacks or {}).items():
        if str(node.get("_target_")) != PIN:
            continue
        threads = node.get("threads")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise UserError(
                f"hydra.callbacks.{name}.threads={threads!r} is invalid: use an integer >= 1"
            )


def key_of(override: str) -> str:
    """`+approach=coverage` -> `approach`: the key an override sets, without Hydra's prefix."""
    return override.split("=", 1)[0].lstrip("+~")


def setting_of(override: str) -> tuple[str, str]:
    """`+approach='full_data'` -> (`approach`, `full_data`): what an override sets, however
    it is prefixed or quoted."""
    key, _, value = override.partition("=")
    value = value.strip()
    if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return key.lstrip("+~"), value


def with_reference(
    jobs: Sequence[Sequence[str]], reference: Sequence[str], point_keys: Sequence[str]
) -> list[list[str]]:
    """The reference jobs, one per distinct combination of the overrides outside `point_keys`
    (in order of first appearance), then `jobs`; a job listed twice runs once. A job that sets
    every override of the reference (`+approach=full_data` among the methods, say, for the
    whole pool's curve over `trainer.max_epochs`) is the reference itself: its point keys go
    too, since the reference is measured without them (the report reads every run of the
    reference's approach as the reference), so it runs once, not once per budget."""
    own = {setting_of(o) for o in reference}
    references = [as_reference(job, reference, point_keys) for job in jobs]
    unique: dict[tuple[str, ...], list[str]] = {}
    for job in [*references, *(list(j) for j in jobs)]:
        if own <= {setting_of(o) for o in job}:
            job = as_reference(job, reference, point_keys)
        unique.setdefault(tuple(sorted(job)), job)
    return list(unique.values())


def as_reference(
    job: Sequence[str], reference: Sequence[str], point_keys: Sequence[str]
) -> list[str]:
    """The reference job of `job`: `reference`'s overrides in place of its point keys' (and of
    those `reference` sets), its other overrides kept."""
    replaced = {key_of(k) for k in point_keys} | {key_of(o) for o in reference}
    return [*reference, *(o for o in job if key_of(o) not in replaced)]


class PinToCore(Callback):
    """Each job on a core of its own, with `threads` torch threads (see the module docstring)."""

    def __init__(self, threads: int = 1, lock_dir: str | None = None) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self.lock_dir = Path(lock_dir or Path(tempfile.gettempdir()) / "lipt-cores")
        self._held: IO[str] | None = None
        self._before: tuple[set[int], int] | None = None

    def _claim(self, cores: Sequence[int], job_num: int) -> tuple[int, IO[str]]:
        """A core no other job holds; when every one is held, wait for this job's turn one."""
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        for core in cores:
            handle = open(self.lock_dir / f"core{core}.lock", "w")  # noqa: SIM115 (held)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return core, handle
            except BlockingIOError:
                handle.close()
        core = cores[job_num % len(cores)]
        handle = open(self.lock_dir / f"core{core}.lock", "w")  # noqa: SIM115 (held)
        fcntl.flock(handle, fcntl.LOCK_EX)
        return core, handle

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        import torch

        cores = sorted(allowed_cores())
        job_num = int(config.hydra.job.get("num") or 0)
        core, self._held = self._claim(cores, job_num)
        self._before = (set(cores), torch.get_num_threads())
        os.sched_setaffinity(0, {core})
        torch.set_num_threads(self.threads)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        import torch

        if self._before is not None:
            cores, threads = self._before
            os.sched_setaffinity(0, cores)
            torch.set_num_threads(threads)
            self._before = None
        if self._held is not None:
            self._held.close()  # releases the core's lock
            self._held = None
