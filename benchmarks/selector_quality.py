"""Subset quality: test accuracy of main training (fixed recipe) on each selector's subset,
beside a random subset of the same size with the same seed (paired difference per seed).

    python benchmarks/selector_quality.py --selectors coverage glister --pretrain jigsaw \
        --seeds 0 1 2 --fractions 0.1 0.05                      # docs/BENCHMARKS.md's quality table
    python benchmarks/selector_quality.py --selectors coverage --pretrain jigsaw \
        --seeds 0 1 2 --fractions 0.1 --reselect-every 5        # against random re-sampled every 5

Selecting once, the stages run as a user would run them separately: `pretrain.py` once per seed
(out/pretrain/seed<k>/pretrain.ckpt, reused by every selector and fraction), `select.py
ckpt_path=...`, then `train.py subset_path=...`. A selector that needs no model (random) runs
`train.py` alone; with the same seed it draws the same subset and trains from the same initial
model as `python train.py selector=random`. With --reselect-every R every run is one
`train.py ... reselect_every=R` (pre-training in-process), random included (re-sampled every R
epochs). Every stage's summary.json lands under --out, finished runs are not repeated (one
that ran with other settings there is refused: pass another --out for them), and the
final table (and --json, rewritten as each run lands: every seed's figures) reports test and
validation accuracy, mean ± std over seeds, and the paired difference against random with the
same seed; after it, a caveat where other work shared the machine while a run trained (as its
summary.json recorded).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from lipt.core.artifacts import write_json
from lipt.run.config import validate
from lipt.stages import pretrain as pretrain_stage
from lipt.stages import select as select_stage
from lipt.stages import train as train_stage
from lipt.stages.result_settings import settled
from lipt.stages.resume import refuse_other_settings

sys.path.insert(0, str(Path(__file__).resolve().parent))  # measure.py, also under runpy
from measure import compose_config, print_caveat, user_errors

SELECTORS = [
    "random",
    "uncertainty",
    "el2n",
    "grand",
    "glister",
    "gradmatch",
    "craig",
    "ccs",
    "coverage",
]
MODEL_FREE = ("random",)
NEW_OUT = "pass another --out for these settings"


def cached(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def finished(config: str, overrides: list[str], out: Path) -> dict | None:
    """The summary.json of the `config` stage that finished in `out` with these overrides;
    None where none finished.

    Raises:
        UserError: the one there ran with other settings (another --epochs, --pretrain or
            --override in the same --out): its figures would stand for this run's.
    """
    summary = cached(out / "summary.json")
    if summary is None:
        return None
    run = validate(compose_config(config, [f"paths.output_dir={out}", *overrides]))
    recorded, now = settled(summary.get("config", {})), settled(run.config)
    refuse_other_settings(f"{out / 'summary.json'} is of a run with", recorded, now, NEW_OUT)
    return summary


def common(args: argparse.Namespace, seed: int) -> list[str]:
    return [
        f"seed={seed}",
        f"pretrain={args.pretrain}",
        f"trainer.max_epochs={args.epochs}",
        "trainer.enable_progress_bar=false",
        "logger=csv",
        *args.override,
    ]


def pretrained(seed: int, args: argparse.Namespace) -> Path:
    """out/pretrain/seed<k>/pretrain.ckpt, pre-trained once per seed."""
    out = Path(args.out) / "pretrain" / f"seed{seed}"
    if finished("pretrain", common(args, seed), out) is None:
        pretrain_stage.run(
            validate(compose_config("pretrain", [f"paths.output_dir={out}", *common(args, seed)]))
        )
    return out / "pretrain.ckpt"


def run_one(selector: str, fraction: float, seed: int, args: argparse.Namespace) -> dict | None:
    tag = selector if not args.reselect_every else f"{selector}_reselect{args.reselect_every}"
    out = Path(args.out) / tag / f"f{fraction}" / f"seed{seed}"
    overrides = [f"selector={selector}", f"fraction={fraction}", *common(args, seed)]
    select_dir = out / "select"
    apart = not args.reselect_every and selector not in MODEL_FREE and args.pretrain != "none"
    if args.reselect_every:
        overrides.append(f"reselect_every={args.reselect_every}")
    train_overrides = (
        [*overrides, f"subset_path={select_dir / 'subset.npz'}"] if apart else overrides
    )
    # Resumable: a finished run is not repeated, but only where it ran with these settings.
    summary = finished("train", train_overrides, out)
    if summary is not None or args.cached_only:
        return summary
    if apart:
        ckpt = pretrained(seed, args)
        select_overrides = [f"ckpt_path={ckpt}", *overrides]
        if finished("select", select_overrides, select_dir) is None:
            select_stage.run(
                validate(
                    compose_config("select", [f"paths.output_dir={select_dir}", *select_overrides])
                )
            )
    return train_stage.run(
        validate(compose_config("train", [f"paths.output_dir={out}", *train_overrides]))
    )


def check_settings(args: argparse.Namespace) -> None:
    """Compose and validate every selector and fraction's run before any of them trains: a bad
    --selectors, --fractions or --override is refused in one line, not after hours of runs."""
    for fraction in args.fractions:
        for selector in args.selectors:
            overrides = [f"selector={selector}", f"fraction={fraction}", *common(args, 0)]
            if args.reselect_every:
                overrides.append(f"reselect_every={args.reselect_every}")
            validate(compose_config("train", ["paths.output_dir=/tmp/lipt-check", *overrides]))


def select_seconds(
    selector: str, fraction: float, seed: int, summary: dict, args: argparse.Namespace
) -> float | None:
    """The selection stage's seconds: select.py's own summary where it ran apart."""
    own = summary["stages"].get("select", {}).get("seconds")
    apart = cached(
        Path(args.out) / selector / f"f{fraction}" / f"seed{seed}" / "select" / "summary.json"
    )
    return apart["stages"]["select"]["seconds"] if apart and own is None else own


def save(args: argparse.Namespace, results: dict) -> None:
    """--json, atomically; also without random (--no-baseline): every seed's figures."""
    if args.json:
        write_json(Path(args.json), {"args": vars(args), "results": results})


def mean_std(values: list[float], sign: str = "") -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):{sign}.2f} ± {std:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--selectors", nargs="+", default=SELECTORS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--fractions", nargs="+", type=float, default=[0.1])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--pretrain", default="none")
    parser.add_argument("--reselect-every", type=int, default=0, help="R (0: select once)")
    parser.add_argument("--out", default="outputs/selector_quality")
    parser.add_argument("--json", default=None, help="write every seed's figures here")
    parser.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides")
    parser.add_argument(
        "--cached-only", action="store_true", help="tabulate finished runs only, run nothing"
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="run only --selectors (e.g. while random runs elsewhere); no table without random",
    )
    args = parser.parse_args()
    if "random" not in args.selectors and not args.no_baseline:
        args.selectors = ["random", *args.selectors]  # the baseline every table shows
    check_settings(args)

    results: dict[str, dict[str, dict[int, dict[str, float | None]]]] = {}
    summaries = []  # each run's summary.json: the machine and how busy it was
    for fraction in args.fractions:
        for selector in args.selectors:
            for seed in args.seeds:
                start = time.perf_counter()
                summary = run_one(selector, fraction, seed, args)
                if summary is None:  # --cached-only and not run yet
                    continue
                summaries.append(summary)
                val = summary.get("val_accuracy")
                row = {
                    "test": 100 * summary["test_accuracy"],
                    "val": None if val is None else 100 * val,
                    "train_seconds": summary["stages"]["train"]["seconds"],
                    "select_seconds": select_seconds(selector, fraction, seed, summary, args),
                }
                results.setdefault(selector, {}).setdefault(str(fraction), {})[seed] = row
                print(
                    json.dumps(
                        {
                            "selector": selector,
                            "fraction": fraction,
                            "seed": seed,
                            **row,
                            "wall_s": round(time.perf_counter() - start, 1),
                        }
                    ),
                    flush=True,
                )
                save(args, results)  # as each run lands: a stopped benchmark keeps its figures
    save(args, results)  # also where no run landed (--cached-only before any finished)
    if "random" not in results:
        return
    mode = (
        f"re-selected every {args.reselect_every} epochs"
        if args.reselect_every
        else "selected once"
    )
    print(f"\npretrain={args.pretrain}, {args.epochs} epochs, seeds {args.seeds}, {mode}")
    print(
        "| selector | fraction | test acc. (%) | paired diff. vs random (points) | per seed "
        "(diff.) | val acc. (%) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for fraction in args.fractions:
        base = results["random"][str(fraction)]
        for selector in args.selectors:
            runs = results.get(selector, {}).get(str(fraction), {})
            seeds = sorted(s for s in runs if s in base)  # paired: both runs finished
            if not seeds:
                continue
            tests = [runs[s]["test"] for s in seeds]
            diffs = [runs[s]["test"] - base[s]["test"] for s in seeds]  # type: ignore[operator]
            vals = [v for s in seeds if (v := runs[s]["val"]) is not None]
            per_seed = ", ".join(f"s{s} {d:+.2f}" for s, d in zip(seeds, diffs, strict=True))
            print(
                f"| {selector} | {fraction} | {mean_std(tests)} | {mean_std(diffs, '+')} "
                f"| {per_seed} | {mean_std(vals) if vals else '-'} |"
            )
    print_caveat(summaries)


if __name__ == "__main__":
    with user_errors():
        main()
