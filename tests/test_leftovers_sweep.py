"""A sweep folder reused by a second `-m` run: the second multirun's own table counts its own
jobs, not the trials an earlier Optuna study left in job folders the second did not reach
(`train.py hparams_search=lr_wd hydra.sweeper.n_trials=3`, then `n_trials=2`, one
hydra.sweep.dir: "sweep of 3 runs" for a study of 2 trials)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from lipt.report.sweep import main
from lipt.report.sweep_runs import load_summaries


def _trial(job_dir: Path, lr: float, accuracy: float, seed: int = 0) -> None:
    """One job folder of an Optuna trial: .hydra/ and summary.json."""
    (job_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    summary = {
        "test_accuracy": accuracy,
        "dataset_train_size": 600,
        "subset_size": 500,
        "stages": {"train": {"seconds": 1.0, "samples": 500, "unique_samples": 500}},
        "config": {"seed": seed, "optimizer": {"lr": lr, "weight_decay": 1e-4}},
    }
    (job_dir / "summary.json").write_text(json.dumps(summary))


def _reused(tmp_path: Path) -> tuple[Path, float]:
    """A first study's 3 trials an hour ago, then a second's 2 in folders 0 and 1; and when the
    second began. Folder 3: a trial of the first that failed (no summary)."""
    sweep = tmp_path / "sweep"
    hour_ago = time.time() - 3600
    for job, lr in enumerate((0.02, 0.05, 0.2)):
        _trial(sweep / str(job), lr, 0.3)
    (sweep / "3" / ".hydra").mkdir(parents=True)
    for path in sweep.rglob("*"):
        os.utime(path, (hour_ago, hour_ago))
    began = time.time()
    for job, lr in enumerate((0.013, 0.055)):
        _trial(sweep / str(job), lr, 0.45)
    return sweep, began


def test_a_multiruns_summaries_are_its_own_in_a_reused_sweep_folder(tmp_path):
    sweep, began = _reused(tmp_path)
    runs, warnings = load_summaries(sweep, since=began)
    assert sorted(run.config["optimizer.lr"] for run in runs) == [0.013, 0.055]
    earlier = f"left out 1 run of an earlier multirun in {sweep} (written before this one began)"
    assert warnings == [f"{earlier}: 2"]


def test_a_folders_report_still_reads_every_run_in_it(tmp_path):
    """`make report` of the folder: every summary.json under it, the failed job named."""
    sweep, _ = _reused(tmp_path)
    runs, warnings = load_summaries(sweep)
    assert len(runs) == 3 and any("3: no summary.json" in w for w in warnings)


def test_the_report_command_takes_the_multiruns_start(tmp_path, capsys):
    sweep, began = _reused(tmp_path)
    main([str(sweep), "--since", str(began), "--out", str(tmp_path / "report")])
    out = capsys.readouterr()
    assert "2 groups from 2 runs" in out.out and "left out 1 run" in out.err
    assert "(2 runs)" in (tmp_path / "report" / "results.md").read_text()


def test_the_end_of_sweep_table_counts_this_multiruns_runs_and_a_resumes_all(tmp_path, capsys):
    """Hydra's callback: the table opens with the multirun's own runs; a resumed multirun
    (ckpt_path=last) keeps its finished jobs' summaries as they were, so it counts them all."""
    from omegaconf import OmegaConf

    from lipt.run.hydra_callbacks import SweepTable

    sweep = tmp_path / "sweep"
    for resume, expected in ((None, "sweep of 2 runs"), ("last", "sweep of 3 runs")):
        table = SweepTable()
        hydra = {"sweep": {"dir": str(sweep)}, "overrides": {"task": ["optimizer.lr=0.01"]}}
        hydra["sweeper"] = {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"}
        config = OmegaConf.create({"ckpt_path": resume, "logger": None, "hydra": hydra})
        table.on_multirun_start(config)
        assert table.start is not None
        hour_ago = table.start - 3600
        for job, lr in enumerate((0.02, 0.05, 0.2)):
            _trial(sweep / str(job), lr, 0.3)
        for path in sweep.rglob("*"):
            os.utime(path, (hour_ago, hour_ago))
        for job, lr in enumerate((0.013, 0.055)):
            _trial(sweep / str(job), lr, 0.45)
        table.on_multirun_end(config)
        assert capsys.readouterr().out.splitlines()[0].startswith(expected)
