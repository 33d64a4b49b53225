"""The config groups as the Lightning + Hydra ecosystem names them: `optimizer`, `scheduler`,
`trainer` presets, `callbacks`, `debug`, `hparams_search` and `logger=tensorboard`. Each is
composed as the entry points compose it (tests/conftest.py's make_cfg, Hydra's compose) and
run; the keys they replaced are refused with one line naming the new one."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml

from lipt.models.schedules import Clock, cosine, linear, one_cycle
from lipt.run.cli import task_result
from lipt.run.config import run_of, validate
from lipt.stages import train as train_stage
from lipt.stages.build import (
    build_callbacks,
    build_classifier,
    build_datamodule,
    build_model,
    build_trainer,
)
from tests.helpers import CONFIGS, FAST, run_entry


class Lrs(L.Callback):
    """The learning rate (and first momentum) of each training batch."""

    def __init__(self) -> None:
        self.lrs: list[float] = []
        self.momenta: list[float] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        group = trainer.optimizers[0].param_groups[0]
        self.lrs.append(float(group["lr"]))
        self.momenta.append(float(group.get("momentum", group.get("betas", (0.0,))[0])))


def fit_lrs(make_cfg: Any, overrides: list[str]) -> tuple[Lrs, L.Trainer]:
    cfg = make_cfg([*FAST, *overrides])
    dm = build_datamodule(run_of(cfg))
    dm.set_subset(None)
    lrs = Lrs()
    module = build_classifier(run_of(cfg), build_model(run_of(cfg), 0))
    trainer = build_trainer(run_of(cfg), logger=False, enable_checkpointing=False, callbacks=[lrs])
    trainer.fit(module, datamodule=dm)
    return lrs, trainer


def test_every_group_lists_the_options_the_ecosystem_expects():
    options = {
        group: sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))
        for group in ("optimizer", "scheduler", "trainer", "callbacks", "debug", "logger")
    }
    assert options["optimizer"] == ["adamw", "sgd"]
    assert options["scheduler"] == ["constant", "cosine", "linear", "onecycle"]
    assert options["trainer"] == ["cpu", "ddp", "default", "gpu"]
    assert options["callbacks"] == ["default", "none"]
    assert "fdr" in options["debug"]
    assert "tensorboard" in options["logger"]
    assert (CONFIGS / "hparams_search" / "lr_wd.yaml").is_file()


# --------------------------------------------------------------------------- optimizer, scheduler


def test_the_default_is_the_papers_sgd_with_a_per_step_cosine(make_cfg):
    lrs, trainer = fit_lrs(make_cfg, ["trainer.max_epochs=2"])
    optimizer = trainer.optimizers[0]
    assert isinstance(optimizer, torch.optim.SGD)
    group = optimizer.param_groups[0]
    assert (group["momentum"], group["nesterov"], group["weight_decay"]) == (0.9, True, 5e-4)
    schedule = trainer.lr_scheduler_configs[0]
    assert isinstance(schedule.scheduler, torch.optim.lr_scheduler.CosineAnnealingLR)
    assert schedule.interval == "step" and schedule.scheduler.T_max == trainer.global_step == 32
    assert lrs.lrs[0] == 0.1
    assert lrs.lrs[-1] == pytest.approx(0.05 * (1 + math.cos(math.pi * 31 / 32)))


def test_adamw_with_onecycle_warms_up_to_the_peak_and_anneals(make_cfg):
    lrs, trainer = fit_lrs(
        make_cfg,
        ["optimizer=adamw", "optimizer.lr=0.01", "scheduler=onecycle", "trainer.max_epochs=2"],
    )
    assert isinstance(trainer.optimizers[0], torch.optim.AdamW)
    assert isinstance(
        trainer.lr_scheduler_configs[0].scheduler, torch.optim.lr_scheduler.OneCycleLR
    )
    seen = lrs.lrs
    peak = max(range(len(seen)), key=seen.__getitem__)
    assert seen[0] == pytest.approx(0.01 / 25)  # lr / div_factor
    assert max(seen) == pytest.approx(0.01, rel=0.02) and 5 <= peak <= 14  # ~30% of 32 steps
    assert seen[-1] < 1e-3 * 0.01 * 25  # near lr / (div_factor * final_div_factor)
    assert lrs.momenta[peak] < lrs.momenta[0]  # beta1 cycles the other way


def test_linear_decays_to_zero_on_the_step_budgets_last_step(make_cfg):
    """Budgeted training's schedule: a straight line from lr to 0 over the fit's steps (2 epochs
    of 16 batches), and over a step budget that ends mid-epoch (11 steps, as full_schedule's)."""
    lrs, trainer = fit_lrs(make_cfg, ["scheduler=linear", "trainer.max_epochs=2"])
    assert trainer.global_step == 32
    assert lrs.lrs == pytest.approx([0.1 * (1 - k / 32) for k in range(32)])
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    budget = linear(optimizer, Clock(total_steps=lambda: 11))
    seen = []
    for _ in range(11):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        budget.step()
    assert seen == pytest.approx([0.1 * (1 - k / 11) for k in range(11)])
    assert optimizer.param_groups[0]["lr"] == 0.0  # after the budget's last step


def test_constant_keeps_the_learning_rate(make_cfg):
    lrs, trainer = fit_lrs(make_cfg, ["scheduler=constant", "optimizer.lr=0.03"])
    assert trainer.lr_scheduler_configs == [] and set(lrs.lrs) == {0.03}


def test_a_torch_scheduler_class_is_stepped_once_per_epoch(make_cfg):
    lrs, _ = fit_lrs(
        make_cfg,
        [
            "scheduler._target_=torch.optim.lr_scheduler.StepLR",
            "+scheduler.step_size=1",
            "+scheduler.gamma=0.5",
            "trainer.max_epochs=3",
        ],
    )
    assert sorted(set(lrs.lrs), reverse=True) == pytest.approx([0.1, 0.05, 0.025])
    assert lrs.lrs[:16] == [0.1] * 16  # one value per epoch of 16 batches


def test_over_epochs_the_schedules_follow_the_share_of_training_done():
    """Dynamic pruning's epochs differ in length: the schedules run over `clock.progress`."""
    done = [0.0]
    clock = Clock(total_steps=lambda: 1, progress=lambda: done[0])

    def factors(make: Any) -> list[float]:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0, momentum=0.9)
        schedule = make(optimizer, clock)
        out = []
        for share in (0.15, 0.3, 0.65, 1.0):
            done[0] = share
            optimizer.step()
            schedule.step()
            out.append(optimizer.param_groups[0]["lr"])
        return out

    assert factors(cosine) == [0.5 * (1 + math.cos(math.pi * p)) for p in (0.15, 0.3, 0.65, 1.0)]
    assert factors(linear) == pytest.approx([0.85, 0.7, 0.35, 0.0])
    warm, peak, half, end = factors(one_cycle)
    assert 1 / 25 < warm < peak == pytest.approx(1.0) and end == pytest.approx(1 / 25 / 1e4)
    assert half == pytest.approx(end + (1 - end) * 0.5)  # halfway down the cosine


def test_jigsaw_learners_use_the_optimizer_group_at_their_own_lr(make_cfg, monkeypatch):
    import lipt.stages.build

    made: list[dict[str, Any]] = []
    real = lipt.stages.build.Classifier

    def spy(model: Any, **kwargs: Any) -> Any:
        module = real(model, **kwargs)
        optimizer = kwargs["optimizer"]
        made.append(
            {"optimizer": optimizer.func, **optimizer.keywords, "schedule": kwargs["scheduler"]}
        )
        return module

    monkeypatch.setattr(lipt.stages.build, "Classifier", spy)
    cfg = make_cfg(["optimizer=adamw", "pretrain.optim.lr=0.004", "scheduler=onecycle"])
    build_classifier(run_of(cfg), build_model(run_of(cfg), 0), **dict(cfg.pretrain.optim))
    assert made[0]["optimizer"] is torch.optim.AdamW
    assert made[0]["lr"] == 0.004 and made[0]["weight_decay"] == 0.05  # adamw's own
    assert made[0]["schedule"] is cosine  # the learner's schedule, not main training's


# --------------------------------------------------------------------------- keys no option has


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("optim.lr=0.05", "Could not override 'optim.lr'"),
        ("+optim.momentum=0.5", "optim is not a setting here"),
        ("optim.scheduler=constant", "Could not override 'optim.scheduler'"),
        ("pretrain.optim.nesterov=false", "Could not override 'pretrain.optim.nesterov'"),
    ],
)
def test_a_key_no_option_has_is_refused_in_one_line(override, words, capsys):
    from lipt.run.precheck import precheck

    with pytest.raises(SystemExit) as exit_:
        precheck("train", [override], multirun=False)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and words in lines[0], lines


# --------------------------------------------------------------------------- trainer presets


def test_trainer_presets_compose_on_the_default(make_cfg):
    default = make_cfg([]).trainer
    for preset, expected in (
        ("cpu", {"accelerator": "cpu", "devices": 1, "strategy": "auto"}),
        ("gpu", {"accelerator": "gpu", "devices": 1, "strategy": "auto"}),
        ("ddp", {"accelerator": "auto", "devices": 2, "strategy": "ddp"}),
    ):
        trainer = make_cfg([f"trainer={preset}"]).trainer
        assert {k: trainer[k] for k in expected} == expected
        assert trainer.max_epochs == default.max_epochs and trainer._target_ == default._target_
    assert build_trainer(run_of(make_cfg([*FAST, "trainer=cpu"])), logger=False).num_devices == 1


# `trainer=ddp` trains on two CPU processes: tests/test_train.py's DDP run uses the preset.


# --------------------------------------------------------------------------- callbacks


def test_callbacks_default_adds_best_checkpoint_and_lr_log_and_changes_no_result(
    make_cfg, tmp_path
):
    runs = {}
    for option in ("default", "none"):
        out = tmp_path / option
        cfg = make_cfg(
            [
                *FAST,
                "selector=coverage",
                "budget=subset",
                "logger=csv",
                "trainer.max_epochs=3",
                "trainer.log_every_n_steps=1",
                f"callbacks={option}",
                f"paths.output_dir={out}",
            ]
        )
        runs[option] = (train_stage.run(validate(cfg)), out)
    (with_cb, out), (without, out_none) = runs["default"], runs["none"]
    assert with_cb["test_accuracy"] == without["test_accuracy"]
    assert with_cb["val_accuracy"] == without["val_accuracy"]
    a = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(out_none / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["epoch"] == b["epoch"] == 2  # early stopping's default patience stops no run
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in b["state_dict"])
    assert (out / "checkpoints" / "best.ckpt").is_file()
    assert not (out_none / "checkpoints" / "best.ckpt").exists()
    header = next((out / "csv").rglob("metrics.csv")).read_text().splitlines()[0]
    assert "lr-SGD" in header.split(",")


def test_callbacks_that_need_a_bar_or_a_logger_are_left_out_without_them(make_cfg):
    from lightning.pytorch.callbacks import (
        EarlyStopping,
        LearningRateMonitor,
        ModelCheckpoint,
        RichProgressBar,
    )

    cfg = make_cfg([*FAST, "callbacks=default"])
    kinds = [type(c) for c in build_callbacks(run_of(cfg), loggers=["a logger"], bars=True)]
    assert kinds == [ModelCheckpoint, EarlyStopping, LearningRateMonitor, RichProgressBar]
    kinds = [type(c) for c in build_callbacks(run_of(cfg), loggers=[], bars=False)]
    assert kinds == [ModelCheckpoint, EarlyStopping]
    assert build_callbacks(run_of(make_cfg([*FAST, "callbacks=none"])), ["a logger"], True) == []
    stopping = build_callbacks(run_of(make_cfg([*FAST, "trainer.max_epochs=7"])), [], False)[1]
    assert (stopping.monitor, stopping.patience) == ("val/acc", 7)
    kinds = [type(c) for c in build_callbacks(run_of(cfg), ["a logger"], False, validation=False)]
    assert kinds == [LearningRateMonitor]  # nothing to monitor without a validation split


def test_callbacks_default_runs_without_a_validation_split_and_stops_mid_epoch(make_cfg):
    """A run stopped by max_steps mid-epoch (approach=full_steps) or without validation rows
    still runs with the default callbacks."""
    overrides = ["budget=full", "dataset.val_size=0", "++trainer.max_steps=5"]
    summary = train_stage.run(validate(make_cfg([*FAST, *overrides])))
    assert summary["stages"]["train"]["samples"] == 5 * 32 and summary["val_accuracy"] is None


# --------------------------------------------------------------------------- logger, debug


def test_logger_tensorboard_writes_event_files_in_the_run_folder(make_cfg, tmp_path):
    overrides = [o for o in FAST if o != "logger=none"]
    train_stage.run(validate(make_cfg([*overrides, "logger=tensorboard"])))
    events = list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    assert events and all(tmp_path in e.parents for e in events)


def test_debug_fdr_runs_every_stage_on_a_few_batches(make_cfg, tmp_path):
    cfg = make_cfg(
        [
            "debug=fdr",
            "selector=coverage",  # the subset pipeline: pre-training and selection run too
            "dataset=synthetic",
            "model.width=8",
            "batch_size=32",
            "trainer.accelerator=cpu",
        ]
    )
    assert cfg.pretrain.name == "jigsaw"  # the default
    summary = train_stage.run(validate(cfg))
    stages = summary["stages"]
    assert stages["pretrain"]["learners_merged"] == 10
    assert stages["pretrain"]["samples"] == 10 * 2 * 32  # every learner stopped after 2 steps
    assert stages["select"]["seconds"] > 0 and summary["subset_size"] == 50
    assert stages["train"]["samples"] == 32 + 18  # 2 batches: the subset of 50
    assert summary["test_accuracy"] is not None
    for name in ("summary.json", "subset.npz", "subset.png", "merge_report.json"):
        assert (tmp_path / name).is_file(), name
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


# --------------------------------------------------------------------------- hparams_search


def test_a_task_returns_the_optimized_metric_as_a_float(make_cfg):
    summary = {"val_accuracy": 0.75, "test_accuracy": 0.7}
    assert task_result(make_cfg([]), summary) is summary
    assert task_result(make_cfg(["hparams_search=lr_wd"]), summary) == 0.75


def test_the_precheck_tries_both_ends_of_each_search_interval(tmp_path, monkeypatch, capsys):
    from lipt.run.precheck import precheck

    monkeypatch.chdir(tmp_path)
    fixed = [*FAST, "hparams_search=lr_wd"]
    precheck("train", fixed)  # the search as configured: every end passes
    with pytest.raises(SystemExit) as stop:
        precheck("train", [*fixed, "optimizer.lr=interval(0.0, 0.1)"])
    assert stop.value.code == 2
    assert "optimizer.lr" in capsys.readouterr().err


def test_one_optuna_trial_of_hparams_search_returns_its_validation_accuracy(tmp_path):
    sweep = tmp_path / "sweep"
    args = [*FAST, "hparams_search=lr_wd", "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={sweep}"]
    out = run_entry("train.py", args, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert results["best_value"] == summary["val_accuracy"] > 0
    lr, wd = (
        results["best_params"]["optimizer.lr"],
        results["best_params"]["optimizer.weight_decay"],
    )
    assert 0.01 <= lr <= 0.5 and 1e-5 <= wd <= 1e-2
    assert summary["config"]["optimizer"]["lr"] == pytest.approx(lr)


def test_the_groups_are_listed_in_help():
    out = run_entry("train.py", ["--help"], timeout=120)
    assert out.returncode == 0, out.stderr
    for line in (
        "optimizer: adamw, sgd",
        "scheduler: constant, cosine, linear, onecycle",
        "trainer: cpu, ddp, default, gpu",
        "callbacks: default, none",
        "debug: fdr",
        "hparams_search: lr_wd",
    ):
        assert line in out.stdout, line


def test_summary_json_records_the_optimizer_and_scheduler(make_cfg, tmp_path):
    summary = train_stage.run(validate(make_cfg([*FAST, "optimizer=adamw", "scheduler=constant"])))
    config = summary["config"]
    assert config["optimizer"]["_target_"] == "torch.optim.AdamW"
    assert config["scheduler"]["_target_"] == "lipt.models.schedules.constant"
    assert "optim" not in config
    assert Path(tmp_path / "summary.json").is_file()
