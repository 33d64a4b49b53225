"""Faults in the jigsaw stage and in a learner sweep, injected on purpose: a learner whose loss
goes non-finite, one that runs out of memory, a job that dies before writing its checkpoint.

The survivors' checkpoints stay as they were, the soup is made of what finished and says which
ids are missing, a re-run trains only the missing learners and gives the soup an uninterrupted
run gives, bit for bit; too few learners is a clear error (`pretrain.min_learners`).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

import lipt.stages.build
from lipt.core.artifacts import SHARED_FOLDER_GRACE_S
from lipt.core.errors import UserError
from lipt.jigsaw import checkpoints as jigsaw_checkpoints
from lipt.run.config import run_of, validate
from lipt.stages import jigsaw as jigsaw_stage
from lipt.stages.build import build_parts
from lipt.stages.pretrain import pretrain_model
from lipt.stages.pretrain import run as pretrain_run
from tests.helpers import run_entry

N, M, K, B = 4, 1, 3, 32
JIGSAW = [
    "dataset=synthetic",
    "model.width=8",
    f"batch_size={B}",
    "logger=none",
    "pretrain=jigsaw",
    f"pretrain.num_learners={N}",
    f"pretrain.batches_per_learner={M}",
    f"pretrain.local_epochs={K}",
    "pretrain.num_threads=1",
    "merge.ratios=5",
]


@pytest.fixture
def jigsaw_cfg(make_cfg: Callable[..., DictConfig], tmp_path: Path) -> Callable[..., DictConfig]:
    def _make(out: str, *overrides: str) -> DictConfig:
        return make_cfg(
            [*JIGSAW, *overrides, f"paths.output_dir={tmp_path / out}"], config_name="pretrain"
        )

    return _make


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _stamp(path: Path) -> tuple[int, int]:
    """(inode, mtime): an atomic rewrite gives a new inode, so an untouched file keeps both."""
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def _diverge(ids: set[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Learners `ids` train with a learning rate of 1e30: a real NaN loss within a few steps."""
    real = jigsaw_checkpoints.train_learner

    def faulty(ctx, settings, dm, init, seed, learner, shard):
        if learner in ids:
            settings = dataclasses.replace(settings, optim={**settings.optim, "lr": 1e30})
        return real(ctx, settings, dm, init, seed, learner, shard)

    monkeypatch.setattr(jigsaw_checkpoints, "train_learner", faulty)


def _run_out_of_memory(learner_id: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Learner `learner_id`'s first training step raises torch.OutOfMemoryError."""
    real = lipt.stages.build.build_classifier
    calls = {"n": 0}

    def faulty(cfg, model, **optim):
        module = real(cfg, model, **optim)
        calls["n"] += 1
        if calls["n"] == learner_id + 1:  # learners are built in id order

            def out_of_memory(batch, batch_idx):
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")

            module.training_step = out_of_memory
        return module

    monkeypatch.setattr(lipt.stages.build, "build_classifier", faulty)


def _soup(folder: Path) -> dict[str, torch.Tensor]:
    return _load(folder / "pretrain.ckpt")["state_dict"]


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_learner_whose_loss_goes_nan_is_stopped_dropped_and_counted(
    jigsaw_cfg, tmp_path, monkeypatch, caplog
):
    _diverge({2}, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="lipt.jigsaw"):
        summary = pretrain_run(validate(jigsaw_cfg("run")))
    stats = summary["stages"]["pretrain"]
    assert (stats["learners_merged"], stats["learners_failed"], stats["learners_missing"]) == (
        3,
        1,
        0,
    )
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["stages"]["pretrain"]["learners_failed"] == 1
    report = json.loads((tmp_path / "run" / "merge_report.json").read_text())
    assert report["diverged"] == [2] and 2 not in report["kept"]
    learner = report["learners"][2]
    assert learner["status"] == "diverged" and "non-finite loss" in learner["error"]
    # It stopped at the first non-finite loss instead of training on to NaN weights.
    assert learner["samples"] < K * M * B
    assert "learner 2 diverged (non-finite loss" in caplog.text
    assert all(torch.isfinite(v).all() for v in _soup(tmp_path / "run").values())
    # Its checkpoint says it diverged: a re-run keeps it out instead of training it again.
    assert _load(tmp_path / "run" / "learners" / "learner_2.ckpt")["status"] == "diverged"


def test_out_of_memory_learner_is_retrained_alone_and_the_soup_matches(
    jigsaw_cfg, tmp_path, monkeypatch
):
    _run_out_of_memory(1, monkeypatch)
    first = pretrain_run(validate(jigsaw_cfg("run")))
    learners = tmp_path / "run" / "learners"
    assert first["stages"]["pretrain"]["learners_failed"] == 1
    assert sorted(p.name for p in learners.glob("*.ckpt")) == [
        f"learner_{i}.ckpt" for i in (0, 2, 3)
    ]
    before = {i: _stamp(learners / f"learner_{i}.ckpt") for i in (0, 2, 3)}
    monkeypatch.undo()

    again = pretrain_run(validate(jigsaw_cfg("run")))  # the same command, the fault gone
    assert {i: _stamp(learners / f"learner_{i}.ckpt") for i in (0, 2, 3)} == before
    assert (learners / "learner_1.ckpt").is_file()
    assert again["stages"]["pretrain"]["learners_merged"] == N
    pretrain_run(validate(jigsaw_cfg("clean")))  # never interrupted
    assert _equal(_soup(tmp_path / "run"), _soup(tmp_path / "clean"))  # bit for bit
    clean_stats = json.loads((tmp_path / "clean" / "summary.json").read_text())["stages"]
    assert again["stages"]["pretrain"]["samples"] == clean_stats["pretrain"]["samples"]


def test_too_few_learners_is_a_clear_error_and_min_learners_lowers_the_bar(jigsaw_cfg, monkeypatch):
    _diverge({1, 2, 3}, monkeypatch)
    cfg = jigsaw_cfg("a")
    with pytest.raises(UserError, match=r"only 1 of 4 .*diverged \[1, 2, 3\].*min_learners=2"):
        pretrain_model(build_parts(run_of(cfg)), seed=0)
    cfg = jigsaw_cfg("a", "pretrain.min_learners=1")  # the same learners, reused: a soup of one
    result = pretrain_model(build_parts(run_of(cfg)), seed=0)
    assert result.stats()["learners_merged"] == 1 and result.report["kept"] == [0]


def test_every_learner_diverging_is_a_clear_error(jigsaw_cfg):
    cfg = jigsaw_cfg("a", "pretrain.optim.lr=1e30")
    with pytest.raises(UserError, match="no jigsaw learner is left to merge: all 4 diverged"):
        pretrain_model(build_parts(run_of(cfg)), seed=0)


def _job(cfg: DictConfig, learner: int, folder: Path) -> None:
    """One job of a learner sweep (what `pretrain.py -m 'pretrain.learners=...'` runs)."""
    job = cfg.copy()
    job.pretrain.learners = learner
    job.pretrain.learner_dir = str(folder)
    job.paths.output_dir = str(folder.parent / f"job{learner}")
    jigsaw_stage.run_learner_job(run_of(job))


def test_a_sweep_whose_job_died_merges_the_rest_and_a_rerun_trains_only_it(
    jigsaw_cfg, tmp_path, caplog
):
    cfg = jigsaw_cfg("sweep")
    sweep = tmp_path / "sweep"
    folder = sweep / "learners"
    for i in (0, 1, 3):
        _job(cfg, i, folder)
    # Job 2 was killed while it wrote: only its temporary file is left (atomic writes).
    (folder / ".learner_2.ckpt.x1y2.tmp").write_bytes(b"\x80half a checkpoint")
    before = {i: _stamp(folder / f"learner_{i}.ckpt") for i in (0, 1, 3)}
    with caplog.at_level(logging.WARNING, logger="lipt.jigsaw"):
        summary = jigsaw_stage.merge_learner_dir(run_of(cfg), folder, sweep)
    assert "jigsaw learners [2] have no checkpoint" in caplog.text
    report = json.loads((sweep / "merge_report.json").read_text())
    assert report["missing"] == [2] and set(report["kept"]) <= {0, 1, 3}
    stats = summary["stages"]["pretrain"]
    assert (stats["learners_merged"], stats["learners_missing"]) == (3, 1)

    caplog.clear()
    with (
        caplog.at_level(logging.INFO, logger="lipt.jigsaw"),
        caplog.at_level(logging.INFO, logger="lipt.detail"),  # "written": the log file's
    ):
        for i in range(N):  # the same sweep again
            _job(cfg, i, folder)
    assert {i: _stamp(folder / f"learner_{i}.ckpt") for i in (0, 1, 3)} == before
    assert caplog.text.count("reused from") == 3 and "learner 2 (ok) written" in caplog.text
    jigsaw_stage.merge_learner_dir(run_of(cfg), folder, sweep)
    pretrain_run(validate(jigsaw_cfg("clean")))
    assert _equal(_soup(sweep), _soup(tmp_path / "clean"))  # bit for bit


def test_a_sweep_with_a_truncated_learner_says_so_and_a_rerun_trains_it_again(
    jigsaw_cfg, tmp_path, caplog
):
    """A learner file cut short (a copy that stopped, a disk that filled outside lipt) is named
    as unreadable, not as a job that never ran; the same sweep again replaces it."""
    cfg = jigsaw_cfg("sweep")
    folder = tmp_path / "sweep" / "learners"
    for i in range(N):
        _job(cfg, i, folder)
    whole = torch.load(folder / "learner_2.ckpt", weights_only=True)["state_dict"]
    length = (folder / "learner_2.ckpt").stat().st_size
    (folder / "learner_2.ckpt").write_bytes((folder / "learner_2.ckpt").read_bytes()[: length // 3])
    with caplog.at_level(logging.WARNING, logger="lipt.jigsaw"):
        summary = jigsaw_stage.merge_learner_dir(run_of(cfg), folder, tmp_path / "sweep")
    assert "jigsaw learners [2] have an unreadable checkpoint in" in caplog.text, caplog.text
    assert "have no checkpoint" not in caplog.text
    assert summary["stages"]["pretrain"]["learners_missing"] == 1
    _job(cfg, 2, folder)  # the same sweep's job again
    again = torch.load(folder / "learner_2.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(again[k], v) for k, v in whole.items())  # trained again, the same


@pytest.mark.slow
def test_soup_callback_names_the_missing_ids_and_refuses_too_few(tmp_path):
    sweep = tmp_path / "sweep"

    def sweep_of(learners: str) -> object:
        return run_entry(
            "pretrain.py",
            [
                "-m",
                *JIGSAW,
                f"pretrain.learners={learners}",
                "hydra/callbacks=soup",
                f"hydra.sweep.dir={sweep}",
            ],
            timeout=600,
        )

    out = sweep_of("0")  # one of four: below the default min_learners (half)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "only 1 of 4 jigsaw learners are usable (missing [1, 2, 3])" in out.stderr
    assert not (sweep / "pretrain.ckpt").exists()
    out = sweep_of("0,1,3")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "jigsaw learners [2] have no checkpoint" in out.stdout + out.stderr
    report = json.loads((sweep / "merge_report.json").read_text())
    assert report["missing"] == [2]
    stamp = _stamp(sweep / "learners" / "learner_0.ckpt")
    out = sweep_of(f"range({N})")
    assert out.returncode == 0, out.stderr[-2000:]
    assert _stamp(sweep / "learners" / "learner_0.ckpt") == stamp  # reused, not retrained
    assert json.loads((sweep / "merge_report.json").read_text())["missing"] == []


def test_a_learner_job_clears_its_killed_writes_but_not_a_write_under_way(jigsaw_cfg, tmp_path):
    """A job of a learner sweep takes its own run folder's lock, and with it the temporary files
    its killed attempt left there. In the learner folder all the sweep's jobs share, a killed
    job's temporary file goes too, once older than any write, while one that another job is
    writing now (its writer holds an flock on it) stays, and so does a young one (a flock on a
    cluster file system may not reach across nodes)."""
    cfg = jigsaw_cfg("sweep")
    folder = tmp_path / "sweep" / "learners"
    own = tmp_path / "sweep" / "job3" / ".summary.json.k2x9q0ab.tmp"  # as mkstemp names them
    killed = folder / ".learner_2.ckpt.p4m8z1cd.tmp"
    writing = folder / ".learner_1.ckpt.w7v6u5ts.tmp"
    young = folder / ".learner_0.ckpt.y0u9n8gq.tmp"
    for path in (own, killed, writing, young):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x80half a file")
    long_ago = time.time() - 2 * SHARED_FOLDER_GRACE_S
    for path in (killed, writing):
        os.utime(path, (long_ago, long_ago))
    fd = os.open(writing, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a live writer holds it (lipt.core.artifacts)
        _job(cfg, 3, folder)
    finally:
        os.close(fd)
    assert (folder / "learner_3.ckpt").is_file()
    assert not own.exists() and not killed.exists()
    assert writing.read_bytes() == young.read_bytes() == b"\x80half a file"
