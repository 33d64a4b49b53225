"""Score-based selectors: rank the pool by a per-sample score and keep the top `budget`.

- random: uniform without replacement.
- uncertainty: entropy / margin / least confidence of the softmax (Coleman et al., "Selection
  via Proxy", ICLR 2020, https://openreview.net/forum?id=HJg2b0VYDr).
- el2n, grand: error L2 norm and gradient norm (Paul et al., "Deep Learning on a Data Diet",
  NeurIPS 2021, https://proceedings.neurips.cc/paper/2021/hash/ac56f8fe9eea3e4a365f29f0f1957c55-Abstract.html).

Every score is "higher = more uncertain / harder / more important" and is averaged over
`inputs.pool` and every `inputs.extra_pools` (the repeats the data-diet paper averages over
models trained from several seeds). Score selectors are deterministic; ties go to the lower
row. All weights are 1.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

import torch
from torch import Tensor

from lipt.core.bounds import COUNT
from lipt.selection.common import all_pools, check_budget, check_choice, finish, randperm
from lipt.selection.gradients import DEFAULT_CHUNK, errors_of, gradient_sq_norms
from lipt.selection.types import PoolOutputs, Selection, SelectionInputs

Score = Literal["entropy", "margin", "least_confidence", "el2n", "grand"]
SCORES = get_args(Score)


def pool_score(
    pool: PoolOutputs, score: str, *, chunk_size: int = DEFAULT_CHUNK, bias: bool = True
) -> Tensor:
    """Per-row score of one model's outputs, [N] float32, higher = harder / more uncertain.

    entropy: H(softmax); margin: 1 - (p_1st - p_2nd); least_confidence: 1 - p_max;
    el2n: ||softmax - onehot(y)||_2 (= the norm of the bias gradient of the loss);
    grand: the norm of the weight+bias last-layer gradient, ||e|| sqrt(||h||^2 + 1), or of the
    weight's alone, ||e|| ||h||, for a last layer without a bias (`bias=False`).
    """
    check_choice("score", score, SCORES)
    if score in ("entropy", "margin", "least_confidence"):
        log_p = torch.log_softmax(pool.logits.float(), dim=1)  # [N, C]
        p = log_p.exp()
        if score == "entropy":
            return -(p * log_p).sum(1)  # H(p), max log C
        if score == "least_confidence":
            return 1.0 - p.max(1).values  # 1 - p_max
        top2 = p.topk(min(2, p.shape[1]), dim=1).values  # [N, 2]
        margin = top2[:, 0] - top2[:, 1] if p.shape[1] > 1 else top2[:, 0]
        return 1.0 - margin  # small gap between the two best classes = uncertain
    errors = errors_of(pool)  # [N, C] softmax - onehot
    if score == "el2n":
        return errors.norm(dim=1)  # ||p - onehot(y)||_2
    sq_norms = gradient_sq_norms(errors, pool.embeddings, chunk_size=chunk_size, bias=bias)
    return sq_norms.sqrt()  # ||g_i||_2


def mean_score(inputs: SelectionInputs, score: str, *, chunk_size: int = DEFAULT_CHUNK) -> Tensor:
    """`pool_score` averaged over the pool and every extra pool, [N] (GraNd without the bias
    part where the last layer has none: `SelectionInputs.head_has_bias`)."""
    pools = all_pools(inputs)
    bias = inputs.head_has_bias
    total = pool_score(pools[0], score, chunk_size=chunk_size, bias=bias)
    for pool in pools[1:]:
        total = total + pool_score(pool, score, chunk_size=chunk_size, bias=bias)
    return total / len(pools)


def top_rows(scores: Tensor, budget: int) -> Tensor:
    """Rows of the `budget` highest scores; stable, so ties go to the lower row."""
    return torch.sort(scores, descending=True, stable=True).indices[:budget]


def select_random(inputs: SelectionInputs, budget: int, *, generator: torch.Generator) -> Selection:
    """`budget` rows uniformly at random without replacement, weights 1."""
    budget = check_budget(inputs, budget)
    return finish(randperm(len(inputs.pool), generator)[:budget], None, budget)


def select_uncertainty(
    inputs: SelectionInputs,
    budget: int,
    *,
    generator: torch.Generator,
    score: Literal["entropy", "margin", "least_confidence"] = "entropy",
) -> Selection:
    """The `budget` most uncertain rows by `score` in {"entropy", "margin",
    "least_confidence"} (Coleman et al., ICLR 2020, https://openreview.net/forum?id=HJg2b0VYDr)."""
    check_choice("uncertainty score", score, ("entropy", "margin", "least_confidence"))
    budget = check_budget(inputs, budget)
    return finish(top_rows(mean_score(inputs, score), budget), None, budget)


def select_el2n(inputs: SelectionInputs, budget: int, *, generator: torch.Generator) -> Selection:
    """The `budget` rows of highest EL2N = ||softmax - onehot||_2 (Paul et al., NeurIPS 2021,
    https://arxiv.org/abs/2107.07075)."""
    budget = check_budget(inputs, budget)
    return finish(top_rows(mean_score(inputs, "el2n"), budget), None, budget)


def select_grand(
    inputs: SelectionInputs,
    budget: int,
    *,
    generator: torch.Generator,
    bias_only: bool = False,
    chunk_size: Annotated[int, COUNT] = DEFAULT_CHUNK,
) -> Selection:
    """The `budget` rows of highest GraNd: the norm of the per-sample last-layer gradient
    (weight + bias, closed form; the weight's alone for a layer without a bias; bias only with
    `bias_only`), averaged over the pool and every extra pool (Paul et al., NeurIPS 2021,
    https://arxiv.org/abs/2107.07075)."""
    budget = check_budget(inputs, budget)
    # bias-only gradient norm = ||softmax - onehot|| = EL2N
    scores = mean_score(inputs, "el2n" if bias_only else "grand", chunk_size=chunk_size)
    return finish(top_rows(scores, budget), None, budget)
