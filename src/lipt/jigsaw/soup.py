"""Model soups: merging the jigsaw learners into one dense model.

Model soups (Wortsman et al., ICML 2022, https://arxiv.org/abs/2203.05482) average the weights
of models trained from one common initialisation. LiPT (Ro et al., ICML 2023,
https://proceedings.mlr.press/v202/ro23a.html, section 3.2 and appendix C) merges its jigsaw
learners with a *greedy interpolation* soup: the learners are visited from best to worst
held-out accuracy, and each is blended into the soup at the interpolation ratio alpha (searched
on a grid over [0, 1]) that scores best, or left out if no ratio keeps the held-out score from
falling.

Everything here works on state dicts (``dict[str, Tensor]``) and an ``evaluate`` callable that
maps a state dict to a held-out score (higher is better, e.g. accuracy on a validation split
carved from the training set, never the test set). Floating tensors are averaged; integer and
bool tensors (BatchNorm's ``num_batches_tracked``) are never averaged and never turned into
floats: a soup takes them from its *first* argument (the first state dict of an average, the
soup side of an interpolation, hence the best ingredient of a greedy soup).

Averaged weights come with averaged, hence stale, BatchNorm statistics;
`lipt.jigsaw.weights.recompute_batchnorm_stats` re-estimates them on a few batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from lipt.jigsaw import SEARCHES
from lipt.jigsaw.weights import (
    StateDict,
    average_state_dicts,
    check_compatible,
    interpolate,
)

__all__ = [
    "RUNNING_MEAN",
    "SEARCHES",
    "Evaluate",
    "SoupResult",
    "StateDict",
    "alpha_grid",
    "ascending_scan",
    "greedy_interp_soup",
    "greedy_soup",
    "uniform_soup",
]

Evaluate = Callable[[StateDict], float]

# Ratio "grid" of greedy_interp_soup that reproduces greedy_soup: alpha = 1/(k+1) with k
# ingredients already in, i.e. the running mean of the kept ingredients.
RUNNING_MEAN: Final = "running_mean"


# --------------------------------------------------------------------------- soups


def _json_float(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


@dataclass
class SoupResult:
    """A merged model and how it was made.

    ``kept`` lists ingredient indices (positions in the list given to the soup) in the order
    they were added; ``ratios[j]`` is the alpha with which ``kept[j]`` was blended into the soup
    (``soup = (1 - alpha) * soup + alpha * ingredient``; 1.0 for the first). ``weights`` gives
    the resulting share of each kept ingredient in the soup.
    """

    state_dict: StateDict
    kept: list[int]
    ratios: list[float]
    ingredient_scores: list[float]
    soup_score: float
    method: str = ""
    # Every soup tried after the first ingredient: candidate, alpha, score, accepted.
    trials: list[dict[str, Any]] = field(default_factory=list)

    @property
    def weights(self) -> list[float]:
        """Share of each kept ingredient in the soup (sums to 1), same order as ``kept``."""
        shares = [0.0] * len(self.ratios)
        remaining = 1.0
        for j in reversed(range(len(self.ratios))):
            shares[j] = remaining * self.ratios[j]
            remaining *= 1.0 - self.ratios[j]
        return shares

    def to_report(self) -> dict[str, Any]:
        """A strict-JSON summary: no tensors, and non-finite scores (a NaN trial) as null."""
        best = max(range(len(self.ingredient_scores)), key=self.ingredient_scores.__getitem__)
        return {
            "method": self.method,
            "ingredient_scores": [_json_float(s) for s in self.ingredient_scores],
            "best_ingredient": int(best),
            "best_ingredient_score": _json_float(self.ingredient_scores[best]),
            "kept": [int(i) for i in self.kept],
            "ratios": [float(r) for r in self.ratios],
            "weights": [float(w) for w in self.weights],
            "soup_score": _json_float(self.soup_score),
            "trials": [
                {
                    "candidate": int(t["candidate"]),
                    "alpha": float(t["alpha"]),
                    "score": _json_float(t["score"]),
                    "accepted": bool(t["accepted"]),
                }
                for t in self.trials
            ],
        }


def _score(evaluate: Evaluate, state_dict: StateDict) -> float:
    # A NaN score must never win a comparison; -inf makes "NaN soup" lose every one.
    score = float(evaluate(state_dict))
    return -math.inf if math.isnan(score) else score


def _score_ingredients(state_dicts: Sequence[StateDict], evaluate: Evaluate) -> list[float]:
    """Each ingredient's held-out score, evaluated exactly once."""
    check_compatible(state_dicts)
    scores = []
    for i, sd in enumerate(state_dicts):
        score = float(evaluate(sd))
        if math.isnan(score):
            raise ValueError(
                f"evaluate returned NaN for ingredient {i}; leave diverged learners out first "
                f"(is_finite_state_dict)"
            )
        scores.append(score)
    return scores


def _by_score(scores: Sequence[float]) -> list[int]:
    """Indices from best to worst score; ties keep the input order (sorted is stable)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def _clone(state_dict: StateDict) -> StateDict:
    return {k: v.detach().clone() for k, v in state_dict.items()}


def uniform_soup(state_dicts: Sequence[StateDict], evaluate: Evaluate) -> SoupResult:
    """The uniform soup: the plain average of all ingredients.

    ``evaluate`` runs once per ingredient (for the report) and once on the soup. Integer
    buffers come from ingredient 0.
    """
    scores = _score_ingredients(state_dicts, evaluate)
    soup = average_state_dicts(state_dicts)
    n = len(state_dicts)
    return SoupResult(
        state_dict=soup,
        kept=list(range(n)),
        ratios=[1.0 / (k + 1) for k in range(n)],  # the running mean of n ingredients
        ingredient_scores=scores,
        soup_score=_score(evaluate, soup),
        method="uniform",
    )


# How a greedy soup tries one later candidate: try_candidate(candidate, kept, soup, soup_score,
# trials) scores the soups it could make with the candidate in, appends each to `trials` (not
# accepted) and returns the best one: its index in `trials` and its state dict.
TryCandidate = Callable[
    [int, list[int], StateDict, float, list[dict[str, Any]]], tuple[int, StateDict]
]


def _greedy(
    state_dicts: Sequence[StateDict], evaluate: Evaluate, try_candidate: TryCandidate, method: str
) -> SoupResult:
    """The greedy loop both greedy soups share: start from the best ingredient, visit the others
    from best to worst, and keep a candidate when its best trial scores >= the current soup."""
    scores = _score_ingredients(state_dicts, evaluate)
    order = _by_score(scores)
    kept = [order[0]]
    ratios = [1.0]
    soup = _clone(state_dicts[order[0]])
    soup_score = scores[order[0]]
    trials: list[dict[str, Any]] = []
    for i in order[1:]:
        best, best_soup = try_candidate(i, kept, soup, soup_score, trials)
        if trials[best]["score"] >= soup_score:
            trials[best]["accepted"] = True
            kept.append(i)
            ratios.append(trials[best]["alpha"])
            soup, soup_score = best_soup, trials[best]["score"]
    return SoupResult(soup, kept, ratios, scores, soup_score, method=method, trials=trials)


def greedy_soup(state_dicts: Sequence[StateDict], evaluate: Evaluate) -> SoupResult:
    """The greedy soup of Wortsman et al. (2022, Algorithm 1 / recipe "greedy soup").

    Ingredients are sorted by their own held-out score (best first, ties in input order). The
    soup starts as the best one; each next ingredient is added if the *uniform average* of the
    kept ingredients plus it scores >= the current soup, else skipped. The soup therefore never
    scores below the best ingredient. ``evaluate`` runs once per ingredient and once per later
    candidate (2n - 1 calls).
    """

    def average_in(
        i: int, kept: list[int], soup: StateDict, soup_score: float, trials: list[dict[str, Any]]
    ) -> tuple[int, StateDict]:
        trial = average_state_dicts([state_dicts[j] for j in [*kept, i]])
        score = _score(evaluate, trial)
        alpha = 1.0 / (len(kept) + 1)  # the running mean's share of the newcomer
        trials.append({"candidate": i, "alpha": alpha, "score": score, "accepted": False})
        return len(trials) - 1, trial

    return _greedy(state_dicts, evaluate, average_in, method="greedy")


def alpha_grid(num_steps: int = 20) -> list[float]:
    """``[1/num_steps, 2/num_steps, ..., 1]``: the grid 0, 0.05, ..., 1 for 20 steps, minus 0.

    (alpha = 0 leaves the soup unchanged, which is what dropping the candidate does.)
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    return [k / num_steps for k in range(1, num_steps + 1)]


def _check_ratios(ratios: Sequence[float] | str) -> list[float]:
    """The positive ratios of a grid, deduplicated, in the given order."""
    if isinstance(ratios, str):
        raise ValueError(f"unknown ratio schedule {ratios!r}; give {RUNNING_MEAN!r} or a list")
    grid: list[float] = []
    for r in ratios:
        r = float(r)
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"interpolation ratios must lie in [0, 1], got {r}")
        # alpha = 0 is "no change", i.e. the skip the greedy rule already falls back on.
        if r > 0.0 and r not in grid:
            grid.append(r)
    if not grid:
        raise ValueError(f"the ratio grid {list(ratios)} has no alpha > 0")
    return grid


def ascending_scan(
    score: Callable[[float], float], alphas: Sequence[float], start: float
) -> list[tuple[float, float]]:
    """The (alpha, score) pairs of `alphas` scored from the smallest up, stopping after the first
    whose score falls below the best so far; `start` is the score at alpha = 0 (the soup as it
    is), so a candidate whose smallest blend already loses costs one evaluation.

    When the scores of 0 < alphas[0] < alphas[1] < ... (with `start` at 0) rise, stay level,
    then only fall (unimodal), the best of the returned pairs is the best of the whole grid, ties
    included (a level score is no drop, so every tied alpha is scored): the grid's choice at
    peak + 2 evaluations at most, one when the smallest alpha already scores below `start`.
    NaN counts as -inf (a drop).

    Raises:
        ValueError: `alphas` empty or outside (0, 1].
    """
    grid = sorted(set(float(a) for a in alphas))
    if not grid or grid[0] <= 0.0 or grid[-1] > 1.0:
        raise ValueError(f"alphas must be a non-empty set in (0, 1], got {list(alphas)}")
    best = start
    scored: list[tuple[float, float]] = []
    for alpha in grid:
        value = float(score(alpha))
        value = -math.inf if math.isnan(value) else value
        scored.append((alpha, value))
        if value < best:
            break
        best = value
    return scored


def greedy_interp_soup(
    state_dicts: Sequence[StateDict],
    evaluate: Evaluate,
    ratios: Sequence[float] | Literal["running_mean"],
    search: str = "grid",
) -> SoupResult:
    """LiPT's greedy interpolation soup (Ro et al. 2023, section 3.2).

    Ingredients are visited as in `greedy_soup` (best held-out score first). For each later
    candidate every alpha of ``ratios`` is tried, ``interpolate(soup, candidate, alpha)``; the
    best-scoring alpha is kept if its score is >= the current soup's, else the candidate is
    dropped. The soup therefore never scores below the best ingredient. alpha = 0 is ignored
    (it is the "drop" outcome). Ties between alphas go to the one nearest ``1/(k+1)`` (k =
    ingredients already in: the share model soups would give it), then to grid order.

    ``ratios="running_mean"`` tries only ``1/(k+1)``, which makes the soup the running mean of
    the kept ingredients: the same kept set and (up to float rounding) the same weights as
    `greedy_soup`.

    ``evaluate`` runs once per ingredient and once per alpha > 0 (once for ``running_mean``)
    per later candidate. ``search="scan"`` scores a candidate's alphas from the smallest up and
    stops at the first drop below the best so far, the soup's own score standing at alpha = 0
    (`ascending_scan`): the same soup as ``"grid"`` whenever each candidate's held-out score is
    unimodal in alpha, at one evaluation for a candidate whose smallest blend already loses (most
    of them, once the soup holds a few learners).

    Raises:
        ValueError: bad ratios (outside [0, 1], none > 0, unknown string), unknown search, or
            state dicts.
    """
    if search not in SEARCHES:
        raise ValueError(f"unknown search {search!r}; choose from {SEARCHES}")
    running_mean = isinstance(ratios, str) and ratios == RUNNING_MEAN
    grid = [] if running_mean else _check_ratios(ratios)

    def best_blend(
        i: int, kept: list[int], soup: StateDict, soup_score: float, trials: list[dict[str, Any]]
    ) -> tuple[int, StateDict]:
        share = 1.0 / (len(kept) + 1)
        # (sort key, index into trials, soup) of the best alpha so far
        best: tuple[tuple[float, float], int, StateDict] | None = None

        def blend(alpha: float) -> float:
            nonlocal best
            trial = interpolate(soup, state_dicts[i], alpha)
            score = _score(evaluate, trial)
            trials.append({"candidate": i, "alpha": alpha, "score": score, "accepted": False})
            key = (score, -abs(alpha - share))
            if best is None or key > best[0]:
                best = (key, len(trials) - 1, trial)
            return score

        if running_mean:
            blend(share)
        elif search == "scan":
            ascending_scan(blend, grid, soup_score)
        else:
            for alpha in grid:
                blend(alpha)
        assert best is not None
        _, best_trial, best_soup = best
        return best_trial, best_soup

    return _greedy(state_dicts, evaluate, best_blend, method="greedy_interp")
