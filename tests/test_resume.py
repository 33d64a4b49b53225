"""A run killed at any stage of train.py resumes with `ckpt_path=last` and ends as if it had
never been interrupted: killed in main training it resumes from its last checkpoint; killed in
pre-training it keeps the learners that finished; killed after selection it keeps the subset.
Each kill waits for an artifact of that stage to appear on disk, never for a fixed time."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from lipt.models.classifier import Classifier
from lipt.run.config import validate
from lipt.stages import train as train_stage
from lipt.stages.build import build_datamodule
from lipt.stages.training_plan import main_schedule
from tests.helpers import FAST, run_entry, start_entry


@pytest.mark.first
@pytest.mark.slow
def test_killed_run_resumes_with_ckpt_path_last(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *[o for o in FAST if not o.startswith("trainer.max_epochs")],
        # 1,500 rows: a partial last batch each epoch, and epochs of 28-pixel images long enough
        # for the kill to land between two checkpoints
        "dataset.num_train=1500",
        "dataset.image_size=28",
        "model.width=16",
        "fraction=0.5",
        "selector=el2n",
        "budget=subset",
        "reselect_every=2",
        "trainer.max_epochs=5",  # re-selections after epochs 2 and 4, an epoch after each
        f"hydra.run.dir={run_dir}",
    ]
    last = run_dir / "checkpoints" / "last.ckpt"
    _kill_after_epoch(args, last, 1)  # two epochs checkpointed: one re-selection in force
    assert not (run_dir / "summary.json").exists()
    killed_ckpt = torch.load(last, weights_only=True)
    killed_at = killed_ckpt["global_step"]
    first_attempt = json.loads((run_dir / "stages.json").read_text())

    out = run_entry("train.py", [*args, "ckpt_path=last"])
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    subset = summary["subset_size"]  # 0.5 * (1500 - 100)
    steps_per_epoch = -(-subset // 32)
    final = torch.load(last, weights_only=True)
    assert final["global_step"] == 5 * steps_per_epoch > killed_at
    # samples count the whole run once: 5 epochs, not the replayed partial epoch twice
    assert summary["stages"]["train"]["samples"] == 5 * subset
    assert summary["stages"]["train"]["reselections"] == 2  # after epochs 2 and 4
    # epoch 2's profile came through the checkpoint: the resumed attempt did not re-select there
    assert sorted(summary["stages"]["train"]["reselect_profiles"]) == ["2", "4"]
    # the selection stage as the killed attempt recorded it, and training seconds of both
    assert summary["stages"]["select"] == first_attempt["select"]
    assert summary["stages"]["train"]["seconds"] > killed_ckpt["seconds_trained"] > 0
    assert not list(run_dir.rglob("*.tmp"))  # no half-written files left behind

    # Ends bit for bit where the run never killed ends: the shuffle seed, the epoch each loader
    # shuffles for and the global random streams all continue across the resume.
    clean = tmp_path / "clean"
    _finish([*args[:-1], f"hydra.run.dir={clean}"])
    model, model_clean = _model(run_dir), _model(clean)
    assert all(torch.equal(model[k], model_clean[k]) for k in model)
    assert (
        summary["test_accuracy"]
        == json.loads((clean / "summary.json").read_text())["test_accuracy"]
    )


def test_resume_without_a_checkpoint_is_a_user_error(make_cfg):
    from lipt.core.errors import UserError
    from lipt.run.config import validate
    from lipt.stages import train as train_stage

    with pytest.raises(UserError, match="ckpt_path=last"):
        train_stage.run(validate(make_cfg([*FAST, "ckpt_path=last"])))


def test_resume_of_a_finished_run_keeps_its_summary_and_trains_nothing(make_cfg, tmp_path):
    from lipt.run.config import validate
    from lipt.stages import train as train_stage

    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"test_accuracy": 0.5, "stages": {"train": {"seconds": 9.0}}}))
    before = _stamp(summary)
    # selector=el2n without a pre-trained model would need one: nothing of the run may start.
    got = train_stage.run(
        validate(make_cfg([*FAST, "ckpt_path=last", "selector=el2n", "budget=subset"]))
    )
    assert got == {"test_accuracy": 0.5, "stages": {"train": {"seconds": 9.0}}}
    assert _stamp(summary) == before
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_with_ckpt_path_last(tmp_path):
    # Three jobs: one finished, one killed after its last epoch's checkpoint, one never started.
    sweep = tmp_path / "sweep"
    args = ["-m", *FAST, "fraction=0.5", "seed=0,1,2", f"hydra.sweep.dir={sweep}"]
    _finish(args)
    first = {job: json.loads((sweep / job / "summary.json").read_text()) for job in "012"}
    finished = _stamp(sweep / "0" / "summary.json")
    (sweep / "1" / "summary.json").unlink()
    subprocess.run(["rm", "-r", str(sweep / "2")], check=True)

    out = _finish([*args, "ckpt_path=last"])
    assert _stamp(sweep / "0" / "summary.json") == finished  # kept as it was, not re-tested
    assert "finished already" in (sweep / "0" / "train.log").read_text()
    # each job's line, the finished one's from its summary
    assert len(re.findall(r"^#\d .*:  test 0\.\d+", out.stdout, re.MULTILINE)) == 3, out.stdout
    for job in "12":
        again = json.loads((sweep / job / "summary.json").read_text())
        assert again["test_accuracy"] == first[job]["test_accuracy"], job
    # The job that never started ran whole, with its own timings.
    assert json.loads((sweep / "2" / "summary.json").read_text())["stages"]["train"]["seconds"] > 0


def _start(args: list[str]) -> Any:
    return start_entry("train.py", args)


def _kill_when(proc: Any, ready: Path, timeout: float = 300) -> None:
    """SIGKILL the run (no clean-up: a crash or a pre-emption) as soon as `ready` exists."""
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None and not ready.exists():
            time.sleep(0.02)
        assert proc.poll() is None, f"the run ended before {ready.name} appeared"
        assert ready.exists(), f"{ready} did not appear in {timeout} s"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _kill_after_epoch(args: list[str], last: Path, epoch: int) -> None:
    """Start train.py with `args` and SIGKILL it (no clean-up: as a crash or a pre-emption)
    once `last` holds epoch `epoch` or later."""
    proc = _start(args)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if last.is_file() and torch.load(last, weights_only=True)["epoch"] >= epoch:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "training finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_a_killed_step_budget_run_resumes_to_the_uninterrupted_steps_and_weights(tmp_path):
    """The whole pool on 30% of a 12-epoch schedule (full_schedule: a step budget of 3.6
    epochs, stopped mid-epoch), killed after an epoch: resumed, it trains the budget's steps
    and ends where the uninterrupted run ends. (With Lightning's max_steps, a resume from an
    epoch's end counted that epoch twice and stopped an epoch short.)"""
    run_dir, clean = tmp_path / "run", tmp_path / "clean"
    args = [
        *[o for o in FAST if not o.startswith(("trainer.max_epochs", "budget="))],
        "dataset.num_train=3000",
        "model.width=16",
        "+approach=full_schedule",
        "fraction=0.3",
        "trainer.max_epochs=12",
    ]
    last = run_dir / "checkpoints" / "last.ckpt"
    _kill_after_epoch([*args, f"hydra.run.dir={run_dir}"], last, 1)
    killed_at = torch.load(last, weights_only=True)["global_step"]
    _finish([*args, f"hydra.run.dir={run_dir}", "ckpt_path=last"])
    _finish([*args, f"hydra.run.dir={clean}"])
    pool = json.loads((clean / "summary.json").read_text())["train_size"]
    per_epoch = -(-pool // 32)
    budget = round(0.3 * 12 * per_epoch)
    resumed = json.loads((run_dir / "summary.json").read_text())
    uninterrupted = json.loads((clean / "summary.json").read_text())
    final = torch.load(last, weights_only=True)["global_step"]
    assert (
        killed_at
        < final
        == budget
        == torch.load(clean / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    )
    samples = resumed["stages"]["train"]["samples"]
    assert (
        samples
        == uninterrupted["stages"]["train"]["samples"]
        == 3 * pool + (budget - 3 * per_epoch) * 32
    )
    model, model_clean = _model(run_dir), _model(clean)
    assert all(torch.equal(model[k], model_clean[k]) for k in model)


def _finish(args: list[str]) -> subprocess.CompletedProcess:
    out = run_entry("train.py", args)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _stamp(path: Path) -> tuple[int, int]:
    """(inode, mtime): an atomic rewrite gives a new inode, so an untouched file keeps both."""
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def _model(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def _same_subset(a: Path, b: Path) -> None:
    import numpy as np

    with np.load(a / "subset.npz") as sa, np.load(b / "subset.npz") as sb:
        assert np.array_equal(sa["indices"], sb["indices"])
        assert np.array_equal(sa["weights"], sb["weights"])  # bit for bit


@pytest.mark.slow
def test_killed_during_pretraining_resumes_with_the_finished_learners(tmp_path):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    args = [
        *FAST,
        "dataset.image_size=28",
        "model.width=16",
        "pretrain=jigsaw",
        "pretrain.num_learners=4",
        "pretrain.local_epochs=30",  # a few seconds per learner: the kill lands mid-stage
        "pretrain.num_threads=1",
        "merge.ratios=5",
        "selector=el2n",
        "budget=subset",
        "fraction=0.2",
    ]
    learners = killed / "learners"
    _kill_when(_start([*args, f"hydra.run.dir={killed}"]), learners / "learner_0.ckpt")
    finished = sorted(learners.glob("learner_*.ckpt"))
    assert 1 <= len(finished) < 4 and not (killed / "subset.npz").exists()
    before = {p.name: _stamp(p) for p in finished}

    out = _finish([*args, f"hydra.run.dir={killed}", "ckpt_path=last"])
    assert {p.name: _stamp(learners / p.name) for p in finished} == before  # not trained again
    assert len(list(learners.glob("learner_*.ckpt"))) == 4
    assert (out.stdout + out.stderr).count("reused from") == len(finished)

    _finish([*args, f"hydra.run.dir={clean}"])  # never interrupted
    report = json.loads((killed / "merge_report.json").read_text())
    report_clean = json.loads((clean / "merge_report.json").read_text())
    for key in ("kept", "ratios", "weights", "soup_accuracy", "best_learner_accuracy"):
        assert report[key] == report_clean[key], key  # the same soup
    _same_subset(killed, clean)
    model, model_clean = _model(killed), _model(clean)
    assert all(torch.equal(model[k], model_clean[k]) for k in model)  # bit for bit
    assert not list(killed.rglob("*.tmp"))


@pytest.mark.slow
def test_killed_after_selection_resumes_with_the_saved_subset(tmp_path):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    args = [
        *[o for o in FAST if not o.startswith("trainer.max_epochs")],
        "dataset.num_train=3000",
        "dataset.image_size=28",
        "model.width=16",
        "fraction=0.5",
        "selector=el2n",
        "budget=subset",
        # one epoch: the kill lands before its checkpoint however many follow, and the
        # resume trains the kept subset from the start
        "trainer.max_epochs=1",
    ]
    subset = killed / "subset.npz"
    _kill_when(_start([*args, f"hydra.run.dir={killed}"]), subset)
    assert not (killed / "checkpoints" / "last.ckpt").exists()  # killed before epoch 1 ended
    before = _stamp(subset)
    selecting_attempt = json.loads((killed / "stages.json").read_text())

    out = _finish([*args, f"hydra.run.dir={killed}", "ckpt_path=last"])
    assert _stamp(subset) == before  # kept, not selected again
    assert "is kept (not selected again)" in out.stdout + out.stderr
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["stages"]["train"]["samples"] == summary["subset_size"]
    # what selection cost when it ran, though the resume did not run it
    assert summary["stages"]["select"] == selecting_attempt["select"]
    assert summary["stages"]["select"]["seconds"] > 0

    _finish([*args, f"hydra.run.dir={clean}"])
    _same_subset(killed, clean)
    model, model_clean = _model(killed), _model(clean)
    assert all(torch.equal(model[k], model_clean[k]) for k in model)  # bit for bit
    clean_summary = json.loads((clean / "summary.json").read_text())
    assert summary["test_accuracy"] == clean_summary["test_accuracy"]


class SimulatedCrashError(RuntimeError):
    pass


def test_a_step_budget_killed_in_its_test_pass_resumes_to_its_budget(make_cfg, monkeypatch):
    """budget=full_steps: the whole pool for a 30% subset's 6 x 5 = 30 steps, 2 epochs of the
    500-image pool's 16 steps. Killed in the test pass, after its last checkpoint: the Trainer
    ran trainer.max_epochs=6 epochs, so the resumed fit started epoch 2 and trained a batch past
    the budget before StopAtStep ended it (31 steps, other weights). It runs the 2 epochs the
    steps span, and the resume has nothing left to train."""
    args = [o for o in FAST if not o.startswith(("trainer.max_epochs", "budget="))]
    args += ["budget=full_steps", "fraction=0.3", "trainer.max_epochs=6"]
    cfg = make_cfg(args)
    run_dir = Path(cfg.paths.output_dir)

    def killed_in_test(self: Classifier, batch: Any, batch_idx: int) -> Any:
        raise SimulatedCrashError("killed")

    monkeypatch.setattr(Classifier, "test_step", killed_in_test)
    with pytest.raises(SimulatedCrashError):
        train_stage.run(validate(cfg))
    monkeypatch.undo()
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 30
    resumed = train_stage.run(validate(make_cfg([*args, "ckpt_path=last"])))
    clean_dir = run_dir / "clean"
    clean = train_stage.run(validate(make_cfg([*args, f"paths.output_dir={clean_dir}"])))
    assert resumed["stages"]["train"]["samples"] == clean["stages"]["train"]["samples"] == 948
    final = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert final["global_step"] == 30
    model, model_clean = _model(run_dir), _model(clean_dir)
    assert all(torch.equal(model[k], model_clean[k]) for k in model)
    assert resumed["test_accuracy"] == clean["test_accuracy"]
    run = validate(make_cfg(args))
    dm = build_datamodule(run)
    schedule = main_schedule(run, dm, len(dm.pool_indices))
    assert (schedule.epochs, schedule.steps) == (2, 30)  # what the stage line announces
