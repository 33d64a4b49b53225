"""A run resumed where its folder's paths changed or its files were damaged: a run folder moved
or renamed keeps its best checkpoint's record; a truncated summary.json or stages.json is refused
in one line naming the file and the fix, nothing trained; `~` in ckpt_path is the home folder,
as the config check reads it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig

from lipt.core.errors import UserError
from lipt.core.lock import release_run_dir
from lipt.models.classifier import Classifier
from lipt.run.config import validate
from lipt.stages import train as train_stage
from tests.helpers import CONFIGS, FAST, SimulatedCrashError, crash_at

# The whole pool for 3 epochs, validated after each: best.ckpt is kept by val/acc.
WHOLE = [
    *[o for o in FAST if not o.startswith(("trainer.max_epochs", "budget="))],
    "budget=full",
    "trainer.max_epochs=3",
]
SUBSET = [*FAST, "selector=random", "budget=subset", "fraction=0.5"]


def _cfg(out: Path, overrides: Sequence[str]) -> DictConfig:
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        # quoted: Hydra's grammar reads a space in a bare value as the end of the override
        return compose("train", overrides=[f"paths.output_dir='{out}'", *overrides])


def _best_state(last: Path) -> dict[str, Any]:
    """The best-by-val/acc ModelCheckpoint's record in a checkpoint."""
    states = torch.load(last, weights_only=True)["callbacks"]
    (state,) = [
        s for key, s in states.items() if key.startswith("ModelCheckpoint{'monitor': 'val/acc'")
    ]
    return state


def test_a_moved_run_folder_resumes_with_its_best_checkpoint_record(monkeypatch, tmp_path):
    was, now = tmp_path / "run", tmp_path / "runs moved" / "rün 1"
    crash_at(monkeypatch, epoch=2)
    with pytest.raises(SimulatedCrashError):
        train_stage.run(validate(_cfg(was, WHOLE)))
    monkeypatch.undo()
    release_run_dir(was)  # as the killed process would: its folder is let go
    before = _best_state(was / "checkpoints" / "last.ckpt")
    assert before["best_model_score"] is not None and before["dirpath"].startswith(str(was))
    now.parent.mkdir()
    shutil.move(was, now)  # mv: the files keep their bytes, the folder its new name

    restored: list[tuple[Any, dict[str, Any]]] = []
    real_start = Classifier.on_train_start

    def spy(self: Classifier) -> None:  # what the resumed fit starts from
        for cb in self.trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.monitor == "val/acc":
                restored.append((cb.best_model_score, dict(cb.best_k_models)))
        real_start(self)

    monkeypatch.setattr(Classifier, "on_train_start", spy)
    train_stage.run(validate(_cfg(now, [*WHOLE, "ckpt_path=last"])))
    ((score, best_k),) = restored
    # Lightning dropped the record of another folder: best.ckpt then took epoch 2's weights
    # whatever its accuracy.
    assert score is not None and float(score) == float(before["best_model_score"])
    assert list(best_k) == [str(now.resolve() / "checkpoints" / "best.ckpt")]
    after = _best_state(now / "checkpoints" / "last.ckpt")
    assert float(after["best_model_score"]) >= float(before["best_model_score"])
    assert after["dirpath"] == str(now.resolve() / "checkpoints")


def test_a_truncated_summary_json_is_refused_in_one_line_then_resumes(tmp_path):
    first = train_stage.run(validate(_cfg(tmp_path, SUBSET)))
    summary = tmp_path / "summary.json"
    summary.write_bytes(summary.read_bytes()[:100])  # a copy cut short
    kept = (tmp_path / "checkpoints" / "last.ckpt").read_bytes()
    with pytest.raises(UserError, match=r"summary\.json is not readable JSON .*delete it") as e:
        train_stage.run(validate(_cfg(tmp_path, [*SUBSET, "ckpt_path=last"])))
    assert "\n" not in str(e.value)
    assert (tmp_path / "checkpoints" / "last.ckpt").read_bytes() == kept  # nothing trained
    summary.unlink()  # as the refusal says: the last checkpoint is tested again
    again = train_stage.run(validate(_cfg(tmp_path, [*SUBSET, "ckpt_path=last"])))
    assert again["test_accuracy"] == first["test_accuracy"]
    assert json.loads(summary.read_text())["test_accuracy"] == first["test_accuracy"]


@pytest.mark.parametrize("damage", [b'{"pretrain": {"seco', b"[1, 2]"])
def test_a_damaged_stages_json_is_refused_in_one_line(tmp_path, damage):
    train_stage.run(validate(_cfg(tmp_path, SUBSET)))
    shutil.rmtree(tmp_path / "checkpoints")  # killed after selection, before main training
    (tmp_path / "summary.json").unlink()
    (tmp_path / "stages.json").write_bytes(damage)
    with pytest.raises(UserError, match=r"stages\.json (is not readable JSON|holds a JSON list)"):
        train_stage.run(validate(_cfg(tmp_path, [*SUBSET, "ckpt_path=last"])))
    assert not (tmp_path / "checkpoints").exists()  # refused before main training
    (tmp_path / "stages.json").unlink()  # as the refusal says: it resumes without them
    summary = train_stage.run(validate(_cfg(tmp_path, [*SUBSET, "ckpt_path=last"])))
    assert set(summary["stages"]) == {"train"}


def test_a_ckpt_path_under_home_is_resumed_from(monkeypatch, tmp_path):
    first = train_stage.run(validate(_cfg(tmp_path / "first", WHOLE)))
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(tmp_path / "first" / "checkpoints" / "last.ckpt", home / "saved.ckpt")
    monkeypatch.setenv("HOME", str(home))
    # checked by lipt.run.config with ~ expanded, then refused as missing where resumed
    summary = train_stage.run(
        validate(_cfg(tmp_path / "second", [*WHOLE, "ckpt_path='~/saved.ckpt'"]))
    )
    # resumed from its last epoch: nothing more trained, the same model tested
    assert summary["stages"]["train"]["samples"] == first["stages"]["train"]["samples"]
    assert summary["test_accuracy"] == first["test_accuracy"]


@pytest.mark.parametrize("trained", [False, True])
def test_a_truncated_kept_subset_says_how_train_py_goes_on(tmp_path, trained):
    train_stage.run(validate(_cfg(tmp_path, SUBSET)))
    (tmp_path / "summary.json").unlink()
    if not trained:  # killed after selection, before main training saved an epoch
        shutil.rmtree(tmp_path / "checkpoints")
    subset = tmp_path / "subset.npz"
    subset.write_bytes(subset.read_bytes()[:1000])
    # not select.py's "re-run select.py": this run selected it
    fix = "pass a new hydra.run.dir" if trained else "delete it to select it again"
    with pytest.raises(UserError, match=rf"subset\.npz is not a readable .*; {fix}") as e:
        train_stage.run(validate(_cfg(tmp_path, [*SUBSET, "ckpt_path=last"])))
    assert "select.py" not in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "checkpoints").exists() == trained  # nothing trained before refusing
