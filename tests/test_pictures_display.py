"""What subset.png and label_issues.png show: grey images on a fixed 0-255 scale (not each
stretched to its own range), class names as typed (a folder named with "$" is no formula) and
cut when long, a picture that cannot be drawn left out without stopping the run, and the wandb
class table's shares as plain ratios."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lipt.report import pictures
from lipt.report.pictures import (
    NAME_CHARS,
    issues_figure,
    subset_figure,
    write_issues_picture,
    write_subset_picture,
)
from lipt.run.config import run_of
from lipt.stages.build import build_datamodule


def shown_grey(axes: Any) -> np.ndarray:
    """The grey levels an axes' image is drawn with (0-255), as the PNG holds them."""
    (image,) = axes.get_images()
    pixels = np.asarray(image.get_array())
    assert pixels.ndim == 2  # one channel through the grey colour map (not RGB, nor RGBA)
    return image.to_rgba(pixels, bytes=True)[..., 0]


def test_grey_images_are_shown_as_they_are_not_stretched(make_cfg, tmp_path):
    dm = build_datamodule(run_of(make_cfg(["dataset=synthetic"])))
    images = dm.train_source.images  # [N, 1, H, W] uint8
    dim, flat = int(dm.pool_indices[0]), int(dm.pool_indices[1])
    images[dim] = images[dim] // 4  # a dark image: pixels up to 63
    images[flat] = 200  # a flat light grey one
    labels = dm.train_source.labels[[dim, flat]]
    figure = issues_figure(dm, torch.tensor([dim, flat]), labels, labels)
    for axes, position in zip(figure.axes[:2], (dim, flat), strict=True):
        shown = shown_grey(axes).astype(int) - images[position, 0].numpy()
        assert np.abs(shown).max() <= 1  # the grey colour map's 256 steps round by one
    # the sample grid too: a subset of dark images stays dark
    subset = dm.pool_indices[::7].sort().values
    images[subset] = images[subset] // 4
    _, grid = subset_figure(dm, subset).axes
    assert shown_grey(grid).max() <= int(images[subset].max()) <= 63


@pytest.mark.parametrize("channels", [2, 4])
def test_images_of_other_channel_counts_show_their_first_channel(make_cfg, channels):
    values = ",".join(["0.5"] * channels)
    overrides = [
        "dataset=synthetic",
        f"dataset.channels={channels}",
        f"model.in_channels={channels}",
    ]
    overrides += [f"dataset.mean=[{values}]", f"dataset.std=[{values}]"]
    dm = build_datamodule(run_of(make_cfg(overrides)))
    (row,) = dm.pool_indices[:1].tolist()
    labels = dm.train_source.labels[[row]]
    (axes, *_) = issues_figure(dm, torch.tensor([row]), labels, labels).axes
    shown = shown_grey(axes).astype(int) - dm.train_source.image(row)[0].numpy()
    assert np.abs(shown).max() <= 1


@pytest.fixture
def odd_names_tree(tmp_path: Path) -> tuple[Path, list[str]]:
    """An ImageFolder tree whose folders are named with "$", "^" and "_", and one at length."""
    from PIL import Image

    names = sorted(["US$_x$", "a$b^$c", "price_$1$", "a folder named at great length, class 1"])
    root = tmp_path / "odd"
    for split, count in (("train", 4), ("val", 1)):
        for c, name in enumerate(names):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.full((20, 24, 3), 40 * c + 10 * i, np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root, names


def test_class_names_are_drawn_as_typed_and_cut_when_long(make_cfg, odd_names_tree, tmp_path):
    root, names = odd_names_tree
    overrides = ["dataset=imagenet", f"dataset.data_dir={root}", "dataset.num_classes=4"]
    overrides += ["dataset.image_size=16", "dataset.resize=16", "dataset.val_size=0"]
    dm = build_datamodule(run_of(make_cfg(overrides)))
    assert dm.class_names == names
    long = "a folder named at great length, class 1"
    shown = [n if n != long else "a folder nam…th, class 1" for n in names]
    assert max(len(n) for n in shown) <= NAME_CHARS
    indices = dm.pool_indices
    write_subset_picture(dm, indices, tmp_path / "subset.png")
    labels = dm.train_source.labels[indices[:4]]
    write_issues_picture(dm, indices[:4], labels, labels.roll(1), tmp_path / "issues.png")
    assert (tmp_path / "subset.png").is_file() and (tmp_path / "issues.png").is_file()
    bars, grid = subset_figure(dm, indices).axes
    assert [t.get_text() for t in bars.get_xticklabels()] == shown
    assert [t.get_text() for t in grid.get_yticklabels()] == shown
    figure = issues_figure(dm, indices[:4], labels, labels.roll(1))
    given = [int(c) for c in labels]
    titles = [ax.get_title() for ax in figure.axes[:4]]
    assert titles == [
        f"given: {shown[c]}\nsuggested: {shown[given[k - 1]]}" for k, c in enumerate(given)
    ]


def test_a_picture_that_cannot_be_drawn_is_left_out_not_the_run(
    make_cfg, tmp_path, monkeypatch, caplog
):
    dm = build_datamodule(run_of(make_cfg(["dataset=synthetic"])))

    def broken(*args: Any) -> Any:
        raise ValueError("no figure today")

    monkeypatch.setattr(pictures, "subset_figure", broken)
    monkeypatch.setattr(pictures, "issues_figure", broken)
    rows = dm.pool_indices[:3]
    for name in ("subset.png", "label_issues.png"):  # an earlier run's in the folder
        (tmp_path / name).write_bytes(b"an earlier run's picture")
    with caplog.at_level(logging.WARNING):
        write_subset_picture(dm, rows, tmp_path / "subset.png")
        labels = dm.train_source.labels[rows]
        write_issues_picture(dm, rows, labels, labels, tmp_path / "label_issues.png")
    assert list(tmp_path.glob("*.png")) == []
    assert "subset.png not drawn: ValueError: no figure today" in caplog.text
    assert "label_issues.png not drawn: ValueError: no figure today" in caplog.text


def test_the_wandb_class_table_holds_plain_shares(make_cfg, tmp_path):
    pytest.importorskip("wandb")
    dm = build_datamodule(run_of(make_cfg(["dataset=synthetic"])))
    logged: dict[str, Any] = {}

    class Run:
        def log(self, payload: dict[str, Any]) -> None:
            logged.update(payload)

    class Logger:
        experiment = Run()

    subset = dm.pool_indices[::7].sort().values
    pictures.log_to_wandb(Logger(), dm, subset, tmp_path)
    pool_counts = torch.bincount(dm.train_source.labels[dm.pool_indices]).tolist()
    counts = torch.bincount(dm.train_source.labels[subset]).tolist()
    rows = logged["subset/classes"].data
    assert [r[1] for r in rows] == [n / sum(pool_counts) for n in pool_counts]  # 0.24, not
    assert [r[2] for r in rows] == [n / len(subset) for n in counts]  # 0.23999999463558197
    assert [r[3] for r in rows] == counts
