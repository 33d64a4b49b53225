"""The entry scripts, run as a user runs them from the repository root."""

from __future__ import annotations

import os
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


def test_help_with_an_unknown_option_is_one_line_and_exit_code_2():
    out = run_entry("train.py", ["--help", "selector=nope"], timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "error: In 'train': Could not find 'selector/nope' (see `--help` for the groups and "
        "options, `+key=value` adds a new key)"
    ]


def test_the_hydra_groups_are_chosen_as_config_md_and_their_comments_spell_it():
    """hydra/callbacks, hydra/launcher and hydra/sweeper are in Hydra's own defaults list: an
    option is chosen with `group=option` (`+group=option` is refused as a second value)."""
    import re

    from hydra import compose, initialize_config_dir

    configs = ROOT / "configs"
    reference = (ROOT / "docs" / "CONFIG.md").read_text()
    with initialize_config_dir(str(configs), version_base="1.3"):
        for folder in sorted(p for p in (configs / "hydra").iterdir() if p.is_dir()):
            group = f"hydra/{folder.name}"
            assert f"`{group}=<option>`" in reference and f"`+{group}=" not in reference
            for option in sorted(folder.glob("*.yaml")):
                compose("train", [f"{group}={option.stem}"], return_hydra_config=True)
                spelled = re.findall(r"'?(hydra/callbacks=\S+?)'?$", option.read_text(), re.M)
                assert spelled or group != "hydra/callbacks", option  # each shows its command
                for override in spelled:
                    cfg = compose("train", [override], return_hydra_config=True)
                    assert "sweep_table" in cfg.hydra.callbacks, override


def test_each_job_of_a_multirun_keeps_its_caches_in_its_own_folder(tmp_path, monkeypatch):
    """A multirun's jobs run in one process: each job points wandb's and XDG's caches into its
    own folder (wandb's debug logs of job 1 landed in job 0's), and a place the user chose is
    kept for every job."""
    from lipt.run import cli

    names = ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "XDG_CACHE_HOME")
    for name in (*names, "XDG_CONFIG_HOME"):
        monkeypatch.setenv(name, "")  # so that monkeypatch restores it, set by the test or not
        monkeypatch.delenv(name)
    monkeypatch.setattr(cli, "CACHES_SET", {}, raising=False)  # as a new process has it
    users = str(tmp_path / "my-config")
    monkeypatch.setenv("XDG_CONFIG_HOME", users)
    for job in ("0", "1"):
        cli.keep_caches_in(tmp_path / job)
        for name in names:
            assert os.environ[name].startswith(str(tmp_path / job / ".cache") + "/"), name
        assert os.environ["XDG_CONFIG_HOME"] == users
    assert os.environ["WANDB_DATA_DIR"] == str(tmp_path / "1" / ".cache" / "wandb-data")
