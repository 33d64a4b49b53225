"""Command lines a shell user types that lipt refuses in one line before any work: a run
folder on a full disk, a folder named in letters Hydra reads only in quotes, Hydra's
--shell-completion without a command."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lipt.core.errors import UserError
from lipt.run import precheck
from tests.helpers import FAST, run_entry


def test_a_run_folder_on_a_full_disk_is_refused_before_hydra_writes_into_it(monkeypatch, tmp_path):
    # Hydra's .hydra/ on a full disk ended in its traceback, exit code 1, a half hydra.yaml
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=8192))
    with pytest.raises(UserError, match=r"its disk is full: 8 KiB free at .*; free 1 MiB or more"):
        precheck.check_writable(f"hydra.run.dir={tmp_path / 'run'}")
    assert not (tmp_path / "run").exists()


def test_a_run_folder_with_room_passes(tmp_path):
    assert precheck.full(tmp_path / "new" / "run") is None


def test_a_non_ascii_folder_is_refused_with_the_quoting_that_works(tmp_path: Path):
    folder = tmp_path / "über run"
    out = run_entry("train.py", [*FAST, f"hydra.run.dir={folder}", "dry_run=true"], timeout=300)
    assert out.returncode == 2
    line = out.stderr.strip()
    assert "\n" not in line
    assert f"write \"hydra.run.dir='{folder}'\"" in line, line
    fixed = run_entry("train.py", [*FAST, f"hydra.run.dir='{folder}'", "dry_run=true"], timeout=300)
    assert fixed.returncode == 0, fixed.stderr


def test_quoted_override_points_at_the_character():
    message = "LexerNoViableAltException: name=naïve\n" + " " * 34 + "^\nSee https://hydra.cc"
    assert precheck.quoted_override("name=naïve", message) == (
        "Hydra reads 'ï' only in a quoted value: write \"name='naïve'\""
    )
    # an ASCII character the lexer stops at, or a value quoted already: Hydra's own reason
    assert precheck.quoted_override('name=a"b', message.replace("naïve", 'a"b')) is None


@pytest.mark.parametrize("args", [["--shell-completion"], ["-sc", "install=tcsh"]])
def test_shell_completion_without_a_command_is_one_line(args):
    out = run_entry("train.py", args, timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith("error: --shell-completion takes one of install=")
    assert out.stderr.count("\n") == 1, out.stderr
