"""Pictures of a run: `subset.png` (the subset's classes beside the pool's, and sample images
from the subset, each class by its name where the data set has names), `label_issues.png` (the
labels most likely wrong) and, with `logger=wandb`, the merge report, class histogram and
pictures in the wandb run. Images are shown as stored (grey on a fixed 0-255 scale), names as
typed. Reads only; draws no random numbers (samples are evenly spaced, not drawn); a picture
that cannot be drawn is left out with a warning, and the run goes on."""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lipt.core.artifacts import atomic_write_bytes
from lipt.core.console import shown
from lipt.data import DataModule
from lipt.report.render import new_figure

log = logging.getLogger(__name__)

SUBSET_PICTURE = "subset.png"
GRID_CLASSES = 10  # rows of the sample grid (the first classes, for data sets with many)
GRID_COLUMNS = 8
MAX_BARS = 100  # classes shown as bars in subset.png; more as lines (bars under 2 pixels wide)
NAME_CHARS = 24  # a class name longer than this is shown cut: a folder's long name would
# squeeze the axes it labels to nothing
# Class names are shown as typed: a folder named "a$b^$c" is no TeX (matplotlib's mathtext
# would draw "$...$" as a formula, and refuse one it cannot parse).
PLAIN = {"parse_math": False}


def shown_name(name: str) -> str:
    """A class name as a picture labels it: cut to NAME_CHARS characters in the middle, since
    names of one data set often differ only at their start or their end ("..._001")."""
    if len(name) <= NAME_CHARS:
        return name
    tail = (NAME_CHARS - 1) // 2
    return name[: NAME_CHARS - 1 - tail] + "…" + name[-tail:]


def show_image(axes: Any, image: Tensor) -> None:
    """`image` [C, H, W] uint8 as it is: RGB as is, one channel as grey on a fixed 0-255 scale
    (imshow would stretch each grey image to its own range, a dim image shown bright and a flat
    one black); of other channel counts, the first as grey (4 would be read as RGBA)."""
    pixels = image.permute(1, 2, 0).numpy()  # [H, W, C]
    if pixels.shape[2] == 3:
        axes.imshow(pixels)
    else:
        axes.imshow(pixels[..., 0], cmap="gray", vmin=0, vmax=255)


def class_counts(dm: DataModule, indices: Tensor) -> tuple[Tensor, Tensor]:
    """(pool counts [C], subset counts [C]) per class; `indices` in the original split."""
    labels = dm.train_source.labels
    pool = torch.bincount(labels[dm.pool_indices], minlength=dm.num_classes)
    subset = torch.bincount(labels[indices], minlength=dm.num_classes)
    return pool, subset


def sample_grid(dm: DataModule, indices: Tensor) -> tuple[list[int], list[list[Tensor]]]:
    """The first GRID_CLASSES classes present in the subset, and for each up to GRID_COLUMNS
    images [C, H, W] (uint8), evenly spaced over the subset's members of that class."""
    labels = dm.train_source.labels[indices]
    classes = [int(c) for c in torch.unique(labels).tolist()[:GRID_CLASSES]]
    rows = []
    for c in classes:
        members = indices[labels == c]
        take = torch.linspace(0, len(members) - 1, min(GRID_COLUMNS, len(members))).round().long()
        rows.append([dm.train_source.image(int(i)) for i in members[take]])
    return classes, rows


def write_subset_picture(dm: DataModule, indices: Tensor, path: Path) -> None:
    """subset.png: per-class shares of the pool and of the subset, side by side, and a grid of
    sample images from the subset (one row per class), each class by its name."""
    write_picture(path, lambda: subset_figure(dm, indices), dpi=100)


def write_picture(path: Path, figure: Callable[[], Any], dpi: int) -> None:
    """The PNG of `figure()` at `path`, atomically. A picture that cannot be drawn is left out
    with a warning, not the run, and an earlier run's of that name goes: it is not this one's."""
    try:
        png = png_of(figure(), dpi=dpi)
    except Exception as e:
        log.warning(f"{path.name} not drawn: {type(e).__name__}: {e}")
        path.unlink(missing_ok=True)
        return
    atomic_write_bytes(path, png)


def png_of(figure: Any, dpi: int) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def subset_figure(dm: DataModule, indices: Tensor) -> Any:
    """The figure of subset.png (a matplotlib Figure: its axes are the class bars and the grid)."""
    pool, subset = class_counts(dm, indices)
    present, grid = sample_grid(dm, indices)
    names = [shown_name(n) for n in dm.class_names]
    figure = new_figure(12, 5)
    left, right = figure.subplots(1, 2, width_ratios=[1, 1])
    class_shares(left, 100 * pool / pool.sum(), 100 * subset / subset.sum())
    classes = torch.arange(dm.num_classes).numpy()
    if dm.num_classes <= 20:
        left.set_xticks(classes)
        long_names = max(len(n) for n in names) > 3
        left.set_xticklabels(
            names,
            rotation=40 if long_names else 0,
            ha="right" if long_names else "center",
            **PLAIN,
        )
    left.set_xlabel("class")
    left.set_ylabel("share of images (%)")
    left.set_title(f"classes: subset of {len(indices):,} beside the pool of {int(pool.sum()):,}")
    left.legend(loc="upper right")
    tiles = [
        torch.cat(row + [torch.zeros_like(row[0])] * (GRID_COLUMNS - len(row)), 2) for row in grid
    ]
    show_image(right, torch.cat(tiles, 1))  # [C, rows*H, cols*W]
    right.set_title("sample images from the subset (one row per class)")
    right.set_yticks([(r + 0.5) * grid[0][0].shape[1] for r in range(len(grid))])
    right.set_yticklabels([names[c] for c in present], **PLAIN)
    right.set_xticks([])
    return figure


def class_shares(axes: Any, pool: Tensor, subset: Tensor) -> None:
    """Each class's share (%) of the pool and of the subset ([C] each) on `axes`: side by side
    bars, or for more than MAX_BARS classes a step line each, since bars a pixel wide or less
    are drawn for only some classes (of a subset of 50 classes in 1,000, a handful showed)."""
    classes = torch.arange(len(pool)).numpy()
    if len(pool) <= MAX_BARS:
        width = 0.4
        axes.bar(classes - width / 2, pool.numpy(), width, label="pool")
        axes.bar(classes + width / 2, subset.numpy(), width, label="subset")
        return
    # Lines, unlike bars, are drawn however thin: a class alone in the subset stays a spike.
    axes.step(classes, pool.numpy(), where="mid", linewidth=0.8, label="pool")
    axes.step(classes, subset.numpy(), where="mid", linewidth=0.8, alpha=0.8, label="subset")
    axes.set_xlim(-0.5, len(pool) - 0.5)
    axes.set_ylim(bottom=0)


def log_to_wandb(logger: Any, dm: DataModule, indices: Tensor | None, out: Path) -> None:
    """Into the run's wandb run: the merge report as a table, the class histogram (as a wandb
    bar chart), subset.png, and the learners' held-out accuracies as a plot."""
    import wandb

    run = logger.experiment
    payload: dict[str, Any] = {}
    report_path = out / "merge_report.json"
    if report_path.is_file():
        report = json.loads(report_path.read_text())
        columns: list[str | int] = ["learner", "status", "density", "held-out accuracy", "kept"]
        columns.append("seconds")
        kept = set(report.get("kept", []))
        table = wandb.Table(columns=columns)
        for le in report["learners"]:
            table.add_data(
                le["id"],
                le["status"],
                le["density"],
                le["accuracy"],
                le["id"] in kept,
                le["seconds"],
            )
        payload["merge/learners"] = table
        payload["merge/held_out_accuracy"] = wandb.plot.bar(
            table, "learner", "held-out accuracy", title="jigsaw learners: held-out accuracy"
        )
        payload["merge/soup_accuracy"] = report["soup_accuracy"]
    if indices is not None:
        pool, subset = class_counts(dm, indices)
        names: list[str | int] = ["class", "pool share", "subset share", "subset count"]
        classes = wandb.Table(columns=names)
        for c, name in enumerate(dm.class_names):
            # shares of Python ints: 0.24, not float32's 0.23999999463558197
            pool_share, subset_share = int(pool[c]) / int(pool.sum()), int(subset[c]) / len(indices)
            classes.add_data(name, pool_share, subset_share, int(subset[c]))
        payload["subset/classes"] = classes
        payload["subset/class_histogram"] = wandb.plot.bar(
            classes, "class", "subset share", title="subset: share of each class"
        )
    if (out / SUBSET_PICTURE).is_file():
        payload["subset/picture"] = wandb.Image(str(out / SUBSET_PICTURE))
    if payload:
        run.log(payload)  # staged in this run's folder (lipt.run.cli.keep_caches_in)


def log_sweep_report(config: Any, sweep: Path, since: float | None = None) -> Path | None:
    """With `logger=wandb`, at the end of a sweep: write lipt.report.sweep's tables and plots to
    <sweep>/report and log them (results table, accuracy against data used, seconds per stage)
    in a wandb run named "report" in the sweep's group. Returns the report folder (None: no
    wandb logger in this sweep). `since`: only the summaries written since (the multirun's
    own, lipt.report.sweep's --since)."""
    import csv

    node = (config.get("logger") or {}).get("wandb")
    if node is None:
        return None
    import wandb

    from lipt.report.sweep import parse_args, write_report

    out = sweep / "report"
    since_args = [] if since is None else ["--since", repr(since)]
    write_report(parse_args([str(sweep), "--out", str(out), *since_args]))
    with (out / "results.csv").open() as f:
        rows = list(csv.reader(f))
    columns: list[str | int] = list(rows[0])
    data = table_data(rows[1:])  # numbers as numbers
    # staged in the sweep's folder: the sweep's callback points the caches there
    run = wandb.init(
        project=node.get("project", "lipt"),
        group=shown(sweep),  # as lipt.stages.build.sweep_name names the sweep's runs
        name="report",
        dir=str(sweep),
        mode="offline" if node.get("offline", True) else "online",
        reinit=True,
    )
    run.log(
        {
            "report/results": wandb.Table(columns=columns, data=data),
            "report/accuracy_vs_data": wandb.Image(str(out / "accuracy_vs_data.png")),
            "report/stage_times": wandb.Image(str(out / "stage_times.png")),
        }
    )
    run.finish()
    return out


def table_data(rows: list[list[str]]) -> list[list[Any]]:
    """results.csv's rows as the wandb table holds them: a column of numbers as numbers (a
    dashboard sorts and plots them; as text "10" sorts before "9"), an empty cell (unknown) as
    null; a column with any text in it (seeds "0,1", "random") as text, since a wandb table
    refuses a column of two types."""
    columns = [list(column) for column in zip(*rows, strict=True)]
    for column in columns:
        try:
            numbers = [None if text == "" else float(text) for text in column]
        except ValueError:
            continue
        column[:] = [n if n is None or not n.is_integer() else int(n) for n in numbers]
    return [list(row) for row in zip(*columns, strict=True)]


ISSUES_PICTURE = "label_issues.png"
ISSUES_SHOWN = 32  # the most likely wrong labels, 4 rows of 8
ISSUE_ROW = 2.3  # inches a row of label_issues.png takes: an image under its title
ISSUE_TITLE = 0.4  # inches of a row's two-line title (8 pt) and its gap to the row above
ISSUES_TOP = 0.6  # inches above the first row's titles, for the picture's own title


def write_issues_picture(
    dm: DataModule, positions: Tensor, given: Tensor, suggested: Tensor, path: Path
) -> None:
    """label_issues.png: the first ISSUES_SHOWN flagged images, most likely wrong first
    (`positions` in the training split, [F]), each titled with its `given` class and the
    `suggested` one ([F] each)."""
    write_picture(path, lambda: issues_figure(dm, positions, given, suggested), dpi=80)


def issues_figure(dm: DataModule, positions: Tensor, given: Tensor, suggested: Tensor) -> Any:
    """The figure of label_issues.png (a matplotlib Figure: an axes per image shown)."""
    count = min(ISSUES_SHOWN, len(positions))
    names = [shown_name(n) for n in dm.class_names]
    rows = max(1, math.ceil(count / GRID_COLUMNS))
    height = ISSUE_ROW * rows + ISSUES_TOP
    # A regular grid under titles of one size: its margins in inches, set once (constrained
    # layout measured the 32 titles again at each of its passes: 2-3x the drawing's time)
    figure = new_figure(2 * GRID_COLUMNS, height, layout=None)
    image = (height - ISSUES_TOP - ISSUE_TITLE * rows - 0.1) / rows  # each row's image, inches
    figure.subplots_adjust(
        left=0.01,
        right=0.99,
        bottom=0.1 / height,
        top=1 - (ISSUES_TOP + ISSUE_TITLE) / height,
        wspace=0.1,
        hspace=ISSUE_TITLE / image,
    )
    axes = figure.subplots(rows, GRID_COLUMNS, squeeze=False)
    for k, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if k >= count:
            continue
        show_image(ax, dm.train_source.image(int(positions[k])))
        was, now = names[int(given[k])], names[int(suggested[k])]
        ax.set_title(f"given: {was}\nsuggested: {now}", fontsize=8, **PLAIN)
    title = f"the {count} labels most likely wrong, of {len(positions):,} flagged"
    figure.suptitle(title if count else "no label flagged")
    return figure
