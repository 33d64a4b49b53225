"""Loggers: CSV by default, wandb offline; each run logs its config, metrics and stage times."""

from __future__ import annotations

import csv

from lipt.run.config import validate
from lipt.stages import train as train_stage
from tests.helpers import FAST


def test_csv_logger_gets_stage_times_and_test_accuracy(make_cfg, tmp_path):
    cfg = make_cfg([o for o in FAST if o != "logger=none"] + ["selector=el2n", "budget=subset"])
    summary = train_stage.run(validate(cfg))
    metrics = next((tmp_path / "csv").rglob("metrics.csv"))
    rows = list(csv.DictReader(metrics.open()))
    logged = {k: v for row in rows for k, v in row.items() if v}
    assert float(logged["test_accuracy"]) == summary["test_accuracy"]
    assert float(logged["stages/train/samples"]) == summary["stages"]["train"]["samples"]
    assert "stages/select/seconds" in logged
    hparams = next((tmp_path / "csv").rglob("hparams.yaml")).read_text()
    assert "selector" in hparams and "el2n" in hparams


def test_wandb_logger_runs_offline_inside_the_run_dir(make_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = make_cfg([o for o in FAST if o != "logger=none"] + ["logger=wandb"])
    train_stage.run(validate(cfg))
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].rglob("*.wandb"))
