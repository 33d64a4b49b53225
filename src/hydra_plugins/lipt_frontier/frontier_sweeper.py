"""The frontier's sweeper (`hydra/sweeper=frontier`): Hydra's basic sweeper plus the reference
job. The logic is lipt.run.frontier_sweep.with_reference; Hydra only loads sweepers from this
namespace, so the class lives here."""

from __future__ import annotations

from collections.abc import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override

from lipt.run.frontier_sweep import with_reference


class FrontierSweeper(BasicSweeper):
    """The cartesian product of the sweep's axes, plus one reference job per combination of the
    axes outside `point_keys` (the approach and the budget), with `reference`'s overrides in
    their place; the references first."""

    def __init__(
        self,
        max_batch_size: int | None = None,
        params: dict[str, str] | None = None,
        reference: Sequence[str] = ("+approach=full_data",),
        point_keys: Sequence[str] = ("approach", "fraction"),
    ) -> None:
        super().__init__(max_batch_size, params)
        if not reference:
            raise ValueError("hydra.sweeper.reference is empty: give the reference's overrides")
        self.reference = [str(o) for o in reference]
        self.point_keys = [str(k) for k in point_keys]

    def split_arguments(  # type: ignore[override]
        self, overrides: list[Override], max_batch_size: int | None
    ) -> list[list[list[str]]]:
        (product,) = BasicSweeper.split_arguments(overrides, None)
        jobs = with_reference(product, self.reference, self.point_keys)
        size = max_batch_size if max_batch_size and max_batch_size > 0 else len(jobs)
        return [jobs[i : i + size] for i in range(0, len(jobs), size)]
