"""Subset quality: test accuracy of main training (fixed recipe) on each selector's subset,
beside a random subset of the same size with the same seeds.

    python benchmarks/selector_quality.py                        # Fashion-MNIST, convnet, 10%
    python benchmarks/selector_quality.py --pretrain jigsaw --seeds 0 1 2 --epochs 15

Every run is a real `lipt.train.run` (pre-train, select, train, test); its summary.json lands in
--out/<selector>/seed<k>/, so `python -m lipt.report <out>` can tabulate them again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from lipt import train as train_stage

ROOT = Path(__file__).resolve().parents[1]
SELECTORS = ["random", "uncertainty", "el2n", "grand", "glister", "gradmatch", "craig", "ccs"]


def run_one(selector: str, seed: int, args: argparse.Namespace) -> dict:
    out = Path(args.out) / selector / f"seed{seed}"
    summary_path = out / "summary.json"
    if summary_path.is_file():  # resumable: finished runs are not repeated
        return json.loads(summary_path.read_text())
    overrides = [
        f"paths.output_dir={out}",
        f"selector={selector}",
        f"pretrain={args.pretrain}",
        f"fraction={args.fraction}",
        f"seed={seed}",
        f"trainer.max_epochs={args.epochs}",
        "trainer.enable_progress_bar=false",
        "logger=csv",
        *args.override,
    ]
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    return train_stage.run(cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--selectors", nargs="+", default=SELECTORS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--pretrain", default="none")
    parser.add_argument("--out", default="outputs/selector_quality")
    parser.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides")
    args = parser.parse_args()
    if "random" not in args.selectors:
        args.selectors = ["random", *args.selectors]  # the baseline every table shows

    rows = []
    for selector in args.selectors:
        accuracies, seconds = [], []
        for seed in args.seeds:
            start = time.perf_counter()
            summary = run_one(selector, seed, args)
            accuracies.append(100 * summary["test_accuracy"])
            seconds.append(sum(s["seconds"] for s in summary["stages"].values()))
            print(
                json.dumps(
                    {
                        "selector": selector,
                        "seed": seed,
                        "acc": accuracies[-1],
                        "wall_s": time.perf_counter() - start,
                    }
                ),
                flush=True,
            )
        rows.append((selector, accuracies, statistics.mean(seconds)))

    random_mean = statistics.mean(rows[0][1])
    print(
        f"\npretrain={args.pretrain}, fraction={args.fraction}, {args.epochs} epochs, "
        f"seeds {args.seeds}"
    )
    print("| selector | test accuracy (%) | vs random (points) | stage seconds |")
    print("| --- | --- | --- | --- |")
    for selector, accs, secs in rows:
        std = statistics.stdev(accs) if len(accs) > 1 else 0.0
        delta = statistics.mean(accs) - random_mean
        print(
            f"| {selector} | {statistics.mean(accs):.2f} ± {std:.2f} | {delta:+.2f} | {secs:.0f} |"
        )


if __name__ == "__main__":
    main()
