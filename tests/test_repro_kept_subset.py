"""A run killed after selection, before main training saved an epoch, keeps its subset on a
resume: only where the groups that made it (the selector and the pre-training that ranked for
it) have the same keys. One changed is refused in one line; the subset would otherwise train
under settings that did not select it, and the summary would name them."""

from __future__ import annotations

import re
from typing import Any

import pytest

from lipt.core.artifacts import load_subset
from lipt.core.errors import UserError
from lipt.models.classifier import Classifier
from lipt.run.config import validate
from lipt.stages import train as train_stage
from tests.helpers import FAST

SUBSET = [*[o for o in FAST if not o.startswith("budget=")], "selector=random", "budget=subset"]


class SimulatedCrashError(RuntimeError):
    pass


def killed_before_an_epoch_was_saved(make_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(self: Classifier, batch: Any, batch_idx: int) -> Any:
        raise SimulatedCrashError("killed")

    monkeypatch.setattr(Classifier, "training_step", crash)
    with pytest.raises(SimulatedCrashError):
        train_stage.run(validate(make_cfg(SUBSET)))
    monkeypatch.undo()


def test_a_kept_subset_of_other_selector_settings_is_refused(make_cfg, monkeypatch, tmp_path):
    killed_before_an_epoch_was_saved(make_cfg, monkeypatch)
    _, _, meta = load_subset(tmp_path / "subset.npz")
    assert meta["selector.balance"] is False  # the selector's keys, dotted
    words = "selector.balance=False, this run has selector.balance=True;"
    with pytest.raises(UserError, match=re.escape(words)):
        train_stage.run(validate(make_cfg([*SUBSET, "selector.balance=true", "ckpt_path=last"])))
    summary = train_stage.run(validate(make_cfg([*SUBSET, "ckpt_path=last"])))
    assert summary["subset_size"] == len(load_subset(tmp_path / "subset.npz")[0])


def test_a_subset_without_the_groups_keys_is_still_kept(make_cfg, monkeypatch, tmp_path):
    """An older lipt's subset.npz records the names only: its keys are passed over."""
    from lipt.core.artifacts import save_subset

    killed_before_an_epoch_was_saved(make_cfg, monkeypatch)
    indices, weights, meta = load_subset(tmp_path / "subset.npz")
    older = {k: v for k, v in meta.items() if "." not in k and k != "format_version"}
    save_subset(tmp_path / "subset.npz", indices, weights, older)
    args = [*SUBSET, "selector.balance=true", "ckpt_path=last"]
    assert train_stage.run(validate(make_cfg(args)))["subset_size"] == len(indices)


def test_a_resume_draws_the_kept_subsets_missing_picture(make_cfg, monkeypatch, tmp_path):
    """A run killed between subset.npz and subset.png draws the picture when it resumes."""
    killed_before_an_epoch_was_saved(make_cfg, monkeypatch)
    (tmp_path / "subset.png").unlink()
    train_stage.run(validate(make_cfg([*SUBSET, "ckpt_path=last"])))
    assert (tmp_path / "subset.png").stat().st_size > 0
