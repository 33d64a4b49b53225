"""A folder of one's own configs given with --config-dir is checked before Hydra starts, as
hydra.searchpath's are: a dry run composes, checks and builds without training, and a mistake
in a user's group file is one line before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from lipt.run.hydra_flags import with_config_dir
from tests.helpers import FAST, run_entry, selector_config

MINE = selector_config("lipt.selection.select_random")


def own_configs(root: Path) -> Path:
    (root / "selector").mkdir(parents=True)
    (root / "selector" / "mine.yaml").write_text(MINE)
    return root


@pytest.mark.slow
def test_a_dry_run_with_a_config_dir_trains_nothing(tmp_path):
    configs = own_configs(tmp_path / "my configs, too")  # a space and a comma: quoted
    out = tmp_path / "run"
    args = ["--config-dir", str(configs), *FAST, "selector=mine", "budget=subset", "dry_run=true"]
    done = run_entry("train.py", [*args, f"hydra.run.dir={out}"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dry run: 1 job" in done.stdout, done.stdout[-2000:]
    assert not (out / "summary.json").exists() and not (out / "checkpoints").exists()
    # a mistake in the user's own file is refused before Hydra starts, in one line
    (configs / "selector" / "mine.yaml").write_text(MINE + "tempreture: 2\n")
    bad = run_entry("train.py", [*args, f"hydra.run.dir={tmp_path / 'bad'}"])
    assert bad.returncode == 2 and "tempreture" in bad.stderr, bad.stderr[-2000:]
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_the_config_dir_leads_hydras_search_path(tmp_path):
    folder = tmp_path / "conf"
    folder.mkdir()
    entry = f"'file://{folder.resolve()}'"
    assert with_config_dir(["a=1"], None) == ["a=1"]
    assert with_config_dir(["a=1"], str(folder)) == ["a=1", f"hydra.searchpath=[{entry}]"]
    given = ["hydra.searchpath=[pkg://x]", "b=2"]
    assert with_config_dir(given, str(folder)) == [f"hydra.searchpath=[{entry},pkg://x]", "b=2"]
    empty = with_config_dir(["hydra.searchpath=[]"], str(folder))
    assert empty == [f"hydra.searchpath=[{entry}]"]
