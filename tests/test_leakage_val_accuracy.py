"""summary.json's `val_accuracy` is what hyper-parameters are chosen on (Optuna, the frontier's
"highest on validation"): it must be the trained weights' own, the weights `test_accuracy` is
of. A fit whose last validation came before its last step (`check_val_every_n_epoch=2` with 3
epochs, a step budget that stops mid-epoch) reported the earlier weights' number."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir

from lipt.run.config import validate
from lipt.stages import train as train_stage
from tests.helpers import CONFIGS, FAST


def _run(out: Path, extra: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The run's summary, with what the test split's weights score on validation (counted by
    hand, with no Lightning metric) and how many validations ran after the fit."""
    seen: dict[str, Any] = {"validations_after_fit": 0}
    test, validate_again = L.Trainer.test, L.Trainer.validate

    def counted_validate(self: L.Trainer, *args: Any, **kwargs: Any) -> Any:
        seen["validations_after_fit"] += 1
        return validate_again(self, *args, **kwargs)

    def spied_test(self: L.Trainer, model: Any, datamodule: Any, **kwargs: Any) -> Any:
        model.eval()
        right = total = 0
        with torch.no_grad():
            for x, y, _ in datamodule.val_dataloader():
                right += int((model(x).argmax(1) == y).sum())
                total += len(y)
        seen["final_val_accuracy"] = right / total
        return test(self, model, datamodule=datamodule, **kwargs)

    monkeypatch.setattr(L.Trainer, "validate", counted_validate)
    monkeypatch.setattr(L.Trainer, "test", spied_test)
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"paths.output_dir={out}", *FAST, *extra])
    seen["summary"] = train_stage.run(validate(cfg))
    return seen


def test_val_accuracy_is_the_trained_weights_when_validation_skipped_the_last_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _run(
        tmp_path, ["trainer.max_epochs=3", "+trainer.check_val_every_n_epoch=2"], monkeypatch
    )
    val_accuracy = seen["summary"]["val_accuracy"]
    assert val_accuracy == pytest.approx(seen["final_val_accuracy"], abs=1e-6)
    assert seen["validations_after_fit"] == 1


def test_a_fit_that_validated_its_last_step_is_not_validated_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _run(tmp_path, ["trainer.max_epochs=2"], monkeypatch)
    assert seen["validations_after_fit"] == 0
    val_accuracy = seen["summary"]["val_accuracy"]
    assert val_accuracy == pytest.approx(seen["final_val_accuracy"], abs=1e-6)
