"""Resident data lives where the trainer is told to run, also before a trainer is attached
(jigsaw learners and selection scoring batch from the data module on their own)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from omegaconf import DictConfig

from lipt.run.config import run_of
from lipt.stages.build import build_datamodule


@pytest.mark.parametrize(("accelerator", "expected"), [("cpu", "cpu"), ("auto", "cuda")])
def test_resident_batches_follow_the_trainers_accelerator_on_a_gpu_machine(
    make_cfg: Callable[..., DictConfig],
    monkeypatch: pytest.MonkeyPatch,
    accelerator: str,
    expected: str,
) -> None:
    # A machine with a GPU, as CUDA reports it: trainer.accelerator=cpu must keep data off it.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    overrides = ["dataset=synthetic", "dataset.resident=true", f"trainer.accelerator={accelerator}"]
    dm = build_datamodule(run_of(make_cfg(overrides)))
    assert dm.training_device().type == expected
