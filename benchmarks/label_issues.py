"""Label-issue detection: precision and recall against the labels known to be wrong, beside the
seconds finding them took, for lipt's finder (clean=lipt: the jigsaw soup, then cleanlab) and
cleanlab's own recipe (clean=cleanlab: 5 folds of one epoch) and the plain cheap alternative
(clean=warmup: one model for half an epoch, its own probabilities), measured side by side in
one run, on the same noisy pool, seed by seed.

    python benchmarks/label_issues.py --seeds 0 1 2 --core 0 --json label_issues.json
    python benchmarks/label_issues.py --noise symmetric:0.4 --seeds 0 \
        --methods lipt lipt:members=soup lipt:members=ensemble      # what lipt's members give

A method is a `clean` option and its overrides (`lipt:members=soup`, `lipt:pretrain.local_epochs=
1`: keys without a dot are clean.*); a noise is kind:rate, drawn with --noise-seed (the test
split is untouched; only the training pool is scored). Each row runs the `clean` stage alone
(lipt.stages.clean.find_scored_issues): data loading and main training are not timed. Detection
seconds include the pre-training lipt's finder needs; pool-epochs trained are the samples the
fold models or the jigsaw learners trained on, over the pool's size (not timed, so not
inflated by a busy machine). Prints mean ± std over seeds, each
method's seconds as a share of cleanlab's measured on the same seeds, and the busy-machine
caveat; --json keeps every row as it lands and resumes a killed run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # measure.py, also under runpy
from measure import ResultFile, compose_config, host_line, log, pinned, print_caveat, user_errors

# The noise the targets are judged on: not the 40% the frontier and the tests use.
NOISE = ["symmetric:0.3", "pairs:0.25"]
METHODS = ["lipt", "cleanlab", "warmup"]
BASELINE = "cleanlab"


def overrides_of(method: str) -> list[str]:
    """`lipt:members=soup,pretrain.local_epochs=1` -> clean=lipt clean.members=soup ..."""
    name, _, extra = method.partition(":")
    keys = [k for k in extra.split(",") if k]
    return [f"clean={name}", *(k if "." in k.split("=")[0] else f"clean.{k}" for k in keys)]


def config_of(
    method: str, noise: str, noise_seed: int, seed: int, out: Path, extra: list[str]
) -> Any:
    """The validated `clean` run of `method` on `noise`.

    Raises:
        UserError: a noise that is not kind:rate, or a setting lipt refuses.
    """
    from lipt.core.errors import UserError
    from lipt.run.config import validate

    kind, sep, rate = noise.partition(":")
    if not sep or not kind or not rate:
        raise UserError(f"--noise {noise!r}: give kind:rate, e.g. symmetric:0.3 or pairs:0.25")
    cfg = compose_config(
        "select",
        [
            f"paths.output_dir={out}",
            f"seed={seed}",
            f"dataset.label_noise.kind={kind}",
            f"dataset.label_noise.rate={rate}",
            f"dataset.label_noise.seed={noise_seed}",
            "trainer.enable_progress_bar=false",
            *extra,
            *overrides_of(method),
        ],
    )
    return validate(cfg)


def detect(
    method: str, noise: str, noise_seed: int, seed: int, out: Path, extra: list[str]
) -> dict[str, Any]:
    import shutil

    from lipt.stages.build import build_parts
    from lipt.stages.clean import find_scored_issues

    shutil.rmtree(out, ignore_errors=True)  # saved jigsaw learners would be reused, not timed
    run = config_of(method, noise, noise_seed, seed, out, extra)
    parts = build_parts(run)
    assert parts.cleaning is not None
    cleaned, _ = find_scored_issues(run, parts, parts.cleaning)
    # Training cost in passes over the pool: the fold models' samples, or the jigsaw learners'.
    trained = cleaned.stats["samples"] + (cleaned.pretrain_stats or {}).get("samples", 0)
    pool_epochs = trained / cleaned.stats["pool"]
    # The row's method is the benchmark's (`lipt:members=soup`), not stats' finder name (`lipt`):
    # the table groups and a resumed run finds rows by it.
    stats = {k: v for k, v in cleaned.stats.items() if k != "method"}
    return {"method": method, "noise": noise, "seed": seed, **stats, "pool_epochs": pool_epochs}


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {std:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", nargs="+", default=NOISE, help="kind:rate, e.g. pairs:0.25")
    parser.add_argument("--noise-seed", type=int, default=11)
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's)")
    parser.add_argument("--core", type=int, default=None, help="pin to this core")
    parser.add_argument("--out", type=Path, default=Path("multirun/label_issues"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--set", nargs="*", default=[], help="more overrides, e.g. dataset=...")
    args = parser.parse_args()
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "json", "core")}
    for noise in args.noise:  # every run's settings checked before the first one is measured
        for method in args.methods:
            config_of(method, noise, args.noise_seed, 0, args.out, args.set)
    results = ResultFile(args.json, settings)
    # Imported before any row is timed: every finder calls cleanlab, and the first row
    # measured would pay its import (about a second) in its detection seconds alone.
    import cleanlab.filter  # noqa: F401

    rows = []
    with pinned(args.threads, args.core):
        print(host_line(), flush=True)
        for noise in args.noise:
            for seed in args.seeds:
                for method in args.methods:
                    key = {"method": method, "noise": noise, "seed": seed}
                    log(f"{method} on {noise}, seed {seed}")
                    label = f"{noise}_{method}_{seed}"
                    folder = args.out / "".join(
                        c if c.isalnum() or c in "._" else "-" for c in label
                    )
                    rows.append(
                        results.measure(
                            key, detect, method, noise, args.noise_seed, seed, folder, args.set
                        )
                    )
    print(
        "\n| noise | method | flagged | pool-epochs trained | precision | recall | detection s "
        "| s / cleanlab's |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for noise in args.noise:
        base = {
            r["seed"]: r["detection_seconds"]
            for r in rows
            if r["noise"] == noise and r["method"] == BASELINE
        }
        for method in args.methods:
            mine = [r for r in rows if r["noise"] == noise and r["method"] == method]
            ratio = [r["detection_seconds"] / base[r["seed"]] for r in mine if r["seed"] in base]
            epochs = [r["pool_epochs"] for r in mine if "pool_epochs" in r]  # older rows lack it
            print(
                f"| {noise} | {method} | {statistics.mean(r['flagged'] for r in mine):.0f} | "
                + (f"{statistics.mean(epochs):.2f}" if epochs else "")
                + " | "
                f"{mean_std([r['precision'] for r in mine])} | "
                f"{mean_std([r['recall'] for r in mine])} | "
                f"{mean_std([r['detection_seconds'] for r in mine])} | "
                + (mean_std(ratio) if ratio else "")
                + " |"
            )
    print_caveat(rows)


if __name__ == "__main__":
    with user_errors():
        main()
