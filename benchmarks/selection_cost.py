"""Selection cost: each selector's wall time over one inference pass, and its peak memory.

Part 1, Fashion-MNIST with `convnet` at fraction 0.1: for every selector, the time of
`choose_subset` (its own forward passes over the pool and validation split included) divided by
the time of one inference pass over the training pool, measured side by side in one process,
and the peak resident memory above the baseline while it runs.
Part 2, a synthetic pool of 1,000,000 samples, 10 classes and 512-wide features: each selector
in its own process, its peak resident memory (the target: within 8 GiB).

    python benchmarks/selection_cost.py                 # both parts
    python benchmarks/selection_cost.py --skip-large    # part 1 only
    python benchmarks/selection_cost.py --selectors coverage   # one selector, both parts
    python benchmarks/selection_cost.py --selectors random --skip-small --n 20000   # a smoke run

It prints the machine first and, after the tables, a caveat where other work shared it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from lipt.run.config import run_of
from lipt.selection.types import LearnerHeads

sys.path.insert(0, str(Path(__file__).resolve().parent))  # measure.py, also under runpy
from measure import compose_config, host_line, measured, print_caveat, user_errors

TARGET = {
    "random": 2,
    "uncertainty": 2,
    "el2n": 2,
    "grand": 2,
    "glister": 5,
    "gradmatch": 5,
    "craig": 5,
    "ccs": 2,
    "coverage": 2,  # the default's selection within 2x one inference pass
}
SELECTORS = list(TARGET)  # every selector with a cost target, in this order
# The jigsaw stage's learner count (configs/pretrain/jigsaw.yaml); `coverage` applies each
# learner's head to the pool's embeddings, so its cost grows with it.
NUM_LEARNERS = 10


def learner_heads(classes: int, dim: int, generator: torch.Generator) -> LearnerHeads:
    """Heads of the shape the jigsaw stage hands over ([L, C, D], [L, C]): the cost of the
    ensemble does not depend on the values, so no jigsaw run is needed to time it."""
    weight = torch.randn(NUM_LEARNERS, classes, dim, generator=generator) / dim**0.5
    return LearnerHeads(weight, torch.zeros(NUM_LEARNERS, classes))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def release_freed_memory() -> None:
    """Hand memory freed by earlier work back to the OS (glibc), so the baseline is honest."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    # Not glibc: nothing is trimmed and the baseline is merely pessimistic.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakRSS:
    """Samples this process's resident memory every few milliseconds (torch's CPU allocations
    are invisible to tracemalloc)."""

    def __enter__(self) -> PeakRSS:
        release_freed_memory()
        self.base = self.peak = rss_bytes()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def extra_mib(self) -> float:
        return (self.peak - self.base) / 2**20


def fashion_mnist_part(selectors: list[str], repeats: int) -> list[dict]:
    from lipt.selection import model_outputs
    from lipt.stages.build import build_datamodule, build_model, build_parts
    from lipt.stages.select import choose_subset

    rows = []
    dm = model = None
    for name in selectors:
        overrides = ["paths.output_dir=/tmp/lipt-bench", f"selector={name}", "fraction=0.1"]
        run = run_of(compose_config("train", overrides))
        if model is None:  # one data module and model for every selector (the data is shared)
            dm = build_datamodule(run)
            model = build_model(run, 0)
            model_outputs(model, dm.pool_dataloader())  # warm-up
        parts = build_parts(run, dm)  # this selector's
        heads = None
        if name == "coverage":  # as if from pretrain.ckpt: one head per jigsaw learner
            head = model.classifier  # lipt models end in a `classifier` nn.Linear
            heads = learner_heads(head.out_features, head.in_features, torch.Generator())
        inference, selection = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            model_outputs(model, dm.pool_dataloader())
            inference.append(time.perf_counter() - start)
            with PeakRSS() as memory:
                start = time.perf_counter()
                choose_subset(run, parts, [model], seed=0, learner_heads=heads)
                selection.append(time.perf_counter() - start)
        ratio = min(selection) / min(inference)
        rows.append(
            {
                "selector": name,
                "inference_s": min(inference),
                "select_s": min(selection),
                "ratio": ratio,
                "target": TARGET[name],
                "peak_extra_mib": memory.extra_mib,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def large_worker(name: str, n: int, classes: int, dim: int) -> None:
    """One selector on a synthetic pool; prints its time (peak memory is read by the parent)."""
    from lipt.selection import PoolOutputs, SelectionInputs, select_balanced
    from lipt.stages.build import build_selector

    g = torch.Generator().manual_seed(0)
    weight = torch.randn(classes, dim, generator=g) / dim**0.5
    bias = torch.zeros(classes)

    def outputs(count: int) -> PoolOutputs:
        targets = torch.randint(0, classes, (count,), generator=g)
        embeddings = torch.randn(count, dim, generator=g)
        embeddings[torch.arange(count), targets] += 3.0  # some signal
        return PoolOutputs(embeddings @ weight.T + bias, embeddings, targets, torch.arange(count))

    heads = learner_heads(classes, dim, g) if name == "coverage" else None
    inputs = SelectionInputs(outputs(n), outputs(n // 50), (), weight, bias, heads)
    run = run_of(compose_config("train", ["paths.output_dir=/tmp", f"selector={name}"]))
    fn = build_selector(run.node("selector"))
    assert run.selector is not None
    start = time.perf_counter()
    budget = n // 10
    if run.selector.balance:
        selection = select_balanced(fn, inputs, budget, generator=g)
    else:
        selection = fn(inputs, budget, generator=g)
    assert len(selection.rows) == budget
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # this process's peak
    print(json.dumps({"seconds": seconds, "peak_rss_gib": peak_kib / 2**20}))


def large_part(selectors: list[str], n: int, classes: int, dim: int, timeout: float) -> list[dict]:
    rows = []
    for name in selectors:
        try:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    name,
                    "--n",
                    str(n),
                    "--classes",
                    str(classes),
                    "--dim",
                    str(dim),
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            ok = out.returncode == 0
            result = json.loads(out.stdout.strip().splitlines()[-1]) if ok else {}
            note = "" if ok else (out.stderr.strip().splitlines() or ["failed"])[-1][:120]
        except subprocess.TimeoutExpired:
            ok, result, note = False, {}, f"timed out after {timeout:.0f} s"
        rows.append(
            {
                "selector": name,
                "seconds": result.get("seconds"),
                "peak_rss_gib": result.get("peak_rss_gib"),
                "ok": ok,
                "note": note,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker")
    parser.add_argument("--selectors", nargs="+", choices=SELECTORS, default=SELECTORS)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--skip-small", action="store_true")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give a count of at least 1")
    if args.worker:
        large_worker(args.worker, args.n, args.classes, args.dim)
        return
    print(host_line())
    records: list[dict[str, Any]] = []  # one a part: the machine and how busy it was
    if not args.skip_small:
        with measured() as record:
            rows = fashion_mnist_part(args.selectors, args.repeats)
        records.append(record)
        print("\n| selector | select (s) | inference (s) | ratio | target | peak extra (MiB) |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in rows:
            ok = "ok" if r["ratio"] <= r["target"] else "MISSED"
            print(
                f"| {r['selector']} | {r['select_s']:.2f} | {r['inference_s']:.2f} | "
                f"{r['ratio']:.2f}x | <= {r['target']}x {ok} | {r['peak_extra_mib']:.0f} |"
            )
    if not args.skip_large:
        with measured() as record:
            rows = large_part(args.selectors, args.n, args.classes, args.dim, args.timeout)
        records.append(record)
        print(f"\n{args.n:,} samples, {args.classes} classes, {args.dim}-wide features:")
        print("| selector | seconds | peak RSS (GiB) | within 8 GiB |")
        print("| --- | --- | --- | --- |")
        for r in rows:
            peak = r["peak_rss_gib"]
            within = "?" if peak is None else ("yes" if peak <= 8 else "NO")
            secs = "-" if r["seconds"] is None else f"{r['seconds']:.1f}"
            peak_s = "-" if peak is None else f"{peak:.2f}"
            print(f"| {r['selector']} | {secs} | {peak_s} | {within} {r['note']} |")
    print_caveat(records)


if __name__ == "__main__":
    with user_errors():
        main()
