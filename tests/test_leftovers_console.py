"""`hydra.job.chdir=True` runs the job in its run folder: the closing block's paths, shown
relative to the working directory, were relative to the run folder ("summary.json"), and did
not open from the folder the command was typed in. The entry layer hands that folder to
`console.setup` (Hydra's runtime.cwd); core/ itself knows nothing of Hydra."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lipt.core import console


@pytest.fixture
def run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A run folder with its files, the job working in it as under hydra.job.chdir=True."""
    folder = tmp_path / "outputs" / "train" / "2026-01-01" / "00-00-00"
    (folder / "checkpoints").mkdir(parents=True)
    for name in ("summary.json", "subset.npz", "checkpoints/last.ckpt", "train.log"):
        (folder / name).write_text("{}")
    monkeypatch.chdir(folder)
    yield folder
    console.setup(multirun_job=False)  # the next test's console: the working directory's


def _paths(block: str) -> list[str]:
    """The paths the closing block lists (the last word of each line after "done.")."""
    return [line.split()[-1] for line in block.splitlines() if line.startswith("  ")][-4:]


def test_the_closing_blocks_paths_open_from_the_folder_the_command_was_typed_in(
    run_folder: Path, tmp_path: Path
) -> None:
    console.setup(multirun_job=False, typed_in=tmp_path)
    paths = _paths(console.closing_block({"test_accuracy": 0.5}, Path(".")))
    assert paths == [
        "outputs/train/2026-01-01/00-00-00/summary.json",
        "outputs/train/2026-01-01/00-00-00/subset.npz",
        "outputs/train/2026-01-01/00-00-00/checkpoints/last.ckpt",
        "outputs/train/2026-01-01/00-00-00/train.log",
    ], paths
    assert all((tmp_path / path).is_file() for path in paths)
    line = console.job_line({"test_accuracy": 0.5}, Path("."), "#0 seed=0:")
    assert line.endswith("  outputs/train/2026-01-01/00-00-00"), line
    # a path outside the folder typed in: absolute, which opens from anywhere
    outside = tmp_path.parent / "elsewhere.npz"
    assert console.shown(Path("../../../../..") / outside.name) == str(outside)


def test_without_a_folder_typed_in_paths_are_the_working_directorys(run_folder: Path) -> None:
    console.setup(multirun_job=False)
    paths = _paths(console.closing_block({"test_accuracy": 0.5}, Path(".")))
    assert paths == ["summary.json", "subset.npz", "checkpoints/last.ckpt", "train.log"], paths
    assert console.shown(Path("/nowhere/x.npz")) == "/nowhere/x.npz"  # as given
