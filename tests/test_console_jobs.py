"""A multirun job's one line names the job by its overrides as typed."""

from __future__ import annotations

from lipt.core import console
from tests.helpers import FAST, run_entry


def test_a_jobs_overrides_keep_their_own_commas():
    """Hydra's override_dirname joins overrides with commas: splitting it again on them cut
    `pretrain.learners=[0,1]` into `[0 1]`."""
    overrides = ["seed=1", "pretrain.learners=[0,1]", "+experiment=frontier_cpu", "+approach=x"]
    assert (
        console.job_overrides(overrides, ["experiment"])
        == "+approach=x pretrain.learners=[0,1] seed=1"
    )
    assert console.job_overrides([]) == ""


def test_a_learner_jobs_line_shows_its_learners_as_typed(tmp_path):
    args = [o for o in FAST if o not in ("budget=infobatch", "pretrain=none")]
    sweep = tmp_path / "sweep"
    learners = ["pretrain.num_learners=2", "pretrain.learners=[0,1]"]
    out = run_entry("pretrain.py", ["-m", *args, *learners, f"hydra.sweep.dir={sweep}"])
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("#0 ")]
    assert lines and " pretrain.learners=[0,1] " in lines[0], out.stdout
