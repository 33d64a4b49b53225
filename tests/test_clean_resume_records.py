"""What a resume reads back of label cleaning (clean.json, label_issues.csv): cleaning is not
main training, so a resume that changes only where main training's fit ends (early stopping's
settings, or the epochs its patience follows) reads the issues back rather than training every
K-fold model again; so does one beside a clean.json of an older lipt, in rank 0 and in srun's
other tasks alike (they waited for a clean.json rank 0 never writes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from lipt.run.config import validate
from lipt.stages import clean as clean_stage
from lipt.stages.build import build_parts
from tests.helpers import FAST, compose_train

# K-fold cleaning (2 folds) of a pool with 30% of its labels flipped: it reuses saved issues.
NOISY = [*FAST, "dataset.label_noise.rate=0.3", "dataset.label_noise.seed=4"]
KFOLD = [*NOISY, "clean=cleanlab", "clean.folds=2"]


def _refind(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the resume trained the K-fold models again")


@pytest.fixture(scope="module")
def first_attempt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """A first attempt's K-fold cleaning (label_issues.csv, clean.json in its folder), run
    once for the module: every test resumes beside a copy of its folder (_cleaned)."""
    root = tmp_path_factory.mktemp("first_attempt")
    run = validate(compose_train(root, KFOLD))
    out = root / "run"
    out.mkdir()
    cleaned = clean_stage.clean_pool(run, build_parts(run), out, resume=False)
    assert cleaned is not None and len(cleaned.issues) > 0
    return cleaned, out


def _cleaned(first_attempt: tuple[Any, Path], out: Path) -> Any:
    """The first attempt's K-fold cleaning, its files copied into `out`."""
    cleaned, folder = first_attempt
    shutil.copytree(folder, out)
    return cleaned


@pytest.mark.parametrize(
    "changed",
    [
        "callbacks.early_stopping.patience=2",
        # patience interpolates the epochs: another trainer.max_epochs changes it too
        "trainer.max_epochs=3",
    ],
)
def test_a_resume_with_other_early_stopping_reads_the_issues_back(
    make_cfg: Any,
    first_attempt: tuple[Any, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    changed: str,
) -> None:
    """Killed before main training saved an epoch, a run resumed with another patience (or
    another max_epochs, which the default patience follows) trained every fold again: the
    clean.json the first attempt wrote records its patience, which cleaning does not use."""
    out = tmp_path / "run"
    first = _cleaned(first_attempt, out)
    resumed = validate(make_cfg([*KFOLD, changed]))
    monkeypatch.setattr(clean_stage, "find_scored_issues", _refind)
    again = clean_stage.clean_pool(resumed, build_parts(resumed), out, resume=True)
    assert again is not None and torch.equal(again.issues.rows, first.issues.rows)
    assert again.stats == first.stats


def test_a_clean_json_of_before_early_stopping_was_recorded_is_read_back(
    make_cfg: Any,
    first_attempt: tuple[Any, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """clean.json as lipt wrote it before callbacks.early_stopping joined the result settings
    (its `settings` lack those keys): a resume with the very same command trained every fold
    again, and rewrote it."""
    out = tmp_path / "run"
    first = _cleaned(first_attempt, out)
    path = out / clean_stage.CLEAN_FILE
    saved = json.loads(path.read_text())
    settings = saved[clean_stage.SETTINGS_KEY]
    older = {key: value for key, value in settings.items() if not key.startswith("callbacks.")}
    path.write_text(json.dumps({**saved, clean_stage.SETTINGS_KEY: older}))
    run = validate(make_cfg(KFOLD))
    monkeypatch.setattr(clean_stage, "find_scored_issues", _refind)
    again = clean_stage.clean_pool(run, build_parts(run), out, resume=True)
    assert again is not None and torch.equal(again.issues.rows, first.issues.rows)


def test_an_extra_task_resuming_beside_an_older_lipts_clean_json_reads_it_back(
    make_cfg: Any,
    first_attempt: tuple[Any, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A clean.json of no settings (an older lipt's) stands for a resume: rank 0 reads its
    issues back and leaves it as it is. srun's other tasks waited for a clean.json of this
    run's settings, which rank 0 never writes: 24 hours (here 5 s), while rank 0 waited for them
    to join the process group."""
    import functools

    from lipt.core.job import wait_for_file

    out = tmp_path / "run"
    first = _cleaned(first_attempt, out)
    path = out / clean_stage.CLEAN_FILE
    older = json.loads(path.read_text())
    del older[clean_stage.SETTINGS_KEY]
    path.write_text(json.dumps(older))
    run = validate(make_cfg(KFOLD))
    parts = build_parts(run)
    monkeypatch.setattr(clean_stage, "find_scored_issues", _refind)
    monkeypatch.setattr(clean_stage, "wait_for_file", functools.partial(wait_for_file, seconds=5))
    monkeypatch.setenv("SLURM_PROCID", "1")
    again = clean_stage.clean_pool(run, parts, out, resume=True)
    assert again is not None and torch.equal(again.issues.rows, first.issues.rows)
