"""A main training killed mid-run resumes from its last checkpoint and ends as if uninterrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import FAST, ROOT


@pytest.mark.slow
def test_killed_run_resumes_with_ckpt_path_last(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *[o for o in FAST if not o.startswith("trainer.max_epochs")],
        "dataset.num_train=3000",
        "dataset.image_size=28",
        "model.width=16",
        "fraction=0.5",
        "selector=el2n",
        "reselect_every=2",
        "trainer.max_epochs=6",
        f"hydra.run.dir={run_dir}",
    ]
    last = run_dir / "checkpoints" / "last.ckpt"
    proc = subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        # wait until at least two epochs are checkpointed (one re-selection in force)
        while time.time() < deadline and proc.poll() is None:
            if last.is_file():
                epoch = torch.load(last, weights_only=True)["epoch"]
                if epoch >= 1:
                    break
            time.sleep(0.05)
        assert proc.poll() is None, "training finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)  # no clean-up: as a crash or a pre-emption
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not (run_dir / "summary.json").exists()
    killed_at = torch.load(last, weights_only=True)["global_step"]

    out = subprocess.run(
        [sys.executable, "train.py", *args, "ckpt_path=last"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    subset = summary["subset_size"]  # 0.5 * (3000 - 100)
    steps_per_epoch = -(-subset // 32)
    final = torch.load(last, weights_only=True)
    assert final["global_step"] == 6 * steps_per_epoch > killed_at
    # samples count the whole run once: 6 epochs, not the replayed partial epoch twice
    assert summary["stages"]["train"]["samples"] == 6 * subset
    assert summary["stages"]["train"]["reselections"] == 2  # after epochs 2 and 4
    assert not list(run_dir.rglob("*.tmp"))  # no half-written files left behind


def test_resume_without_a_checkpoint_is_a_user_error(make_cfg):
    from lipt import train as train_stage
    from lipt.errors import UserError

    with pytest.raises(UserError, match="ckpt_path=last"):
        train_stage.run(make_cfg([*FAST, "ckpt_path=last"]))
