"""The parts of a jigsaw pre-training a user chooses by config group, as small typed settings:
`prune=` (how a learner is pruned), `augment=` (its strong augmentation), `merge=` (how the
learners become one soup, scored on held-out data). Each group's yaml names one of these classes
with `_target_`; lipt.stages.build.build_part instantiates it, and the stage passes it down.

Paper: Ro et al., ICML 2023, https://proceedings.mlr.press/v202/ro23a.html, sections 3.2-3.3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from torch import Generator, Tensor, nn

from lipt.core.bounds import COUNT, NON_NEGATIVE, SHARE, UNIT, Interval
from lipt.core.errors import UserError
from lipt.core.settings import Checked, LearnerOptim
from lipt.jigsaw.pruning import prune_magnitude, prune_random, prune_snip
from lipt.jigsaw.soup import (
    RUNNING_MEAN,
    Evaluate,
    SoupResult,
    StateDict,
    alpha_grid,
    greedy_interp_soup,
    greedy_soup,
    uniform_soup,
)

# --------------------------------------------------------------------------- prune=

# A learner's first minibatch (inputs, targets), for the methods that score weights on one
# (`needs_batch`); None for the others.
Batch = tuple[Tensor, Tensor] | None


@dataclass(frozen=True)
class Pruning(Checked):
    """Prune a trained learner once, at its own density drawn from U[density_low, density_high]
    (paper, section 3.3). `prunes`: False for `prune=none` (dense learners, density 1);
    `needs_batch`: the method scores weights on the learner's first minibatch (SNIP)."""

    PREFIX: ClassVar[str] = "prune"

    name: str = "none"
    density_low: Annotated[float, SHARE] = 1.0  # kept share of the weights
    density_high: Annotated[float, SHARE] = 1.0
    prunes: ClassVar[bool] = True
    needs_batch: ClassVar[bool] = False

    def __post_init__(self) -> None:
        """The fields, then the bounds together: a learner draws its density from them only
        once it has trained, so crossed bounds would fail every learner after its training."""
        super().__post_init__()
        if self.density_low > self.density_high:
            raise UserError(
                f"prune.density_low={self.density_low!r}, prune.density_high="
                f"{self.density_high!r} are invalid: densities are kept fractions with "
                "0 < density_low <= density_high <= 1 (paper: 0.85, 0.95)"
            )

    def apply(self, model: nn.Module, density: float, generator: Generator, batch: Batch) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class NoPruning(Pruning):
    prunes: ClassVar[bool] = False

    def apply(self, model: nn.Module, density: float, generator: Generator, batch: Batch) -> None:
        """Dense learners: nothing to do."""


@dataclass(frozen=True)
class MagnitudePruning(Pruning):
    """One-shot global magnitude pruning (OMP), LiPT's choice."""

    def apply(self, model: nn.Module, density: float, generator: Generator, batch: Batch) -> None:
        prune_magnitude(model, density)


@dataclass(frozen=True)
class RandomPruning(Pruning):
    """Global random pruning from the learner's own generator (paper, appendix D)."""

    def apply(self, model: nn.Module, density: float, generator: Generator, batch: Batch) -> None:
        prune_random(model, density, generator=generator)


@dataclass(frozen=True)
class SnipPruning(Pruning):
    """SNIP on the learner's first minibatch, un-augmented (paper, appendix D)."""

    needs_batch: ClassVar[bool] = True

    def apply(self, model: nn.Module, density: float, generator: Generator, batch: Batch) -> None:
        if batch is None:
            raise ValueError("snip pruning needs batch=(inputs, targets) to compute saliencies")
        prune_snip(model, density, batch[0], batch[1])


# --------------------------------------------------------------------------- augment=


@dataclass(frozen=True)
class NoAugment(Checked):
    """Only the mild random crop + flip."""

    PREFIX: ClassVar[str] = "augment"

    name: str = "none"

    def randaugment(self) -> dict[str, Any] | None:
        return None


@dataclass(frozen=True)
class RandAugment(Checked):
    """RandAugment (Cubuk et al. 2020) on top of crop + flip, for the learners only."""

    PREFIX: ClassVar[str] = "augment"

    name: str = "randaugment"
    num_ops: Annotated[int, Interval(ge=0, le=14)] = 1  # RandAugment has 14 ops
    magnitude: Annotated[int, NON_NEGATIVE] = 9  # below num_magnitude_bins
    num_magnitude_bins: Annotated[int, Interval(ge=2, le=10**4)] = 31

    def __post_init__(self) -> None:
        """The fields, then the magnitude against its bins (torchvision refuses it in each
        learner's first batch)."""
        super().__post_init__()
        if self.magnitude >= self.num_magnitude_bins:
            raise UserError(
                f"augment.magnitude={self.magnitude} is invalid: use "
                f"0..{self.num_magnitude_bins - 1} (below augment.num_magnitude_bins)"
            )

    def randaugment(self) -> dict[str, Any] | None:
        """torchvision.transforms.RandAugment's keyword arguments."""
        return {
            "num_ops": self.num_ops,
            "magnitude": self.magnitude,
            "num_magnitude_bins": self.num_magnitude_bins,
        }


# --------------------------------------------------------------------------- merge=


@dataclass(frozen=True)
class Merge(Checked):
    """A soup recipe and its held-out scoring: top-1 accuracy on `eval_size` images of the
    validation split (None: all of it), after re-estimating BatchNorm statistics on
    `bn_batches` minibatches of the learners' shards when `recompute_bn`."""

    PREFIX: ClassVar[str] = "merge"

    name: str = ""
    eval_size: Annotated[int, Interval(ge=1, le=10**9)] | None = 1000  # null: the whole split
    recompute_bn: bool = True
    bn_batches: Annotated[int, Interval(ge=1, le=10**6)] = 2

    def soup(self, states: Sequence[StateDict], evaluate: Evaluate) -> SoupResult:
        raise NotImplementedError

    def evaluations(self, n: int) -> int:
        """Held-out evaluations a soup of `n` ingredients makes (for the progress bar)."""
        raise NotImplementedError


@dataclass(frozen=True)
class UniformMerge(Merge):
    """The plain average of every usable learner."""

    def soup(self, states: Sequence[StateDict], evaluate: Evaluate) -> SoupResult:
        return uniform_soup(states, evaluate)

    def evaluations(self, n: int) -> int:
        return n + 1


@dataclass(frozen=True)
class GreedyMerge(Merge):
    """The greedy soup of model soups (Wortsman et al. 2022)."""

    def soup(self, states: Sequence[StateDict], evaluate: Evaluate) -> SoupResult:
        return greedy_soup(states, evaluate)

    def evaluations(self, n: int) -> int:
        return n + max(n - 1, 0)


@dataclass(frozen=True)
class GreedyInterpMerge(Merge):
    """LiPT's greedy interpolation soup (paper, section 3.2). `ratios`: an int S gives
    alpha_grid(S), a list the ratios, "running_mean" tries only 1/(k+1). `search`: "grid"
    scores every ratio, "scan" scores them from the smallest up and stops at the first drop
    (soup.ascending_scan). The defaults are configs/merge/greedy_interp.yaml's."""

    ratios: Annotated[int, COUNT] | list[Annotated[float, UNIT]] | Literal["running_mean"] = 5
    search: Literal["grid", "scan"] = "scan"

    def __post_init__(self) -> None:
        """The fields, then a list of ratios as a whole: one without a ratio above 0 has no
        blend to try, which the soup would find only after every learner has trained."""
        super().__post_init__()
        value = self.ratios
        if isinstance(value, list) and max(value, default=0.0) <= 0:
            raise UserError(
                f"merge.ratios={value!r} is invalid: a list of ratios needs one above 0 "
                "(or a number of grid steps, or running_mean)"
            )

    def grid(self) -> Sequence[float] | str:
        value = self.ratios
        invalid = f"merge.ratios={value!r} is invalid: use an int, a list or running_mean"
        if isinstance(value, str):
            if value != RUNNING_MEAN:
                raise UserError(invalid)
            return RUNNING_MEAN
        if isinstance(value, bool) or not isinstance(value, int | list):
            raise UserError(invalid)
        if isinstance(value, int):
            return alpha_grid(value)
        return [float(r) for r in value]

    def soup(self, states: Sequence[StateDict], evaluate: Evaluate) -> SoupResult:
        return greedy_interp_soup(states, evaluate, self.grid(), self.search)  # type: ignore[arg-type]

    def evaluations(self, n: int) -> int:
        """(An upper bound under search=scan, which stops early.)"""
        grid = self.grid()
        return n + max(n - 1, 0) * (1 if isinstance(grid, str) else len(grid))


# --------------------------------------------------------------------------- pretrain=jigsaw


@dataclass(frozen=True)
class JigsawSettings(Checked):
    """The knobs of `pretrain=jigsaw` (configs/pretrain/jigsaw.yaml says what each does): n
    learners, each on M minibatches for K passes with the `optim` SGD settings."""

    PREFIX: ClassVar[str] = "pretrain"

    name: str = "jigsaw"
    num_learners: Annotated[int, Interval(ge=1, le=10**7)] = 10  # n
    batches_per_learner: Annotated[int, Interval(ge=1, le=10**7)] = 1  # M
    local_epochs: Annotated[int, Interval(ge=1, le=10**7)] = 10  # K
    optim: LearnerOptim | None = None  # main training's optimizer at these settings
    min_learners: Annotated[int, COUNT] | None = None  # null: half of n, rounded up
    # the ids a multirun job trains (None: all, here)
    learners: Annotated[int, NON_NEGATIVE] | list[Annotated[int, NON_NEGATIVE]] | None = None
    learner_dir: str | None = None
    merge_from: str | None = None
    num_threads: Annotated[int, Interval(ge=1, le=4096)] | None = None

    def learner_ids(self) -> list[int] | None:
        """`learners` as a list of ids (None: all learners, in-process).

        Raises:
            UserError: ids out of 0..n-1, repeated, or none.
        """
        if self.learners is None:
            return None
        value = self.learners
        ids = [int(value)] if isinstance(value, int) else [int(v) for v in value]
        n = self.num_learners
        if not ids or any(not 0 <= i < n for i in ids) or len(set(ids)) != len(ids):
            raise UserError(
                f"pretrain.learners={ids} is invalid: give distinct ids in 0..{n - 1} "
                "(or null for all learners)"
            )
        return ids

    def least_learners(self) -> int:
        """`min_learners`, by default half of the learners (rounded up)."""
        if self.min_learners is not None:
            return int(self.min_learners)
        return -(-int(self.num_learners) // 2)

    def learner_optim(self) -> dict[str, Any]:
        return dict(self.optim or {})
