"""The entry scripts, run as a user runs them from the repository root."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT, run_entry


def test_select_py_does_not_shadow_the_standard_select_module():
    # sys.path[0] is the repo root here, exactly as for `python train.py` or `python -m pytest`.
    code = (
        "import os, sys, select, subprocess\n"
        "assert os.path.abspath(sys.path[0] or '.') == os.getcwd()\n"  # the shadowing setup
        "assert hasattr(select, 'select'), select\n"
        "assert getattr(select, '__file__', '') != os.path.abspath('select.py'), select\n"
        "cmd = [sys.executable, '-c', 'print(42)']\n"
        "print(subprocess.run(cmd, capture_output=True, text=True).stdout.strip())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "42"


def test_dataloader_workers_start_from_the_repo_root(tmp_path):
    # multiprocessing workers import subprocess/select too
    code = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "if __name__ == '__main__':\n"
        "    dl = DataLoader(list(range(8)), batch_size=4, num_workers=2)\n"
        "    print(sum(int(b.sum()) for b in dl))\n"
    )
    script = tmp_path / "workers.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "28"


@pytest.mark.parametrize("script", ["train.py", "pretrain.py", "select.py"])
def test_entry_scripts_show_hydra_help(script):
    out = run_entry(script, ["--help"], timeout=120)
    assert out.returncode == 0, out.stderr
    assert "selector" in out.stdout and "dataset" in out.stdout


def test_console_scripts_are_installed():
    bindir = __import__("pathlib").Path(sys.executable).parent
    for name in ("lipt-train", "lipt-pretrain", "lipt-select"):
        assert (bindir / name).is_file(), name
