"""Model soups of jigsaw learners (lipt.jigsaw.soup, lipt.jigsaw.weights)."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lipt.core.seeding import torch_threads
from lipt.jigsaw.pruning import draw_density, prune_magnitude
from lipt.jigsaw.shards import make_shards
from lipt.jigsaw.soup import (
    RUNNING_MEAN,
    SoupResult,
    alpha_grid,
    ascending_scan,
    greedy_interp_soup,
    greedy_soup,
    uniform_soup,
)
from lipt.jigsaw.weights import (
    StateDict,
    average_state_dicts,
    interpolate,
    is_finite_state_dict,
    recompute_batchnorm_stats,
)

# --------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny tensors gain nothing from intra-op threads, which oversubscribe a busy small CPU."""
    with torch_threads(1):
        yield


class Counting:
    """Wraps an evaluate callable and records every state dict it was given."""

    def __init__(self, fn: Callable[[StateDict], float]) -> None:
        self.fn = fn
        self.calls: list[StateDict] = []

    def __call__(self, sd: StateDict) -> float:
        self.calls.append({k: v.clone() for k, v in sd.items()})
        return self.fn(sd)


def _one_hot(n: int) -> list[StateDict]:
    """Ingredient i has w = e_i, so a soup's w *is* its vector of ingredient weights."""
    return [{"w": torch.eye(n, dtype=torch.float64)[i]} for i in range(n)]


def _neg_distance(target: Tensor) -> Callable[[StateDict], float]:
    return lambda sd: -float(((sd["w"] - target) ** 2).sum())


def _assert_sd_close(
    a: StateDict, b: StateDict, rtol: float | None = None, atol: float | None = None
) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol)


# A real tiny task: three Gaussian blobs in 8-D, an MLP with BatchNorm, learners trained from
# one init on disjoint shards and pruned with OMP, as in the jigsaw pre-training.


def _blobs(n: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(3, 8, generator=torch.Generator().manual_seed(99)) * 1.2
    y = torch.randint(0, 3, (n,), generator=g)
    return centers[y] + torch.randn(n, 8, generator=g), y


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3))


TRAIN = _blobs(640, seed=1)
VAL = _blobs(300, seed=2)


def _accuracy(sd: StateDict) -> float:
    model = _mlp()
    model.load_state_dict(sd, strict=True)
    model.eval()
    with torch.no_grad():
        return float((model(VAL[0]).argmax(1) == VAL[1]).float().mean())


def _learners(n: int = 5, m: int = 2, b: int = 32, k: int = 3, lr: float = 0.2) -> list[StateDict]:
    torch.manual_seed(0)
    init = _mlp().state_dict()
    gen = torch.Generator().manual_seed(0)
    shards = make_shards(len(TRAIN[1]), n, m, b, generator=gen)
    out = []
    for shard in shards:
        model = _mlp()
        model.load_state_dict(init)
        model.train()
        for _ in range(k):
            for batch in shard.split(b):
                x, y = TRAIN[0][batch], TRAIN[1][batch]
                loss = F.cross_entropy(model(x), y)
                grads = torch.autograd.grad(loss, list(model.parameters()))
                with torch.no_grad():  # plain SGD, no optimizer state to carry
                    for p, g in zip(model.parameters(), grads, strict=True):
                        p.sub_(lr * g)
        prune_magnitude(model, draw_density(0.85, 0.95, generator=gen))
        out.append({k: v.clone() for k, v in model.state_dict().items()})
    return out


@pytest.fixture(scope="module")
def learners() -> list[StateDict]:
    return _learners()


@pytest.fixture(scope="module")
def learners_and_saboteur(learners: list[StateDict]) -> list[StateDict]:
    """The learners plus a copy of learner 0 whose classifier is flipped and amplified.

    Averaged into a soup of fewer than ten members it turns the soup's logits around, so
    adding it always hurts held-out accuracy.
    """
    bad = {k: v.clone() for k, v in learners[0].items()}
    bad["3.weight"] *= -10.0
    bad["3.bias"] *= -10.0
    return [*learners, bad]


# --------------------------------------------------------------------------- arithmetic


def test_uniform_average_is_exact_and_keeps_integer_buffers() -> None:
    sds = [
        {
            "w": torch.tensor([[1.0, 2.0], [3.0, -4.0]]) * (i + 1),  # dyadic: exact in float32
            "h": torch.tensor([0.5, 1.5], dtype=torch.float16) * (i + 1),
            "num_batches_tracked": torch.tensor(10 * (i + 1)),
            "flag": torch.tensor([True, False]) if i == 0 else torch.tensor([False, True]),
        }
        for i in range(4)
    ]
    originals = copy.deepcopy(sds)
    avg = average_state_dicts(sds)
    assert torch.equal(avg["w"], torch.tensor([[1.0, 2.0], [3.0, -4.0]]) * 2.5)
    assert avg["h"].dtype == torch.float16
    assert torch.equal(avg["h"], torch.tensor([1.25, 3.75], dtype=torch.float16))
    # Integer / bool buffers are never averaged into floats: they come from the first.
    assert avg["num_batches_tracked"].dtype == torch.int64
    assert int(avg["num_batches_tracked"]) == 10
    assert avg["flag"].dtype == torch.bool and avg["flag"].tolist() == [True, False]
    # Inputs untouched, result shares no storage with them.
    _assert_sd_close(sds[0], originals[0], rtol=0, atol=0)
    avg["num_batches_tracked"] += 1
    avg["w"] += 1
    assert int(sds[0]["num_batches_tracked"]) == 10 and float(sds[0]["w"][0, 0]) == 1.0


def test_weighted_average_matches_direct_formula() -> None:
    g = torch.Generator().manual_seed(0)
    sds = [{"w": torch.randn(5, 3, generator=g), "n": torch.tensor(i)} for i in range(3)]
    avg = average_state_dicts(sds, weights=[1.0, 3.0, 0.0])
    torch.testing.assert_close(avg["w"], 0.25 * sds[0]["w"] + 0.75 * sds[1]["w"])
    assert avg["n"].dtype == torch.int64 and int(avg["n"]) == 0
    uniform = average_state_dicts(sds)
    torch.testing.assert_close(uniform["w"], torch.stack([s["w"] for s in sds]).mean(0))
    for bad in ([1.0, 2.0], [1.0, -1.0, 1.0], [0.0, 0.0, 0.0], [1.0, math.nan, 1.0]):
        with pytest.raises(ValueError, match="weights"):
            average_state_dicts(sds, weights=bad)


def test_mismatched_state_dicts_raise() -> None:
    a = {"w": torch.zeros(2), "b": torch.zeros(1)}
    with pytest.raises(ValueError, match="at least one"):
        average_state_dicts([])
    with pytest.raises(ValueError, match="keys"):
        average_state_dicts([a, {"w": torch.zeros(2)}])
    with pytest.raises(ValueError, match=r"\(3,\)"):
        interpolate(a, {"w": torch.zeros(3), "b": torch.zeros(1)}, 0.5)
    with pytest.raises(ValueError, match="float64"):
        interpolate(a, {"w": torch.zeros(2, dtype=torch.float64), "b": torch.zeros(1)}, 0.5)


def test_interpolate() -> None:
    soup = {"w": torch.tensor([0.0, 4.0]), "n": torch.tensor(7)}
    cand = {"w": torch.tensor([8.0, 0.0]), "n": torch.tensor(99)}
    mixed = interpolate(soup, cand, 0.25)
    assert torch.equal(mixed["w"], torch.tensor([2.0, 3.0]))
    assert mixed["n"].dtype == torch.int64 and int(mixed["n"]) == 7
    assert torch.equal(interpolate(soup, cand, 0.0)["w"], soup["w"])
    assert torch.equal(interpolate(soup, cand, 1.0)["w"], cand["w"])
    for alpha in (-0.1, 1.1, math.nan):
        with pytest.raises(ValueError, match="alpha"):
            interpolate(soup, cand, alpha)


def test_is_finite_state_dict() -> None:
    good = {"w": torch.ones(3), "n": torch.tensor(3)}
    assert is_finite_state_dict(good)
    assert not is_finite_state_dict({**good, "w": torch.tensor([1.0, math.nan])})
    assert not is_finite_state_dict({**good, "v": torch.tensor([math.inf])})


# --------------------------------------------------------------------------- greedy, fake scores


def test_greedy_soup_with_hand_picked_scores() -> None:
    # Score of a soup = hand-picked number for the set of ingredients it averages.
    table = {
        frozenset({0}): 0.60,
        frozenset({1}): 0.70,
        frozenset({2}): 0.50,
        frozenset({3}): 0.65,
        frozenset({1, 3}): 0.72,  # helps: kept
        frozenset({0, 1, 3}): 0.71,  # hurts: 0 skipped
        frozenset({1, 2, 3}): 0.72,  # ties: kept (>=)
    }

    def score(sd: StateDict) -> float:
        w = sd["w"]
        support = frozenset(int(i) for i in torch.nonzero(w).flatten())
        assert torch.allclose(w[w != 0], w[w != 0].mean())  # greedy only makes uniform soups
        return table[support]

    evaluate = Counting(score)
    result = greedy_soup(_one_hot(4), evaluate)
    assert result.kept == [1, 3, 2]
    assert result.ratios == pytest.approx([1.0, 1 / 2, 1 / 3])
    assert result.ingredient_scores == [0.60, 0.70, 0.50, 0.65]
    assert result.soup_score == 0.72
    torch.testing.assert_close(
        result.state_dict["w"], torch.tensor([0, 1, 1, 1]) / 3.0, check_dtype=False
    )
    assert result.weights == pytest.approx([1 / 3] * 3)
    # Each ingredient scored once, then one uniform soup per later candidate.
    assert len(evaluate.calls) == 4 + 3
    # Visited best first: 1 (0.70), 3 (0.65), 0 (0.60), 2 (0.50).
    assert [t["candidate"] for t in result.trials] == [3, 0, 2]
    assert [t["accepted"] for t in result.trials] == [True, False, True]


def test_greedy_soup_distance_example() -> None:
    # Scalar ingredients, score = -(w - 0)^2: hand-computed run.
    sds = [{"w": torch.tensor([v], dtype=torch.float64)} for v in (1.0, -1.0, 5.0, 0.5)]
    result = greedy_soup(sds, _neg_distance(torch.zeros(1, dtype=torch.float64)))
    # Order 3 (0.5), 0 (1.0; ties with 1, input order), 1, 2. {3,0} -> 0.75 hurts;
    # {3,1} -> -0.25 helps; {3,1,2} -> 1.5 hurts.
    assert result.kept == [3, 1]
    assert result.ingredient_scores == [-1.0, -1.0, -25.0, -0.25]
    assert float(result.state_dict["w"]) == -0.25
    assert result.soup_score == -0.0625


def test_greedy_interp_finds_the_optimal_alpha() -> None:
    # Target 0.7 * a + 0.3 * b; ingredient c pulls away from it at every alpha.
    a, b, c = _one_hot(3)
    target = torch.tensor([0.7, 0.3, 0.0], dtype=torch.float64)
    evaluate = Counting(_neg_distance(target))
    grid = [0.0, *alpha_grid(20)]  # 0, 0.05, ..., 1 (alpha = 0 is ignored)
    result = greedy_interp_soup([b, c, a], evaluate, grid)
    assert result.kept == [2, 0]  # a (closest), then b at alpha 0.3; c dropped
    assert result.ratios == [1.0, pytest.approx(0.3)]
    torch.testing.assert_close(result.state_dict["w"], target)
    assert result.soup_score == pytest.approx(0.0, abs=1e-12)
    assert result.weights == pytest.approx([0.7, 0.3])
    # 3 ingredients once each, then the 20 alphas > 0 for each of the 2 later candidates.
    assert len(evaluate.calls) == 3 + 2 * 20
    accepted = [t for t in result.trials if t["accepted"]]
    assert len(accepted) == 1 and accepted[0]["alpha"] == pytest.approx(0.3)


def test_greedy_interp_prefers_running_mean_on_ties() -> None:
    # A flat held-out score: every alpha ties, so the model-soups share 1/(k+1) is used.
    result = greedy_interp_soup(_one_hot(3), lambda sd: 0.5, alpha_grid(4))
    assert result.kept == [0, 1, 2]
    assert result.ratios == pytest.approx([1.0, 0.5, 0.25])  # 1/3 is nearest to 0.25


def test_greedy_interp_running_mean_equals_greedy_on_fake_scores() -> None:
    g = torch.Generator().manual_seed(0)
    sds = [{"w": torch.randn(6, generator=g, dtype=torch.float64)} for _ in range(8)]
    target = torch.randn(6, generator=g, dtype=torch.float64) * 0.3
    greedy = greedy_soup(sds, _neg_distance(target))
    interp = greedy_interp_soup(sds, _neg_distance(target), RUNNING_MEAN)
    assert 1 < len(greedy.kept) < len(sds)  # a non-trivial run: some kept, some skipped
    assert interp.kept == greedy.kept
    assert interp.ratios == pytest.approx(greedy.ratios)
    _assert_sd_close(interp.state_dict, greedy.state_dict)
    assert interp.soup_score == pytest.approx(greedy.soup_score)


def _peaked(peak: float, top: float, width: int = 0) -> Callable[[float], float]:
    """A unimodal score of alpha: rises linearly to `top` at `peak`, level for `width` steps of
    0.05 after it, then falls linearly."""
    return lambda a: top - 2.0 * max(peak - a, 0.0, a - peak - 0.05 * width)


def test_ascending_scan_finds_the_grid_maximum_with_few_evaluations() -> None:
    grid = alpha_grid(20)  # 0.05, ..., 1
    for index, peak in enumerate(grid):
        for width in (0, 2):  # a single peak, and a plateau of three tied alphas
            score = _peaked(peak, top=0.9, width=width)
            calls: list[float] = []
            scored = ascending_scan(
                lambda a, calls=calls, score=score: calls.append(a) or score(a), grid, score(0.0)
            )
            best_alpha, best_score = max(scored, key=lambda p: p[1])
            assert best_score == max(score(a) for a in grid)
            assert best_alpha == pytest.approx(peak)  # the first of tied alphas, as the grid
            assert calls == sorted(calls) and calls == [a for a, _ in scored]
            # Every tied alpha is scored, so the soup's tie-break sees them all, as the grid's.
            assert {a for a in grid if score(a) == best_score} <= set(calls)
            tied = min(width, len(grid) - 1 - index)
            assert len(calls) <= min(index + tied + 2, len(grid))
    # A candidate whose smallest blend already loses to the soup costs one evaluation.
    calls = []
    scored = ascending_scan(lambda a: calls.append(a) or 0.4 - a, grid, start=0.5)
    assert calls == [0.05] and scored == [(0.05, pytest.approx(0.35))]
    # NaN is a drop; bad grids raise.
    assert len(ascending_scan(lambda a: math.nan, grid, start=0.0)) == 1
    for bad in ([], [0.0, 0.5], [0.5, 1.5]):
        with pytest.raises(ValueError, match="alphas"):
            ascending_scan(lambda a: 0.0, bad, start=0.0)


def test_scan_soup_equals_grid_soup_on_unimodal_scores_at_fewer_evaluations() -> None:
    # -distance to a target is concave along every blend line, hence unimodal in alpha.
    g = torch.Generator().manual_seed(0)
    sds = [{"w": torch.randn(128, generator=g, dtype=torch.float64)} for _ in range(10)]
    target = torch.stack([sd["w"] for sd in sds[:4]]).mean(0)
    grid_eval, scan_eval = Counting(_neg_distance(target)), Counting(_neg_distance(target))
    grid = greedy_interp_soup(sds, grid_eval, alpha_grid(20))
    scan = greedy_interp_soup(sds, scan_eval, alpha_grid(20), search="scan")
    assert 1 < len(grid.kept) < len(sds)  # a non-trivial run: some kept, some dropped
    assert scan.kept == grid.kept and scan.ratios == grid.ratios
    _assert_sd_close(scan.state_dict, grid.state_dict, rtol=0, atol=0)
    assert scan.soup_score == grid.soup_score
    assert len(grid_eval.calls) == 10 + 9 * 20
    assert len(scan_eval.calls) < 10 + 9 * 20 // 3


def test_real_scan_soup_never_below_best_ingredient(
    learners_and_saboteur: list[StateDict],
) -> None:
    evaluate = Counting(_accuracy)
    result = greedy_interp_soup(learners_and_saboteur, evaluate, alpha_grid(20), search="scan")
    assert result.soup_score >= max(result.ingredient_scores)
    assert _accuracy(result.state_dict) == result.soup_score
    # The saboteur loses at its smallest blend already: one evaluation, then dropped.
    saboteur = len(learners_and_saboteur) - 1
    assert [t["alpha"] for t in result.trials if t["candidate"] == saboteur] == [0.05]
    assert saboteur not in result.kept
    assert len(evaluate.calls) < len(learners_and_saboteur) * 20
    with pytest.raises(ValueError, match="search"):
        greedy_interp_soup(learners_and_saboteur, _accuracy, alpha_grid(4), search="golden")


def test_bad_ratios_and_scores_raise() -> None:
    sds = _one_hot(2)
    for ratios in ("mean", [0.0], [], [0.5, 1.5], [-0.5]):
        with pytest.raises(ValueError, match="ratio"):
            greedy_interp_soup(sds, lambda sd: 0.0, ratios)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NaN"):
        greedy_soup(sds, lambda sd: math.nan)
    with pytest.raises(ValueError, match="at least one"):
        greedy_soup([], lambda sd: 0.0)


def test_single_ingredient() -> None:
    (sd,) = _one_hot(1)
    for result in (
        greedy_soup([sd], lambda s: 0.3),
        greedy_interp_soup([sd], lambda s: 0.3, alpha_grid(10)),
        uniform_soup([sd], lambda s: 0.3),
    ):
        assert result.kept == [0] and result.ratios == [1.0] and result.soup_score == 0.3
        assert torch.equal(result.state_dict["w"], sd["w"])


# --------------------------------------------------------------------------- greedy, real model


def test_learners_are_distinct_and_weak(learners: list[StateDict]) -> None:
    scores = [_accuracy(sd) for sd in learners]
    assert all(0.4 < s < 1.0 for s in scores), scores
    assert len({round(s, 6) for s in scores}) > 1  # different shards: different models
    assert all(is_finite_state_dict(sd) for sd in learners)


@pytest.mark.parametrize("method", ["greedy", "greedy_interp"])
def test_real_soup_never_below_best_ingredient(
    learners_and_saboteur: list[StateDict], method: str
) -> None:
    sds = learners_and_saboteur
    evaluate = Counting(_accuracy)
    if method == "greedy":
        result = greedy_soup(sds, evaluate)
    else:
        result = greedy_interp_soup(sds, evaluate, [0.0, *alpha_grid(20)])
    best = max(result.ingredient_scores)
    assert result.soup_score >= best
    assert result.kept[0] == result.ingredient_scores.index(best)
    # The reported score is the real held-out accuracy of the returned state dict.
    assert _accuracy(result.state_dict) == result.soup_score
    # Every ingredient was scored exactly once, first and in input order.
    for i, sd in enumerate(sds):
        _assert_sd_close(evaluate.calls[i], sd, rtol=0, atol=0)
        assert result.ingredient_scores[i] == _accuracy(sd)
    # The soup is a dense model again: no zero pattern survives averaging.
    if len(result.kept) > 1:
        assert float((result.state_dict["0.weight"] == 0).float().mean()) < 0.05
    # The saboteur is the worst ingredient, and greedy soup leaves it out.
    saboteur = len(sds) - 1
    assert result.ingredient_scores[saboteur] == min(result.ingredient_scores)
    if method == "greedy":
        assert saboteur not in result.kept
        assert len(evaluate.calls) == 2 * len(sds) - 1


def test_real_running_mean_interp_equals_greedy(learners_and_saboteur: list[StateDict]) -> None:
    greedy = greedy_soup(learners_and_saboteur, _accuracy)
    interp = greedy_interp_soup(learners_and_saboteur, _accuracy, RUNNING_MEAN)
    assert interp.kept == greedy.kept
    assert interp.ratios == pytest.approx(greedy.ratios)
    assert interp.soup_score == greedy.soup_score
    _assert_sd_close(interp.state_dict, greedy.state_dict, rtol=1e-5, atol=1e-6)
    assert interp.state_dict["1.num_batches_tracked"].dtype == torch.int64


def test_real_uniform_soup(learners: list[StateDict]) -> None:
    result = uniform_soup(learners, _accuracy)
    assert result.kept == list(range(len(learners)))
    assert result.weights == pytest.approx([1 / len(learners)] * len(learners))
    for key, value in result.state_dict.items():  # each float entry: the learners' mean
        if value.is_floating_point():
            mean = torch.stack([sd[key].double() for sd in learners]).mean(0)
            torch.testing.assert_close(value.double(), mean, rtol=0, atol=1e-6)
    assert result.soup_score == _accuracy(result.state_dict)
    assert result.state_dict["1.num_batches_tracked"].dtype == torch.int64


def test_report_is_json(learners: list[StateDict]) -> None:
    result = greedy_interp_soup(learners[:3], _accuracy, alpha_grid(4))
    report = json.loads(json.dumps(result.to_report()))
    assert report["method"] == "greedy_interp"
    assert report["kept"] == result.kept and report["ratios"] == result.ratios
    assert report["ingredient_scores"] == result.ingredient_scores
    assert report["soup_score"] == result.soup_score
    assert sum(report["weights"]) == pytest.approx(1.0)
    assert len(report["trials"]) == 2 * 4
    assert isinstance(result, SoupResult)
    # A trial whose evaluate gave NaN never wins, and the report stays strict JSON.
    nan_trial = greedy_soup(_one_hot(2), lambda sd: math.nan if bool((sd["w"] != 0).all()) else 0.5)
    assert nan_trial.kept == [0] and nan_trial.trials[0]["score"] == -math.inf
    strict = json.dumps(nan_trial.to_report(), allow_nan=False)
    assert json.loads(strict)["trials"][0]["score"] is None


# --------------------------------------------------------------------------- BatchNorm


class BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn2d = nn.BatchNorm2d(4, momentum=0.3)
        self.fc = nn.Linear(4 * 6 * 6, 5)
        self.bn1d = nn.BatchNorm1d(5)
        self.free = nn.BatchNorm1d(5, track_running_stats=False)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn2d(self.conv(x)))
        return self.free(self.bn1d(self.fc(x.flatten(1))))


def _buffer(module: nn.Module, name: str) -> Tensor:
    value = getattr(module, name)
    assert isinstance(value, Tensor)
    return value


def _batch_stats(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel mean and unbiased variance, as BatchNorm computes them in train mode."""
    flat = x.transpose(0, 1).reshape(x.shape[1], -1)
    return flat.mean(1), flat.var(1, unbiased=True)


@pytest.mark.parametrize("num_batches", [1, 3])
def test_recompute_batchnorm_stats_matches_batch_statistics(num_batches: int) -> None:
    torch.manual_seed(0)
    model = BNNet()
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(16, 3, 8, 8, generator=g) * 2 + 1 for _ in range(num_batches)]

    # Direct computation: the inputs each BN layer sees in a train-mode forward.
    seen: dict[str, list[Tensor]] = {"bn2d": [], "bn1d": []}
    reference = copy.deepcopy(model).train()
    for name in seen:
        getattr(reference, name).register_forward_hook(
            lambda mod, inp, out, name=name: seen[name].append(inp[0].detach())
        )
    with torch.no_grad():
        for x in batches:
            reference(x)

    # Stale statistics and a mixed train/eval state that must come back as it was.
    with torch.no_grad():
        _buffer(model.bn2d, "running_mean").fill_(5.0)
        _buffer(model.bn1d, "running_var").fill_(9.0)
    model.eval()
    model.conv.train()
    weights_before = {k: v.clone() for k, v in model.named_parameters()}

    recompute_batchnorm_stats(model, [(x, torch.zeros(16)) for x in batches])

    for name, inputs in seen.items():
        layer = getattr(model, name)
        stats = [_batch_stats(x) for x in inputs]
        # momentum=None: cumulative average, every batch weighs the same.
        mean = torch.stack([m for m, _ in stats]).mean(0)
        var = torch.stack([v for _, v in stats]).mean(0)
        torch.testing.assert_close(layer.running_mean, mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.running_var, var, rtol=1e-5, atol=1e-5)
        assert int(layer.num_batches_tracked) == num_batches
        if num_batches == 1:  # one batch: exactly the statistics of all the data
            torch.testing.assert_close(layer.running_var, _batch_stats(inputs[0])[1])
    assert model.bn2d.momentum == 0.3 and model.bn1d.momentum == 0.1
    assert not model.training and model.conv.training and not model.bn2d.training
    assert all(torch.equal(p, weights_before[k]) for k, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters())


def test_recompute_batchnorm_stats_needs_a_batch() -> None:
    model = BNNet()
    with torch.no_grad():
        _buffer(model.bn2d, "running_mean").fill_(5.0)
    model.eval()
    with pytest.raises(ValueError, match="at least one batch"):
        recompute_batchnorm_stats(model, iter([]))
    assert torch.equal(_buffer(model.bn2d, "running_mean"), torch.full((4,), 5.0))
    assert model.bn2d.momentum == 0.3 and not model.training
    # No BatchNorm: nothing to do, no error.
    recompute_batchnorm_stats(nn.Linear(2, 2), [])
