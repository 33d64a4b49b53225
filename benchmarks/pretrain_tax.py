"""The pre-training tax: LiPT's jigsaw learners against the classic full warm-up.

Fashion-MNIST with `convnet`, in one process, through lipt's own stage functions
(`pretrain_model`, `choose_subset`, then main training by `lipt.stages.train.run` on the saved
subset):

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

On a CPU a large share of the jigsaw stage's cost is its merge: every learner and distinct
candidate soup is scored on the validation split (about 23 evaluations for n=10 and 5 ratios
with the default `merge.search=scan`, 47 with `grid`); the table shows the merge time apart.

    python benchmarks/pretrain_tax.py --seeds 1 --threads 1 --tax-only   # pre-training alone

Merge variants side by side (`--variant LABEL:OVERRIDES`, repeatable; OVERRIDES space-separated,
empty for the defaults): the jigsaw stage runs once per variant and seed, and the pre-training
table gives each one's wall time, learner and merge seconds, held-out evaluations, the full /
jigsaw ratio (against the full warm-up of the same seed), and the soup's accuracy on the merge's
own eval set (which the search maximises, hence biased) and on the validation images no
variant's merge saw (independent). `--full-seeds 1` runs the full warm-up on the first seed only.

    python benchmarks/pretrain_tax.py --tax-only --seeds 3 --full-seeds 1 --threads 1 \
        --variant "grid:merge.search=grid" --variant "scan:merge.search=scan"
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
        "--variant",
        action="append",
        default=[],
        metavar="LABEL:OVERRIDES",
        help='a jigsaw variant, e.g. "scan:merge.search=scan merge.bn_batches=1" (repeatable; '
        "each runs on every seed, after --jigsaw's overrides)",
    )
    p.add_argument(
        "--full-seeds",
        type=int,
        default=None,
        help="run pretrain=full on the first N seeds only (default: every seed)",
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

    from lipt.run.config import validate

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = hydra_compose("train", overrides=[*overrides, f"paths.output_dir={out}"])
    validate(cfg)
    return cfg


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_variants(args: argparse.Namespace) -> dict[str, list[str]]:
    """Label -> the jigsaw overrides of each `--variant` (one unlabelled run without any)."""
    variants: dict[str, list[str]] = {}
    for spec in args.variant:
        label, sep, overrides = spec.partition(":")
        if not sep or not label.strip() or label.strip() in variants:
            sys.exit(f"error: --variant {spec!r}: give a new LABEL:OVERRIDES")
        variants[label.strip()] = overrides.split()
    return variants or {"": []}


def independent_positions(dm: Any, seed: int, eval_sizes: Sequence[int | None]) -> Any:
    """Validation positions outside every variant's merge eval set (None: a variant scores on
    the whole split, so none are left). Each eval set is a prefix of one seeded permutation."""
    from lipt.jigsaw.merge import eval_positions

    if any(size is None for size in eval_sizes):
        return None
    seen = eval_positions(max(int(s) for s in eval_sizes if s is not None), dm, seed)  # type: ignore[arg-type]
    keep = ~torch.isin(dm.val_indices, seen)
    return dm.val_indices[keep] if bool(keep.any()) else None


def accuracy_on(model: Any, dm: Any, positions: Any) -> float:
    """Top-1 accuracy of `model` on training-split `positions`, un-augmented."""
    from lipt.data import IndexedImages
    from lipt.selection import model_outputs

    loader = dm.loader(IndexedImages(dm.train_source, positions, dm.eval_transform()), False)
    outputs = model_outputs(model, loader)  # eval mode, train flags restored after
    return float((outputs.logits.argmax(dim=1) == outputs.targets).float().mean())


def run_strategy(
    args: argparse.Namespace,
    base: list[str],
    name: str,
    seed: int,
    out: Path,
    dm: Any,
    variant: tuple[str, list[str]] = ("", []),
    independent: Any = None,
) -> dict[str, Any]:
    """Pre-train with `name` (a jigsaw `variant`: its label and overrides), select with its
    model, train on the subset; returns the costs and the test accuracy."""
    from lipt.run.artifacts import save_subset
    from lipt.run.config import run_of, validate
    from lipt.stages.pretrain import pretrain_model
    from lipt.stages.select import choose_subset, subset_meta
    from lipt.stages.train import run as train_run

    label, variant_overrides = variant
    extra = {
        "full": [f"pretrain.epochs={args.full_epochs}"],
        "jigsaw": [*args.jigsaw, *variant_overrides],
    }
    tag = f"{name}_{label}" if label else name
    run_dir = out / f"{tag}_seed{seed}"
    overrides = [*base, f"pretrain={name}", f"seed={seed}", *extra.get(name, [])]
    run = run_of(compose(overrides, run_dir))
    log(f"{tag} seed {seed}: pre-training")
    result = pretrain_model(run, dm, seed)
    row: dict[str, Any] = {"strategy": name, "variant": label, "seed": seed, **result.stats()}
    if result.report:
        row["merge_seconds"] = result.report.get("merge_seconds")
        row["soup_val_accuracy"] = result.report.get("soup_accuracy")
        row["evaluations"] = result.report.get("evaluations")
        row["eval_forward_samples"] = result.report.get("eval_forward_samples")
        row["kept"] = result.report.get("kept")
        row["ratios"] = result.report.get("ratios")
    if independent is not None:
        # After the timed stage: the soup as selection uses it, on images its merge never saw.
        row["independent_val_accuracy"] = accuracy_on(result.model, dm, independent)
        row["independent_size"] = len(independent)
    log(f"{tag} seed {seed}: {result.stats()} {row.get('independent_val_accuracy')}")
    if args.tax_only:
        return row
    start = time.perf_counter()
    indices, weights = choose_subset(run, dm, [result.model], seed)
    row["select_seconds"] = round(time.perf_counter() - start, 3)
    subset = run_dir / "subset.npz"
    save_subset(subset, indices, weights, subset_meta(run, dm))
    log(f"{name} seed {seed}: main training on {len(indices)} samples")
    summary = train_run(validate(compose([*overrides, f"subset_path={subset}"], run_dir)))
    row["test_accuracy"] = summary["test_accuracy"]
    row["train_seconds"] = summary["stages"]["train"]["seconds"]
    log(f"{name} seed {seed}: test accuracy {summary['test_accuracy']:.4f}")
    return row


def run_random(base: list[str], seed: int, out: Path) -> dict[str, Any]:
    from lipt.run.config import validate
    from lipt.stages.train import run as train_run

    run_dir = out / f"random_seed{seed}"
    overrides = [*base, "pretrain=none", "selector=random", f"seed={seed}"]
    log(f"random seed {seed}: main training")
    summary = train_run(validate(compose(overrides, run_dir)))
    return {"strategy": "random", "seed": seed, "test_accuracy": summary["test_accuracy"]}


def mean_std(values: Sequence[float]) -> str:
    if not values:
        return "-"
    mean = 100 * statistics.fmean(values)
    std = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {std:.2f}"


def pct_mean_std(values: Sequence[float | None]) -> str:
    return mean_std([v for v in values if v is not None])


def tax_table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    """Pre-training alone, one line per strategy and variant, means over the seeds; the ratio
    is full / run for each seed that ran the full warm-up, then averaged."""
    full = {r["seed"]: r["seconds"] for r in rows if r["strategy"] == "full"}
    lines = [
        "| pre-training | seeds | wall time (s) | learners (s) | merge (s) | evaluations "
        f"| full / run (seeds {sorted(full) or '-'}) | soup acc. on merge eval set % "
        "| soup acc. independent % |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = list(dict.fromkeys((r["strategy"], r.get("variant", "")) for r in rows))
    for name, label in keys:
        group = [r for r in rows if r["strategy"] == name and r.get("variant", "") == label]

        def avg(field: str, group: list[dict[str, Any]] = group) -> str:
            values = [r[field] for r in group if r.get(field) is not None]
            return f"{statistics.fmean(values):.1f}" if values else "-"

        ratios = [full[r["seed"]] / r["seconds"] for r in group if r["seed"] in full]
        pretrained = name not in ("full", "none")  # a jigsaw row: what the ratio is about
        ratio = f"{statistics.fmean(ratios):.1f}x" if ratios and pretrained else "-"
        title = {"full": f"full (E={args.full_epochs})"}.get(name, name)
        lines.append(
            f"| {title}{f' [{label}]' if label else ''} | {len(group)} | {avg('seconds')} "
            f"| {avg('learner_seconds')} | {avg('merge_seconds')} | {avg('evaluations')} "
            f"| {ratio} | {pct_mean_std([r.get('soup_val_accuracy') for r in group])} "
            f"| {pct_mean_std([r.get('independent_val_accuracy') for r in group])} |"
        )
    sizes = sorted({r["independent_size"] for r in rows if "independent_size" in r})
    lines.append(
        f"\nindependent: the soup's (or model's) top-1 on the {sizes or '-'} validation images "
        "outside every variant's merge eval set; accuracies mean ± std over seeds"
    )
    return "\n".join(lines)


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
    from lipt.run.build import build_datamodule
    from lipt.run.config import run_of

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
        dm = build_datamodule(run_of(compose(base, out)))  # one pool and split for every run
        variants = parse_variants(args)
        eval_sizes = [
            compose([*base, "pretrain=jigsaw", *args.jigsaw, *extra], out).merge.eval_size
            for extra in variants.values()
        ]
        rows = []
        for seed in range(args.seeds):
            independent = independent_positions(dm, seed, eval_sizes)
            for name in strategies:
                if name == "full" and args.full_seeds is not None and seed >= args.full_seeds:
                    continue
                runs = variants.items() if name == "jigsaw" else [("", [])]
                for variant in runs:
                    rows.append(run_strategy(args, base, name, seed, out, dm, variant, independent))
                    save_rows(args, rows)  # as it goes: a long run stopped early keeps its rows
            if not args.tax_only:
                rows.append(run_random(base, seed, out))
    report = tax_table(args, rows) if args.tax_only else table(args, rows)
    print(report)
    save_rows(args, rows)


def save_rows(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    if args.json is not None:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"args": settings, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
