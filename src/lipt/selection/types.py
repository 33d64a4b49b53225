"""Data passed between the selection stage and the pure selectors.

Selectors never see models, loaders or configs: they get what one or more models said about the
training pool (logits and penultimate embeddings, in eval mode, on un-augmented inputs) and
return positions into that pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor


@dataclass(frozen=True)
class PoolOutputs:
    """What one model says about N samples, rows in ascending order of `indices`."""

    logits: Tensor  # [N, C] float32
    embeddings: Tensor  # [N, D] float32, the input of the final linear layer
    targets: Tensor  # [N] int64
    indices: Tensor  # [N] int64, dataset positions of the rows (ascending)

    def __post_init__(self) -> None:
        n = self.logits.shape[0]
        if not (self.embeddings.shape[0] == self.targets.shape[0] == self.indices.shape[0] == n):
            raise ValueError(
                f"PoolOutputs rows disagree: logits {tuple(self.logits.shape)}, embeddings "
                f"{tuple(self.embeddings.shape)}, targets {tuple(self.targets.shape)}, "
                f"indices {tuple(self.indices.shape)}"
            )

    @classmethod
    def labels_only(cls, targets: Tensor, indices: Tensor, num_classes: int) -> PoolOutputs:
        """The pool as a selector that needs no model (random) sees it: labels and positions.
        Its logits, which such a selector never reads, are a view of one zero, not [N, C] of
        them (5 GB at ImageNet's 1.28M rows and 1,000 classes)."""
        n = len(targets)
        return cls(torch.zeros(()).expand(n, num_classes), torch.zeros(n, 0), targets, indices)

    @property
    def num_classes(self) -> int:
        return int(self.logits.shape[1])

    def __len__(self) -> int:
        return int(self.logits.shape[0])

    def take(self, rows: Tensor) -> PoolOutputs:
        """The outputs restricted to `rows` (positions into this object)."""
        return PoolOutputs(
            self.logits[rows], self.embeddings[rows], self.targets[rows], self.indices[rows]
        )


@dataclass(frozen=True)
class LearnerHeads:
    """The final linear layers of the jigsaw learners (lipt.jigsaw), stacked: applied to the
    soup's embeddings they give each learner's view of the pool without another forward pass."""

    weight: Tensor  # [L, C, D] float32
    bias: Tensor  # [L, C] float32

    def __post_init__(self) -> None:
        if self.weight.ndim != 3 or self.bias.shape != self.weight.shape[:2]:
            raise ValueError(
                f"learner heads need weight [L, C, D] and bias [L, C], got "
                f"{tuple(self.weight.shape)} and {tuple(self.bias.shape)}"
            )

    def __len__(self) -> int:
        return int(self.weight.shape[0])


@dataclass(frozen=True)
class SelectionInputs:
    """Everything a selector may use. `pool` is scored; `val` is the held-out split."""

    pool: PoolOutputs
    val: PoolOutputs | None = None
    # The same pool scored by further models (GraNd's `repeats`), same row order as `pool`.
    extra_pools: tuple[PoolOutputs, ...] = field(default_factory=tuple)
    # Weight matrix [C, D] and bias [C] of the final linear layer that produced `pool.logits`
    # (GLISTER's Taylor update moves them). None where the selector does not need them.
    classifier_weight: Tensor | None = None
    classifier_bias: Tensor | None = None
    # The jigsaw learners' heads, for selectors that use the learners' ensemble (coverage);
    # they fit `pool.embeddings` when `pool` comes from the soup. None without jigsaw learners.
    learner_heads: LearnerHeads | None = None
    # True once every logit and embedding above was found finite (rank_pool checks each model's
    # outputs as it scores them): the selectors then skip their own check, one scan per selection.
    outputs_checked: bool = False

    @property
    def head_has_bias(self) -> bool:
        """False for a final layer without a bias (`classifier_weight` given, `classifier_bias`
        None): its per-sample gradient has no bias part. True where nothing is said."""
        return self.classifier_weight is None or self.classifier_bias is not None


@dataclass(frozen=True)
class Selection:
    """Chosen rows of the pool (positions 0..N-1, unique) and their loss weights.

    `diagnostics` counts what the selector did instead of what was asked (summed over classes
    by `select_balanced`): `pool_as_target` (held-out target missing, the pool stood in),
    `backfill_rows` (GradMatch rows filled at random after OMP stopped early).

    `weight_scale` is the one factor the selector multiplied its own weights by so that they
    sum to its pool size: GradMatch's weights are OMP's, which match the target gradient, times
    N / their sum. It is 1 for weights that are counts or ones (CRAIG's cluster sizes, the
    score selectors'). `select_balanced` divides it out of each class before it joins them, so
    the classes keep the weights relative to one another that matched their gradients."""

    rows: Tensor  # [k] int64
    weights: Tensor  # [k] float32, > 0
    diagnostics: dict[str, int] = field(default_factory=dict)
    weight_scale: float = 1.0

    def with_diagnostics(self, **counts: int) -> Selection:
        """The same selection with `counts` added to its diagnostics."""
        return replace(self, diagnostics={**self.diagnostics, **counts})

    def __post_init__(self) -> None:
        assert self.rows.dtype == torch.int64, self.rows.dtype
        assert self.weights.dtype == torch.float32, self.weights.dtype
        assert self.rows.shape == self.weights.shape, (self.rows.shape, self.weights.shape)
