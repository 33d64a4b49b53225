"""Loggers: CSV by default, wandb offline; each run logs its config, metrics and stage times."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

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


def summary_figures(summary: dict[str, Any]) -> dict[str, float]:
    """Every number summary.json holds about the run, flat by path (wrong_labels/given,
    stages/train/samples): what a dashboard compares runs on. Not the config (hyper-parameters)
    or the machine (host, load_average, slurm), nor lists (subset_class_counts)."""
    flat: dict[str, float] = {}

    def walk(path: str, value: Any) -> None:
        if isinstance(value, dict):
            for name, inner in value.items():
                walk(f"{path}/{name}" if path else name, inner)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[path] = float(value)

    walk("", {k: v for k, v in summary.items() if k not in ("config", "host", "slurm")})
    return flat


def csv_metrics(folder: Path) -> dict[str, float]:
    rows = list(csv.DictReader(next(folder.rglob("metrics.csv")).open()))
    return {k: float(v) for row in rows for k, v in row.items() if v}


def tensorboard_metrics(folder: Path) -> dict[str, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, float] = {}
    for events in sorted(folder.rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars[tag] = accumulator.Scalars(tag)[-1].value
    return scalars


@pytest.mark.parametrize(
    ("logger", "read"), [("csv", csv_metrics), ("tensorboard", tensorboard_metrics)]
)
def test_each_logger_gets_every_figure_of_summary_json(make_cfg, tmp_path, logger, read):
    """A dashboard compares runs on what the loggers got at the end of a run: the same figures
    as summary.json, validation accuracy (what hyper-parameters are chosen on) included."""
    cfg = make_cfg(
        [o for o in FAST if o != "logger=none"]
        + [f"logger={logger}", "selector=el2n", "budget=subset", "trainer.max_epochs=2"]
        + ["dataset.label_noise.rate=0.2"]  # summary.json's wrong_labels
    )
    train_stage.run(validate(cfg))
    summary = json.loads((tmp_path / "summary.json").read_text())
    expected = summary_figures(summary)
    assert {"val_accuracy", "dataset_train_size", "wrong_labels/given"} <= set(expected)
    logged = read(tmp_path / logger)
    missing = sorted(set(expected) - set(logged))
    assert not missing, f"summary.json figures no logger got: {missing}"
    for key, value in expected.items():  # TensorBoard keeps float32
        assert logged[key] == pytest.approx(value, rel=1e-6), key


def test_the_trained_share_after_label_cleaning_is_of_the_pool_as_read(tmp_path):
    """A budget is a share of the whole pool's run as read; cleaning's drops shrink what trains,
    not that reference: 66,000 samples of 12 epochs on 55,000 items is 10%, though 2,750 items
    were dropped (the pool trained on is 52,250)."""
    from lipt.core import console

    summary = {
        "test_accuracy": 0.83,
        "train_size": 52250,
        "subset_size": 52250,
        "config": {"trainer": {"max_epochs": 12}},
        "stages": {
            "clean": {"pool": 55000, "flagged": 2750, "seconds": 9.0},
            "train": {"seconds": 40.0, "samples": 66000},
        },
    }
    block = console.closing_block(summary, tmp_path)
    assert "66,000 samples, 10.0% of the whole pool's 12 epochs (660,000)" in block
    assert "trained 10.0%" in console.job_line(summary, tmp_path, "#0")


def test_tensorboards_hparams_table_holds_the_settings_and_summarys_figures(make_cfg, tmp_path):
    """TensorBoard's HPARAMS tab shows a table only where metrics come with the settings: it
    had none, and hparams.yaml held the model's four keys, not the run's config."""
    import yaml
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    cfg = make_cfg(
        [o for o in FAST if o != "logger=none"]
        + ["logger=tensorboard", "selector=el2n", "budget=subset"]
    )
    train_stage.run(validate(cfg))
    summary = json.loads((tmp_path / "summary.json").read_text())
    session: dict[str, Any] = {}
    experiment_metrics: set[str] = set()
    for events in sorted((tmp_path / "tensorboard").rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        try:
            contents = accumulator.PluginTagToContent("hparams").values()
        except KeyError:  # an events file without the table
            continue
        for content in contents:
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            if data.HasField("session_start_info"):
                session.update(data.session_start_info.hparams)
            if data.HasField("experiment"):
                experiment_metrics |= {m.name.tag for m in data.experiment.metric_infos}
    assert session["selector/_target_"].string_value.endswith("select_el2n")
    assert session["seed"].number_value == summary["config"]["seed"]
    assert {"test_accuracy", "val_accuracy", "stages/train/samples"} <= experiment_metrics
    hparams = yaml.safe_load(next((tmp_path / "tensorboard").rglob("hparams.yaml")).read_text())
    assert hparams["selector"]["_target_"] == summary["config"]["selector"]["_target_"]


def test_wandb_gets_the_subset_summary_json_counts_after_a_resume(make_cfg, tmp_path, monkeypatch):
    """A resumed run trains on the latest re-selected subset; summary.json's class counts and
    subset.png are of the first (subset.npz), and so is what wandb logs: it logged the latest."""
    import torch

    from lipt.core.artifacts import load_subset
    from lipt.stages import train as train_module

    monkeypatch.setenv("WANDB_SILENT", "true")
    logged: list[Any] = []
    monkeypatch.setattr(
        train_module, "log_to_wandb", lambda _l, _d, subset, _o: logged.append(subset)
    )
    args = [o for o in FAST if o != "logger=none"] + ["logger=wandb", "selector=el2n"]
    args += ["budget=subset", "fraction=0.2", "reselect_every=1", "trainer.max_epochs=3"]
    train_stage.run(validate(make_cfg(args)))
    (tmp_path / "summary.json").unlink()  # killed before its summary: the resume re-tests
    train_stage.run(validate(make_cfg([*args, "ckpt_path=last"])))
    first = load_subset(tmp_path / "subset.npz")[0]
    assert len(logged) == 2 and all(torch.equal(subset, first) for subset in logged)
