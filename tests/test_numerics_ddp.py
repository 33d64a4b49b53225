"""Main training that diverges on one DDP rank only (two CPU processes, gloo): every rank stops
at the same step with the one-line DivergedError, instead of the rank that saw the NaN stopping
alone and the other waiting for it in the gradient all-reduce until a timeout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from tests.helpers import ROOT, run_entry


class NanOnRankOne(nn.Module):
    """Finite logits, but NaN ones in rank 1's training forward from its third step on."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        out = self.net(x)
        if self.training:
            self.calls += 1
            if torch.distributed.get_rank() == 1 and self.calls >= 3:
                out = out * float("nan")
        return out


def ddp_main(out: Path) -> None:
    import lipt
    from lipt.models.classifier import Classifier, DivergedError

    torch.manual_seed(0)
    data = lipt.PoolDataModule(
        TensorDataset(torch.randn(800, 8), torch.arange(800) % 4), batch_size=50
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(Classifier(NanOnRankOne(), 4), datamodule=data)
        said = "finished"
    except DivergedError as e:
        said = f"stopped at step {e.step}"
    (out / f"rank{trainer.global_rank}.txt").write_text(said)


@pytest.mark.slow
@pytest.mark.ddp
def test_a_loss_that_goes_nan_on_one_rank_stops_every_rank_at_that_step(tmp_path):
    env = {"PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    done = run_entry(str(Path(__file__)), [str(tmp_path)], env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)]
    assert said == ["stopped at step 3", "stopped at step 3"], said


if __name__ == "__main__":
    ddp_main(Path(sys.argv[1]))
