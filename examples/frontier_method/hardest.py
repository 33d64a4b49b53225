"""A selector of your own on the frontier (docs/METHODS.md): the rows the ranking model finds
hardest. configs/approach/hardest.yaml makes it a method; from the repository root:

    python train.py -m +experiment=frontier_small +approach=full_schedule,infobatch,hardest \\
        hydra.searchpath=[file://examples/frontier_method/configs]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lipt.selection import Selection, SelectionInputs


def select_hardest(
    inputs: SelectionInputs, budget: int, *, generator: torch.Generator
) -> Selection:
    """The `budget` rows with the highest cross-entropy under the ranking model, weights 1."""
    losses = F.cross_entropy(inputs.pool.logits, inputs.pool.targets, reduction="none")  # [N]
    rows = losses.topk(budget).indices.sort().values  # [budget], ascending
    return Selection(rows, torch.ones(budget))
