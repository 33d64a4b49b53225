"""GradMatch's NNLS step (`nnls_from`, Lawson-Hanson's inner loop) against scipy's NNLS, on the
calls its non-negative OMP really makes and with a coordinate whose optimum is exactly 0 where
the start is 0 too: the step fraction x / (x - z) was 0 / 0 there, the weights NaN."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy.optimize import nnls
from torch import Tensor

from lipt.selection import gradmatch
from lipt.selection.gradients import LastLayerGradient
from lipt.selection.gradmatch import nnls_from, omp_nonneg

Call = tuple[Tensor, Tensor, Tensor]  # (quad, c, x) as omp_nonneg passes them


def scipy_nnls(quad: Tensor, c: Tensor) -> Tensor:
    """argmin_{x >= 0} x^T quad x - 2 c^T x by scipy: with quad = L L^T it is
    min ||L^T x - L^-1 c||^2 (the same objective up to a constant)."""
    L = np.linalg.cholesky(quad.numpy())
    x, _ = nnls(L.T, np.linalg.solve(L, c.numpy()), maxiter=100 * len(c))
    return torch.from_numpy(x)


def objective(quad: Tensor, c: Tensor, x: Tensor) -> float:
    return float(x @ quad @ x - 2 * c @ x)


def omp_calls(monkeypatch: pytest.MonkeyPatch, run: Callable[[], object]) -> list[Call]:
    """The (quad, c, x) of every nnls_from call that `run` makes through omp_nonneg."""
    calls: list[Call] = []

    def spy(quad: Tensor, c: Tensor, x: Tensor) -> Tensor:
        calls.append((quad.clone(), c.clone(), x.clone()))
        return nnls_from(quad, c, x)

    monkeypatch.setattr(gradmatch, "nnls_from", spy)
    run()
    monkeypatch.undo()
    return calls


def realistic_calls(monkeypatch: pytest.MonkeyPatch, seed: int) -> list[Call]:
    """OMP of a target outside the atoms' cone by 40 of 2,000 atoms in 48 dimensions (the
    per-batch variant's explicit vectors): NNLS drops atoms several times, at m in the tens."""
    g = torch.Generator().manual_seed(seed)
    atoms = torch.randn(2000, 48, generator=g, dtype=torch.float64) + 0.3
    goal = LastLayerGradient(None, 20 * torch.randn(48, generator=g, dtype=torch.float64))
    calls = omp_calls(monkeypatch, lambda: omp_nonneg(atoms, None, goal, 40, lam=1e-3, eps=0.0))
    assert len(calls) >= 3 and max(len(x) for _, _, x in calls) >= 20
    return calls


def with_zero_coordinate(call: Call, at: int) -> Call:
    """The problem with one more coordinate at position `at`, uncoupled from the others, whose
    optimum is exactly 0 (its c is 0), started at 0."""
    quad, c, x = call
    m = len(x)
    keep = torch.tensor([i for i in range(m + 1) if i != at])
    big = quad.new_zeros(m + 1, m + 1)
    big[keep[:, None], keep[None, :]] = quad
    big[at, at] = float(quad.diagonal().mean())
    return (
        big,
        torch.cat([c[:at], c.new_zeros(1), c[at:]]),
        torch.cat([x[:at], x.new_zeros(1), x[at:]]),
    )


@pytest.mark.parametrize("seed", range(5))
def test_nnls_from_is_scipys_nnls_on_the_calls_omp_makes(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    for quad, c, x in realistic_calls(monkeypatch, seed):
        # What OMP passes: the last weights (> 0) and its new atom at 0.
        assert bool((x[:-1] > 0).all()) and x[-1] == 0
        ours, theirs = nnls_from(quad, c, x), scipy_nnls(quad, c)
        assert bool((ours >= 0).all())
        assert torch.equal(ours > 0, theirs > 1e-12)  # the same support
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-9 * float(theirs.abs().max()))


@pytest.mark.parametrize("at", ["first", "last"])
@pytest.mark.parametrize("seed", range(5))
def test_a_coordinate_at_zero_with_its_optimum_at_zero_stays_zero(
    monkeypatch: pytest.MonkeyPatch, seed: int, at: str
) -> None:
    """The 0 / 0 case at realistic sizes: the extra coordinate neither turns the weights NaN nor
    drops OMP's new atom (also at 0) with it; the rest is the solution without it."""
    for call in realistic_calls(monkeypatch, seed):
        pos = 0 if at == "first" else len(call[2])
        quad, c, x = with_zero_coordinate(call, pos)
        # z is exactly 0 at the extra coordinate on the first pass: x / (x - z) is 0 / 0 there.
        assert torch.linalg.solve(quad, c)[pos] == 0 and x[pos] == 0
        ours = nnls_from(quad, c, x)
        assert bool(ours.isfinite().all()) and ours[pos] == 0
        rest = torch.cat([ours[:pos], ours[pos + 1 :]])
        without = nnls_from(*call)
        torch.testing.assert_close(rest, without, rtol=1e-9, atol=1e-9 * float(without.abs().max()))
        theirs = scipy_nnls(quad, c)
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-9 * float(theirs.abs().max()))


D64 = torch.float64


@pytest.mark.parametrize(
    ("quad", "c", "x", "expected"),
    [
        # optimum [1, 1, 0]: z is feasible, but z[2] == 0 == x[2]
        (torch.eye(3, dtype=D64), [1.0, 1.0, 0.0], [0.5, 0.5, 0.0], [1.0, 1.0, 0.0]),
        # a coordinate to drop as well: optimum [1, 0, 0]
        (torch.eye(3, dtype=D64), [1.0, -1.0, 0.0], [0.5, 0.5, 0.0], [1.0, 0.0, 0.0]),
        # coupled: on {0, 1} the optimum is [0.56, -0.24], so 1 goes; then x0 = 1 / 2
        (
            torch.tensor([[2.0, 0.5, 0.0], [0.5, 2.0, 0.0], [0.0, 0.0, 1.0]], dtype=D64),
            [1.0, -0.2, 0.0],
            [0.5, 0.1, 0.0],
            [0.5, 0.0, 0.0],
        ),
        # a zero coordinate on its way up (x 0, z 1) beside one at 0 on its way down (x 0, z -1)
        (torch.eye(3, dtype=D64), [1.0, 1.0, -1.0], [0.5, 0.0, 0.0], [1.0, 1.0, 0.0]),
    ],
)
def test_nnls_from_small_exact_cases(
    quad: Tensor, c: list[float], x: list[float], expected: list[float]
) -> None:
    c_t, x_t = torch.tensor(c, dtype=D64), torch.tensor(x, dtype=D64)
    ours = nnls_from(quad, c_t, x_t)
    torch.testing.assert_close(ours, torch.tensor(expected, dtype=D64))
    torch.testing.assert_close(ours, scipy_nnls(quad, c_t))


def test_omp_nonneg_through_a_zero_over_zero_keeps_its_atoms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Small integer gradients (exact arithmetic) where OMP's new atom has an optimum of exactly
    0: the NaN weights used to empty the support for good, and OMP returned no atom at all."""
    atoms = torch.tensor(
        [[3.0, -1.0], [2.0, 2.0], [-2.0, 2.0], [-2.0, 2.0], [-3.0, 2.0], [0.0, -3.0]], dtype=D64
    )
    goal = LastLayerGradient(None, torch.tensor([-2.0, -4.0], dtype=D64))
    result: list[tuple[Tensor, Tensor]] = []
    calls = omp_calls(
        monkeypatch, lambda: result.append(omp_nonneg(atoms, None, goal, 6, lam=1.0, eps=0.0))
    )
    hit = [
        (quad, c, x)
        for quad, c, x in calls
        if bool((torch.linalg.solve(quad, c)[x == 0] == 0).any())
    ]
    assert hit  # OMP did pass nnls_from a start at 0 where the optimum is exactly 0
    rows, w = result[0]
    assert len(rows) > 0 and bool((w > 0).all())
    quad = atoms[rows] @ atoms[rows].T + torch.eye(len(rows), dtype=D64)
    c = atoms[rows] @ goal.bias
    torch.testing.assert_close(w, scipy_nnls(quad, c))  # the best weights of its atoms
    assert objective(quad, c, w) < 0  # better than no atom


@pytest.mark.parametrize(
    ("quad", "c", "x", "match"),
    [
        (torch.eye(3), torch.ones(2), torch.zeros(3), "quad"),
        (torch.eye(3), torch.ones(3), torch.zeros(3, 1), "quad"),
        (torch.eye(3), torch.ones(3), torch.tensor([0.5, -0.1, 0.0]), "feasible"),
        (torch.eye(3), torch.ones(3), torch.tensor([0.5, float("nan"), 0.0]), "feasible"),
        (torch.eye(3), torch.ones(3), torch.tensor([0.5, float("inf"), 0.0]), "feasible"),
    ],
)
def test_nnls_from_rejects_bad_input(quad: Tensor, c: Tensor, x: Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        nnls_from(quad, c, x)
