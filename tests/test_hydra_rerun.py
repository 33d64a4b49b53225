"""Hydra's `--experimental-rerun <run>/.hydra/config.pickle` calls the task with the pickled
config alone, without the job's Hydra node that a run reads (its folder,
`${hydra:runtime.output_dir}`), and raises on a missing file: both were tracebacks. Each is one
line and exit code 2, the first with the command that runs the job again."""

from __future__ import annotations

import pickle
from pathlib import Path

from tests.helpers import ROOT, run_entry


def test_a_rerun_gives_the_command_that_runs_the_job_again(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from lipt.run.composition import config_dir

    overrides = ["dataset=synthetic", "seed=3", "optimizer.lr=0.05"]
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("train", overrides, return_hydra_config=True)
    # what Hydra's PickleJobInfoCallback writes into <run>/.hydra/
    (tmp_path / "config.pickle").write_bytes(pickle.dumps(cfg))
    proc = run_entry(str(ROOT / "train.py"), ["--experimental-rerun", "config.pickle"], tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[-1].endswith(f"python train.py {' '.join(overrides)}"), proc.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "config.pickle"]  # no run folder


def test_a_rerun_of_a_missing_file_is_one_line(tmp_path: Path) -> None:
    proc = run_entry(str(ROOT / "train.py"), ["--experimental-rerun", "nope.pickle"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "--experimental-rerun nope.pickle cannot be read" in proc.stderr, proc.stderr
