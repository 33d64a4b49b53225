"""`hydra.sweep.subdir` names each job's folder: a constant one puts every job of a sweep in one
folder, where each overwrote the one before (seed 0's summary.json replaced by seed 1's, the
sweep's table counting one run). Refused in one line before any job starts."""

from __future__ import annotations

from typing import Any

import pytest

FAST = ["dataset=synthetic", "budget=infobatch", "pretrain=none", "logger=none"]


def test_a_constant_subdir_for_several_jobs_is_refused(tmp_path: Any, capsys: Any) -> None:
    from lipt.run.precheck import precheck

    args = [*FAST, "seed=0,1,2", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=same"]
    with pytest.raises(SystemExit) as exit_:
        precheck("train", args, multirun=True)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert "hydra.sweep.subdir=same is one folder for all 3 jobs" in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize(
    "args",
    [
        ["seed=0", "hydra.sweep.subdir=same"],  # one job: its own folder
        ["seed=0,1", "hydra.sweep.subdir=job_${hydra.job.num}"],
        ["seed=0,1", "hydra.sweep.subdir=${hydra.job.override_dirname}"],
    ],
)
def test_a_subdir_of_its_own_per_job_passes(args: list[str], tmp_path: Any) -> None:
    from lipt.run.precheck import precheck

    assert precheck("train", [*FAST, *args, f"hydra.sweep.dir={tmp_path}"], multirun=True) is None


def test_a_sweep_folder_of_the_jobs_own_keys_passes_with_a_constant_subdir(tmp_path: Any) -> None:
    """Hydra resolves hydra.sweep.dir for each job too: s${seed} parts the jobs, whatever the
    subdir (a timestamp, ${now:...}, would not: refused above)."""
    from lipt.run.precheck import precheck

    args = [*FAST, "seed=0,1", f"hydra.sweep.dir={tmp_path}/s${{seed}}", "hydra.sweep.subdir=."]
    assert precheck("train", args, multirun=True) is None
    with pytest.raises(SystemExit):
        dated = f"hydra.sweep.dir={tmp_path}/${{now:%H-%M-%S}}"
        precheck("train", [*FAST, "seed=0,1", dated, "hydra.sweep.subdir=."], multirun=True)
