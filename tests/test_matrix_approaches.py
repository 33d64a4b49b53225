"""Every method (configs/approach) under the frontier experiments, as a user sweeps them: each
job composes, passes the checks and builds in a dry run, and a method's own settings survive
the experiment composed after it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.helpers import CONFIGS, ROOT, run_entry

APPROACHES = sorted(p.stem for p in (CONFIGS / "approach").glob("*.yaml"))
FRONTIERS = ("frontier_small", "frontier_cpu", "frontier_long", "frontier_noisy")


def test_every_approach_dry_runs_under_frontier_small_in_one_sweep(tmp_path: Path) -> None:
    """Those that pin another merge (lipt_greedy, lipt_uniform) among them: the experiment
    sets no key of the default merge that theirs would refuse."""
    out = run_entry(
        str(ROOT / "train.py"),
        [
            "-m",
            "+experiment=frontier_small",
            f"+approach={','.join(APPROACHES)}",
            "fraction=0.25",
            "dry_run=true",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=tmp_path,
    )
    output = out.stdout + out.stderr
    assert out.returncode == 0, output[-2000:]
    # each approach's job, the sweeper's reference (full_data) among them
    jobs = len({*APPROACHES, "full_data"})
    assert f"dry run: {jobs} jobs composed, checked and built" in output
    assert not (tmp_path / "sweep").exists()


def compose_job(approach: str, experiment: str, searchpath: Path | None = None) -> object:
    """A frontier job's config, its overrides in the sweeper's order: the approach, then the
    experiment (tests/test_experiments.py checks that order)."""
    extra = [f"hydra.searchpath=[file://{searchpath}]"] if searchpath else []
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose(
            "train", overrides=[f"+approach={approach}", f"+experiment={experiment}", *extra]
        )


@pytest.mark.parametrize("experiment", FRONTIERS)
def test_random_online_re_draws_under_every_frontier(experiment: str) -> None:
    """The experiment's `reselect_every` (read from its protocol, 0 for an approach it names no
    period for) is composed after the approach's own: without a period of its own there,
    random online would train one subset throughout, as `random` does."""
    cfg = compose_job("random_online", experiment)
    epochs = int(cfg.trainer.max_epochs)
    assert 0 < cfg.reselect_every < epochs
    # a tenth of the run, as the paper's 20 of 200 and the experiments' GraNd re-selection
    assert cfg.reselect_every == max(1, round(epochs / 10))
    assert compose_job("paper", experiment).reselect_every == cfg.reselect_every
