"""subset.png of a data set with many classes (ImageNet's 1,000): every class the subset holds
is drawn, not the few that thin bars happen to land on a pixel for."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from lipt.report.pictures import subset_figure

CLASSES = 1000
SPACING = 20  # the subset's classes: 10, 30, 50, ... (50 classes, far apart in the plot)


class Source:
    """A training split of 5 items per class, each a flat grey image."""

    labels = torch.arange(CLASSES).repeat_interleave(5)

    def image(self, i: int) -> torch.Tensor:
        return torch.full((3, 8, 8), 128, dtype=torch.uint8)


def drawn_subset_classes(figure) -> int:
    """How many separate places of the class axes show the subset's colour well above the
    pool's share (0.1%): one per subset class when each is drawn."""
    bars = figure.axes[0]
    figure.canvas.draw()
    pixels = np.asarray(figure.canvas.buffer_rgba())[..., :3].astype(int)  # [H, W, 3]
    box = bars.get_window_extent()
    height = pixels.shape[0]
    # Rows of the axes between shares 1% and 1.9% (display y counts from the bottom).
    top = int(height - bars.transData.transform((0, 1.9))[1])
    bottom = int(height - bars.transData.transform((0, 1.0))[1])
    band = pixels[top:bottom, int(box.x0) + 2 : int(box.x1) - 2]
    red, green, blue = band[..., 0], band[..., 1], band[..., 2]
    orange = (red > 180) & (red - blue > 60) & (red - green > 30)  # C1, anti-aliased or not
    columns = orange.any(0)
    return int((columns[1:] & ~columns[:-1]).sum() + columns[0])


def test_subset_png_draws_every_class_of_a_thousand() -> None:
    source = Source()
    dm = SimpleNamespace(
        train_source=source,
        pool_indices=torch.arange(len(source.labels)),
        num_classes=CLASSES,
        class_names=[f"n{c:08d}" for c in range(CLASSES)],
    )
    subset = torch.arange(SPACING // 2, CLASSES, SPACING) * 5  # one item of 50 classes: 2% each
    figure = subset_figure(dm, subset)
    assert drawn_subset_classes(figure) == CLASSES // SPACING
