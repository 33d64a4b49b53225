"""The DataLoader path with workers resumes bit for bit: its workers are started each epoch
from the random state the checkpoint restores (persistent workers, kept from the first epoch,
came back with other random states, and so other augmentation, after a resume)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lipt.models.classifier import Classifier
from lipt.run.config import validate
from lipt.stages import train as train_stage
from tests.helpers import FAST

WORKERS = [
    *[o for o in FAST if not o.startswith(("trainer.max_epochs", "budget="))],
    "budget=full",
    # two epochs: the resumed epoch 1 is where workers kept from epoch 0 would draw otherwise
    "trainer.max_epochs=2",
    "dataset.num_train=600",
    "dataset.resident=false",
    "dataset.num_workers=2",
]


class SimulatedCrashError(RuntimeError):
    pass


def weights(folder: Any) -> dict[str, torch.Tensor]:
    return torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def killed_in_epoch_1(make_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Main training raises at batch 2 of epoch 1: epoch 0 is checkpointed."""
    real_step = Classifier.training_step

    def crash(self: Classifier, batch: Any, batch_idx: int) -> Any:
        if self.current_epoch == 1 and batch_idx == 2:
            raise SimulatedCrashError("killed")
        return real_step(self, batch, batch_idx)

    monkeypatch.setattr(Classifier, "training_step", crash)
    with pytest.raises(SimulatedCrashError):
        train_stage.run(validate(make_cfg(WORKERS)))
    monkeypatch.undo()


@pytest.mark.slow
def test_a_run_with_data_workers_resumes_bit_for_bit(make_cfg, monkeypatch, tmp_path):
    killed_in_epoch_1(make_cfg, monkeypatch)
    resumed = train_stage.run(validate(make_cfg([*WORKERS, "ckpt_path=last"])))
    killed = weights(tmp_path)

    clean = tmp_path / "clean"
    uninterrupted = train_stage.run(validate(make_cfg([*WORKERS, f"paths.output_dir={clean}"])))
    assert all(torch.equal(killed[k], weights(clean)[k]) for k in killed)  # bit for bit
    assert resumed["test_accuracy"] == uninterrupted["test_accuracy"]


def test_a_resume_with_other_data_workers_is_refused_where_they_draw(make_cfg, monkeypatch):
    """On the DataLoader path the workers draw the augmentation: their number is one of the
    run's settings there (on the resident path it is only how fast)."""
    from lipt.core.errors import UserError

    killed_in_epoch_1(make_cfg, monkeypatch)
    words = "dataset.num_workers=2, this run has dataset.num_workers=0"
    with pytest.raises(UserError, match=words):
        train_stage.run(validate(make_cfg([*WORKERS, "dataset.num_workers=0", "ckpt_path=last"])))
