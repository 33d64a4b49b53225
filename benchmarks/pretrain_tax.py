"""The pre-training tax: LiPT's jigsaw learners against the classic full warm-up.

Fashion-MNIST with `convnet`, in one process, through lipt's own stage functions
(`pretrain_model`, `choose_subset`, then main training by `lipt.train.run` on the saved subset):

1. one run (the first seed): wall time and training samples of `pretrain=jigsaw` (its defaults:
   n=10, M=1, K=10, greedy interpolation soup) and of `pretrain=full` with E epochs;
2. for each seed: test accuracy after main training on a `fraction` (10%) subset chosen by the
   selector (GLISTER) with the model of `none`, `full` and `jigsaw`, plus a random subset
   beside them; mean and std over the seeds.

It prints a Markdown table with the full/jigsaw ratios of wall time and samples (LiPT, Ro et al.
ICML 2023, https://proceedings.mlr.press/v202/ro23a.html, reports 15.4x less pre-training time).

    python benchmarks/pretrain_tax.py                  # 3 seeds, E=10, the main-training default
    python benchmarks/pretrain_tax.py --seeds 1 --full-epochs 1 --main-epochs 2 \
        --threads 1 --jigsaw merge.eval_size=1000      # reduced: about 10 min on 2 CPU cores

On a CPU the jigsaw stage's cost is mostly its merge: every learner and distinct candidate soup
is scored on the validation split (46 evaluations for n=10 and 5 ratios), which `--jigsaw
merge.eval_size=...` or `--jigsaw merge=greedy` shrinks; the table shows the merge time apart.

    python benchmarks/pretrain_tax.py --seeds 1 --threads 1 --tax-only   # pre-training alone
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("none", "full", "jigsaw")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..S-1 (default 3)")
    p.add_argument("--full-epochs", type=int, default=10, help="E of pretrain=full (default 10)")
    p.add_argument(
        "--main-epochs", type=int, default=None, help="main-training epochs (default: config)"
    )
    p.add_argument("--fraction", type=float, default=0.1, help="subset fraction (default 0.1)")
    p.add_argument("--selector", default="glister", help="selector config (default glister)")
    p.add_argument(
        "--dataset", default="fashion_mnist", help="dataset config (default fashion_mnist)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--jigsaw",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra override for the jigsaw run only, e.g. merge.eval_size=1000 (repeatable)",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra override for every run, e.g. dataset.data_dir=... (repeatable)",
    )
    p.add_argument(
        "--tax-only",
        action="store_true",
        help="pre-training only (wall time, samples, soup held-out accuracy): no selection or "
        "main training, so no test accuracy",
    )
    p.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help=f"comma-separated pre-training strategies to run (default {','.join(STRATEGIES)})",
    )
    p.add_argument("--out", type=Path, default=None, help="where runs write (default: a tmp dir)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    return p.parse_args(argv)


def compose(overrides: Sequence[str], out: Path) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lipt.config import validate

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = hydra_compose("train", overrides=[*overrides, f"paths.output_dir={out}"])
    validate(cfg)
    return cfg


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_strategy(
    args: argparse.Namespace, base: list[str], name: str, seed: int, out: Path, dm: Any
) -> dict[str, Any]:
    """Pre-train with `name`, select with its model, train on the subset; returns the costs
    and the test accuracy."""
    from lipt.artifacts import save_subset
    from lipt.pretrain import pretrain_model
    from lipt.select import choose_subset, subset_meta
    from lipt.train import run as train_run

    extra = {"full": [f"pretrain.epochs={args.full_epochs}"], "jigsaw": args.jigsaw}
    run_dir = out / f"{name}_seed{seed}"
    overrides = [*base, f"pretrain={name}", f"seed={seed}", *extra.get(name, [])]
    cfg = compose(overrides, run_dir)
    log(f"{name} seed {seed}: pre-training")
    result = pretrain_model(cfg, dm, seed)
    row: dict[str, Any] = {"strategy": name, "seed": seed, **result.stats()}
    if result.report:
        row["merge_seconds"] = result.report.get("merge_seconds")
        row["soup_val_accuracy"] = result.report.get("soup_accuracy")
    log(f"{name} seed {seed}: {result.stats()}")
    if args.tax_only:
        return row
    start = time.perf_counter()
    indices, weights = choose_subset(cfg, dm, [result.model], seed)
    row["select_seconds"] = round(time.perf_counter() - start, 3)
    subset = run_dir / "subset.npz"
    save_subset(subset, indices, weights, subset_meta(cfg, dm))
    log(f"{name} seed {seed}: main training on {len(indices)} samples")
    summary = train_run(compose([*overrides, f"subset_path={subset}"], run_dir))
    row["test_accuracy"] = summary["test_accuracy"]
    row["train_seconds"] = summary["stages"]["train"]["seconds"]
    log(f"{name} seed {seed}: test accuracy {summary['test_accuracy']:.4f}")
    return row


def run_random(base: list[str], seed: int, out: Path) -> dict[str, Any]:
    from lipt.train import run as train_run

    run_dir = out / f"random_seed{seed}"
    overrides = [*base, "pretrain=none", "selector=random", f"seed={seed}"]
    log(f"random seed {seed}: main training")
    summary = train_run(compose(overrides, run_dir))
    return {"strategy": "random", "seed": seed, "test_accuracy": summary["test_accuracy"]}


def mean_std(values: Sequence[float]) -> str:
    if not values:
        return "-"
    mean = 100 * statistics.fmean(values)
    std = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {std:.2f}"


def table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    first = {r["strategy"]: r for r in rows if r["seed"] == 0}
    acc = {
        name: [r["test_accuracy"] for r in rows if r["strategy"] == name and "test_accuracy" in r]
        for name in (*STRATEGIES, "random")
    }
    jig_extra = f", {' '.join(args.jigsaw)}" if args.jigsaw else ""
    labels = {
        "none": "none (untrained init)",
        "full": f"full (E={args.full_epochs})",
        "jigsaw": f"jigsaw (defaults{jig_extra})",
    }
    pct = round(100 * args.fraction)
    lines = [
        f"| pre-training | wall time (s) | of which merge (s) | training samples | unique samples "
        f"| test acc. %, {args.selector} {pct}% (mean ± std, {args.seeds} seeds) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in (s for s in STRATEGIES if s in first):
        r = first[name]
        merge = r.get("merge_seconds")
        lines.append(
            f"| {labels[name]} | {r['seconds']:.1f} | {'-' if merge is None else f'{merge:.1f}'} "
            f"| {r['samples']:,} | {r['unique_samples']:,} | {mean_std(acc[name])} |"
        )
    lines.append(f"| random {pct}% subset (no model) | - | - | - | - | {mean_std(acc['random'])} |")
    if "full" not in first or "jigsaw" not in first:
        return "\n".join(lines)
    full, jig = first["full"], first["jigsaw"]
    soup = jig.get("soup_val_accuracy")
    lines += [
        "",
        f"full / jigsaw: wall time {full['seconds'] / max(jig['seconds'], 1e-9):.2f}x, "
        f"training samples {full['samples'] / max(jig['samples'], 1):.1f}x, "
        f"unique samples {full['unique_samples'] / max(jig['unique_samples'], 1):.1f}x "
        f"(wall time without the merge: "
        f"{full['seconds'] / max(jig['seconds'] - (jig.get('merge_seconds') or 0), 1e-9):.2f}x)"
        + ("" if soup is None else f"; soup held-out accuracy {100 * soup:.2f}%"),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if unknown := sorted(set(strategies) - set(STRATEGIES)):
        sys.exit(f"error: unknown --strategies {unknown}; choose from {', '.join(STRATEGIES)}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not (ROOT / "configs" / "selector" / f"{args.selector}.yaml").is_file():
        sys.exit(f"error: no configs/selector/{args.selector}.yaml; pass --selector random")
    from lipt.build import build_datamodule

    base = [
        f"dataset={args.dataset}",
        "model=convnet",
        "logger=none",
        "trainer.enable_progress_bar=false",
        f"fraction={args.fraction}",
        f"selector={args.selector}",
        *([f"trainer.max_epochs={args.main_epochs}"] if args.main_epochs else []),
        *args.override,
    ]
    with tempfile.TemporaryDirectory(prefix="pretrain_tax_") as tmp:
        out = args.out or Path(tmp)
        dm = build_datamodule(compose(base, out))  # one pool and split for every run
        rows = []
        for seed in range(args.seeds):
            rows += [run_strategy(args, base, name, seed, out, dm) for name in strategies]
            if not args.tax_only:
                rows.append(run_random(base, seed, out))
    report = table(args, rows)
    print(report)
    if args.json is not None:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"args": settings, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
