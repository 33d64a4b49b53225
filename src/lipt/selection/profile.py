"""Where a subset sits in the pool, in the ranking model's eyes, beside a random subset.

A selector's subset can lose to a random one of the same size for reasons a test accuracy does
not show. Three figures, each within a class and averaged over the subset's classes, make the
common ones visible in `summary.json` (`stages.select.profile`) before any training:

- `difficulty_percentile`: the mean within-class percentile of the model's error 1 - p_y over
  the picked rows (0.5 for a random subset; near 1 picks the hardest, likely mislabelled tail);
- `norm_percentile`: the same for the embedding norm ||h||. A last-layer gradient e h^T grows
  with ||h||, so gradient-matching selectors (GLISTER's gain g_i . G_val) can rank mostly by it;
- `coverage_ratio`: the mean cosine distance from every pool row to the nearest picked row of
  its class, divided by the same for a class-stratified random subset with the same per-class
  counts (1 for random; above 1 leaves parts of the embedding space uncovered, as Zheng et al.,
  "Coverage-centric Coreset Selection", ICLR 2023, https://openreview.net/forum?id=QwKvL6wC8Yi,
  find for score-based subsets at high pruning rates).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lipt.selection.common import randperm, within_group_percentiles
from lipt.selection.types import PoolOutputs

ROW_CHUNK = 4096  # pool rows per [chunk, k] similarity block (4096 x 5,000 fp32: 80 MiB)


def nearest_pick_distance(embeddings: Tensor, targets: Tensor, rows: Tensor) -> float:
    """Mean over pool rows of the cosine distance to the nearest row of `rows` in the same class
    (classes without a pick are skipped)."""
    unit = torch.nn.functional.normalize(embeddings.float(), dim=1)  # [N, D]
    total, count = 0.0, 0
    for c in torch.unique(targets[rows]).tolist():
        members = torch.nonzero(targets == c).flatten()
        picks = unit[rows[targets[rows] == c]]  # [k_c, D]
        for s in range(0, len(members), ROW_CHUNK):
            block = unit[members[s : s + ROW_CHUNK]]  # [b, D]
            total += float((1.0 - (block @ picks.T).max(dim=1).values).sum())  # [b, k_c] -> [b]
            count += len(block)
    return total / max(1, count)


def stratified_random_rows(targets: Tensor, rows: Tensor, generator: torch.Generator) -> Tensor:
    """A random subset with the same per-class counts as `rows`, [len(rows)] int64."""
    out = []
    for c in torch.unique(targets[rows]).tolist():
        members = torch.nonzero(targets == c).flatten()
        k = int((targets[rows] == c).sum())
        out.append(members[randperm(len(members), generator)[:k]])
    return torch.cat(out)


def subset_profile(pool: PoolOutputs, rows: Tensor, generator: torch.Generator) -> dict[str, float]:
    """`difficulty_percentile`, `norm_percentile` and `coverage_ratio` of the pool rows `rows`
    (see the module docstring), plus the two coverage distances the ratio divides."""
    if pool.embeddings.shape[1] == 0:
        raise ValueError("subset_profile needs the pool's embeddings (a model's outputs)")
    if len(rows) == 0 or len(torch.unique(rows)) != len(rows):
        raise ValueError("subset_profile needs a non-empty set of distinct pool rows")
    rows = rows.to(torch.int64).cpu()
    targets = pool.targets.cpu()
    probs = torch.softmax(pool.logits.float(), dim=1)  # [N, C]
    error = 1.0 - probs[torch.arange(len(targets)), targets]  # [N]
    norms = pool.embeddings.float().norm(dim=1)  # [N]
    picked = nearest_pick_distance(pool.embeddings, targets, rows)
    reference = nearest_pick_distance(
        pool.embeddings, targets, stratified_random_rows(targets, rows, generator)
    )
    return {
        "difficulty_percentile": float(within_group_percentiles(error, targets)[rows].mean()),
        "norm_percentile": float(within_group_percentiles(norms, targets)[rows].mean()),
        "coverage_distance": picked,
        "random_coverage_distance": reference,
        "coverage_ratio": picked / reference if reference > 0 else 1.0,
    }
