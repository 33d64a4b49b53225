"""What every benchmark does around its measurements, beside the measuring itself.

- `pinned`: the torch thread count and, asked, one core for the block (restored after).
- `measured`: the record of where a measurement's seconds came from, with the keys
  summary.json uses (`host`, `other_cores_busy`, `load_average`), so `lipt.core.host`'s
  `is_pinned`, `is_busy_beside` and `is_loaded` read it as they read a run.
- `shared_caveat`: the line that names measurements other work shared the machine with: shared
  cache, memory and cores inflate their seconds (by up to ~40% on one pinned core here).
- `user_errors`: a mistake in the arguments or overrides ends the run in one line, as the
  entry points report it, not in a traceback.
- `ResultFile`: rows written as each lands, atomically, so a benchmark stopped midway keeps
  what it measured and a re-run with the same arguments measures only what is missing.

Not a package: each script puts this folder on sys.path before importing it, since only
`python benchmarks/X.py` does so itself (the doc checker runs the scripts through runpy).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lipt.core.errors import UserError, fail, one_line
from lipt.core.host import (
    BUSY_SHARE,
    allowed_cores,
    core_ticks,
    host,
    is_busy_beside,
    is_loaded,
    is_pinned,
    load_average,
    other_cores_busy,
)
from lipt.core.seeding import torch_threads

if TYPE_CHECKING:
    from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]  # the repository: configs/ and the entry scripts


def compose_config(config: str, overrides: Sequence[str]) -> DictConfig:
    """The Hydra config `config` (train, select, pretrain) composed from configs/ with
    `overrides`, as the entry scripts compose it (not validated)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()  # a stage run in this process may have left Hydra set up
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        return hydra_compose(config, overrides=list(overrides))


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Report a `UserError` (a bad setting lipt refused) or a Hydra composition error (an
    unknown group option or key in an override) as `error: <message>`, exit code 2."""
    from hydra.errors import HydraException

    try:
        yield
    except (UserError, HydraException) as e:
        fail(one_line(e))


@contextlib.contextmanager
def pinned(threads: int | None, core: int | None = None) -> Iterator[None]:
    """Run the block with `threads` torch threads (None or 0: torch's) and, given `core`, on that
    core alone; both restored after. Only a run held to some of the cores can tell how busy the
    others were beside it (`other_cores_busy`); one core and one thread is `is_pinned`."""
    if threads is not None and threads < 0:
        raise SystemExit(f"error: --threads {threads}: give a thread count, or 0 for torch's")
    cores = allowed_cores()
    if core is not None:
        if core not in cores:
            raise SystemExit(f"error: --core {core}: this process may use cores {sorted(cores)}")
        os.sched_setaffinity(0, {core})
    try:
        with torch_threads(threads or None):  # 0, as None: torch's (set_num_threads refuses 0)
            yield
    finally:
        if core is not None:
            os.sched_setaffinity(0, cores)


@contextlib.contextmanager
def measured() -> Iterator[dict[str, Any]]:
    """A dict filled when the block ends: the machine (`host`), the busy share of the cores
    this process may not use during the block, and the 1-minute load average at its start and
    end. Reading them costs microseconds, outside any timed region of the block."""
    record: dict[str, Any] = {}
    ticks, load_before = core_ticks(), load_average()
    yield record
    record["host"] = host()
    record["other_cores_busy"] = other_cores_busy(ticks, core_ticks())
    record["load_average"] = [load_before, load_average()]


def log(message: str) -> None:
    """A progress line on stderr, with the time (stdout keeps the results)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def host_line() -> str:
    """The machine and how this process uses it, in one line to print above the results."""
    h = host()
    return (
        f"host: {h['cpu']}, {h['cores']} cores ({h['cores_allowed']} allowed), "
        f"{h['accelerator']}, torch threads {h['torch_threads']}"
    )


def shared_caveat(records: Sequence[Mapping[str, Any]]) -> str:
    """The caveat for `records` (from `measured`, or stage summaries) that other work shared
    the machine with: a pinned one whose other cores were busy beyond BUSY_SHARE, an unpinned
    one that started or ended with more runnable work than cores. Empty when there are none."""
    busy = sum(1 for r in records if is_pinned(r) and is_busy_beside(r))
    loaded = sum(1 for r in records if not is_pinned(r) and is_loaded(r))
    machines = {json.dumps(r["host"], sort_keys=True) for r in records if r.get("host")}
    lines = []
    if busy:
        lines.append(
            f"caveat: {busy} of {len(records)} measurements ran pinned while the other cores "
            f"were busy over {BUSY_SHARE:.0%} of the time (shared cache and memory): their "
            "seconds are inflated"
        )
    if loaded:
        lines.append(
            f"caveat: {loaded} of {len(records)} measurements started or ended with a 1-minute "
            "load average above the core count (other work shared the cores): their seconds are "
            "inflated"
        )
    if len(machines) > 1:
        lines.append(f"caveat: measured on {len(machines)} machines: {sorted(machines)}")
    return "\n".join(lines)


def print_caveat(records: Sequence[Mapping[str, Any]]) -> None:
    if caveat := shared_caveat(records):
        print(f"\n{caveat}", flush=True)


class ResultFile:
    """A benchmark's rows in `path` as {"args": settings, "rows": [...]}, rewritten atomically
    after each row. A row measured by an earlier run with the same settings is taken from the
    file instead of measured again. A file of other settings is refused, not overwritten: its
    rows are another run's measurements. No path: rows in memory only."""

    def __init__(self, path: Path | None, settings: Mapping[str, Any]) -> None:
        self.path = path
        # As JSON stores them (paths as text, tuples as lists), to compare with the file's.
        self.settings = json.loads(json.dumps(dict(settings), default=str))
        self.rows: list[dict[str, Any]] = []
        self.earlier = self._earlier_rows()

    def _earlier_rows(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.is_file():
            return []
        earlier = json.loads(self.path.read_text())
        recorded = earlier.get("args", {})
        if recorded != self.settings:
            keys = sorted(set(recorded) | set(self.settings))
            changed = [k for k in keys if recorded.get(k) != self.settings.get(k)]
            was = ", ".join(f"{k}={recorded.get(k)}" for k in changed[:3])
            now = ", ".join(f"{k}={self.settings.get(k)}" for k in changed[:3])
            raise UserError(
                f"{self.path} holds rows measured with {was}, this run has {now}: pass the "
                "same arguments to resume it, or another path to start a new one"
            )
        rows = list(earlier.get("rows", []))
        log(f"resuming: {len(rows)} rows measured earlier in {self.path}")
        return rows

    def measure(
        self, key: Mapping[str, Any], run: Callable[..., dict[str, Any]], *run_args: Any
    ) -> dict[str, Any]:
        """The row whose fields match `key`: an earlier run's, or `run(*run_args)`'s with its
        `measured` record added; kept in `rows` and written at once."""
        done = [r for r in self.earlier if all(r.get(k) == v for k, v in key.items())]
        if done:
            row = done[0]
        else:
            with measured() as record:
                row = run(*run_args)
            row = {**row, **record}
        self.rows.append(row)
        if self.path is not None:
            from lipt.core.artifacts import write_json  # Lightning's import, only when writing

            write_json(self.path, {"args": self.settings, "rows": self.rows})
        return row
