"""The per-sample loss protocol lipt's training callbacks read: a module's training step hands
its un-reduced losses and the batch's loss weights to `weighted_loss`, which keeps the losses on
`module.last_losses` (what dynamic pruning scores each sample by) and returns the weighted
mean to optimise."""

from __future__ import annotations

from torch import Tensor, nn

NORMS = ("weights", "batch")


def weighted_loss(
    module: nn.Module, losses: Tensor, weights: Tensor, norm: str = "weights"
) -> Tensor:
    """sum(weights x losses) / sum(weights) (`norm="weights"`: a selected subset's weights,
    as CORDS normalises them), or mean(weights x losses) (`norm="batch"`: dynamic pruning's,
    whose weights restore a full epoch's loss sum). `losses` [B]: the batch's per-sample
    losses, un-reduced (e.g. `F.cross_entropy(logits, y, reduction="none")`); `weights` [B]:
    the batch's `w` (lipt's training batches are (x, y, idx, w)). Sets `module.last_losses`
    to the detached losses.

    Raises:
        ValueError: losses that are not one per sample, or an unknown norm.
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {list(NORMS)}, not {norm!r}")
    if losses.ndim != 1 or losses.shape != weights.shape:
        raise ValueError(
            f"losses {tuple(losses.shape)} must be per sample, one per weight "
            f"{tuple(weights.shape)}: compute them with reduction='none'"
        )
    if norm == "batch":
        loss = (weights * losses).mean()
    else:
        loss = (weights * losses).sum() / weights.sum()
    module.last_losses = losses.detach()
    return loss
