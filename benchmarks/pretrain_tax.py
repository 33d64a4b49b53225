"""The pre-training tax: LiPT's jigsaw learners against the classic full warm-up.

Fashion-MNIST with `convnet`, in one process, through lipt's stage functions (`pretrain_model`,
`choose_subset`, then `lipt.stages.train.run` on the saved subset): on the first seed, the wall
time and training samples of `pretrain=jigsaw` (its defaults: n=10, M=1, K=10, greedy
interpolation soup) and of `pretrain=full` with E epochs; on each seed, the test accuracy after
main training on a `fraction` (10%) subset chosen by the selector (GLISTER) with the model of
`none`, `full` and `jigsaw`, beside a random subset (mean and std over the seeds). A Markdown
table gives the full / jigsaw ratios (LiPT, Ro et al. ICML 2023, reports 15.4x less pre-training
time) and the merge's seconds apart: on a CPU, scoring every learner and candidate soup on the
validation split is a large share of the jigsaw stage (about 23 evaluations with `scan`).

    python benchmarks/pretrain_tax.py                  # 3 seeds, E=10, the main-training default
    python benchmarks/pretrain_tax.py --seeds 1 --full-epochs 1 --main-epochs 2 \
        --threads 1 --jigsaw merge.eval_size=1000      # reduced: about 10 min on 2 CPU cores
    python benchmarks/pretrain_tax.py --seeds 1 --threads 1 --tax-only   # pre-training alone

`--variant LABEL:OVERRIDES` (repeatable; OVERRIDES space-separated, empty for the defaults) runs
the jigsaw stage once per variant and seed; the pre-training table gives each one's wall time,
learner and merge seconds, evaluations, full / jigsaw ratio (same seed), and the soup's accuracy
on the merge's own eval set (the search maximises it: biased) and on the validation images no
variant's merge saw (independent). `--full-seeds 1`: the full warm-up on the first seed only.

    python benchmarks/pretrain_tax.py --tax-only --seeds 3 --full-seeds 1 --threads 1 \
        --variant "grid:merge.search=grid" --variant "scan:merge.search=scan"

`--json` gets every row as it lands, with the machine and how busy it was; a re-run with the
same arguments measures only the rows missing there. `--core C --threads 1` pins the run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # measure.py, also under runpy
from measure import (
    ROOT,
    ResultFile,
    compose_config,
    host_line,
    log,
    pinned,
    print_caveat,
    user_errors,
)

STRATEGIES = ("none", "full", "jigsaw")
MERGE_FIELDS = {k: k for k in ("merge_seconds", "evaluations", "eval_forward_samples", "kept")}
MERGE_FIELDS |= {"soup_val_accuracy": "soup_accuracy", "ratios": "ratios"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = p.add_argument
    add("--seeds", type=int, default=3, help="seeds 0..S-1 (default 3)")
    add("--full-epochs", type=int, default=10, help="E of pretrain=full (default 10)")
    add("--main-epochs", type=int, default=None, help="main-training epochs (default: config)")
    add("--fraction", type=float, default=0.1, help="subset fraction (default 0.1)")
    add("--selector", default="glister", help="selector config (default glister)")
    add("--dataset", default="fashion_mnist", help="dataset config (default fashion_mnist)")
    add("--threads", type=int, default=None, help="torch threads (default: torch's)")
    add("--core", type=int, default=None, help="run on this core alone (default: any)")
    repeat: dict[str, Any] = {"action": "append", "default": []}  # argparse copies the list
    add("--jigsaw", **repeat, metavar="KEY=VALUE", help="override of the jigsaw runs only")
    add("--variant", **repeat, metavar="LABEL:OVERRIDES", help="a jigsaw variant (see above)")
    add("--full-seeds", type=int, default=None, help="pretrain=full on the first N seeds only")
    add("--override", **repeat, metavar="KEY=VALUE", help="override of every run")
    add("--tax-only", action="store_true", help="pre-training alone: no selection or training")
    add("--strategies", default=",".join(STRATEGIES), help="pre-training to run (%(default)s)")
    add("--out", type=Path, default=None, help="where runs write (default: a tmp dir)")
    add("--json", type=Path, default=None, help="the rows, as each lands (and resumed from)")
    return p.parse_args(argv)


def validated(overrides: Sequence[str], out: Path) -> Any:
    """The Run of train's config with `overrides`, writing to `out`, once every check passes."""
    from lipt.run.config import validate

    return validate(compose_config("train", [*overrides, f"paths.output_dir={out}"]))


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
    from lipt.core.artifacts import save_subset
    from lipt.data import IndexedImages
    from lipt.selection import model_outputs
    from lipt.stages.build import build_parts
    from lipt.stages.pretrain import pretrain_model
    from lipt.stages.select import choose_subset, subset_meta
    from lipt.stages.train import run as train_run

    label, variant_overrides = variant
    extra = {"full": [f"pretrain.epochs={args.full_epochs}"], "jigsaw": args.jigsaw}
    tag = f"{name}_{label}" if label else name
    run_dir = out / f"{tag}_seed{seed}"
    overrides = [*base, f"pretrain={name}", f"seed={seed}", *extra.get(name, [])]
    overrides += variant_overrides if name == "jigsaw" else []
    run = validated(overrides, run_dir)
    log(f"{tag} seed {seed}: pre-training")
    parts = build_parts(run, dm)
    result = pretrain_model(parts, seed)
    row: dict[str, Any] = {"strategy": name, "variant": label, "seed": seed, **result.stats()}
    if result.report:  # the merge's (jigsaw): row field <- report field
        row.update({field: result.report.get(key) for field, key in MERGE_FIELDS.items()})
    if independent is not None:
        # After the timed stage: the soup as selection uses it, un-augmented, on images its
        # merge never saw (model_outputs: eval mode, train flags restored after).
        images = IndexedImages(dm.train_source, independent, dm.eval_transform())
        outputs = model_outputs(result.model, dm.loader(images, False))
        hits = (outputs.logits.argmax(dim=1) == outputs.targets).float()
        row["independent_val_accuracy"] = float(hits.mean())
        row["independent_size"] = len(independent)
    log(f"{tag} seed {seed}: {result.stats()} {row.get('independent_val_accuracy')}")
    if args.tax_only:
        return row
    start = time.perf_counter()
    indices, weights = choose_subset(run, parts, [result.model], seed)
    row["select_seconds"] = round(time.perf_counter() - start, 3)
    subset = run_dir / "subset.npz"
    save_subset(subset, indices, weights, subset_meta(run, dm))
    log(f"{name} seed {seed}: main training on {len(indices)} samples")
    summary = train_run(validated([*overrides, f"subset_path={subset}"], run_dir))
    row["test_accuracy"] = summary["test_accuracy"]
    row["train_seconds"] = summary["stages"]["train"]["seconds"]
    log(f"{name} seed {seed}: test accuracy {summary['test_accuracy']:.4f}")
    return row


def run_random(base: list[str], seed: int, out: Path) -> dict[str, Any]:
    from lipt.stages.train import run as train_run

    run_dir = out / f"random_seed{seed}"
    overrides = [*base, "pretrain=none", "selector=random", f"seed={seed}"]
    log(f"random seed {seed}: main training")
    summary = train_run(validated(overrides, run_dir))
    return {"strategy": "random", "seed": seed, "test_accuracy": summary["test_accuracy"]}


def mean_std(accuracies: Sequence[float | None]) -> str:
    """Mean ± std in percent of the accuracies measured (None: not measured)."""
    values = [v for v in accuracies if v is not None]
    if not values:
        return "-"
    mean = 100 * statistics.fmean(values)
    std = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {std:.2f}"


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
        if len(ratios) > 1 and pretrained:  # each seed's, as the mean hides a seed below it
            ratio += f" ({', '.join(f'{v:.1f}' for v in ratios)})"
        title = {"full": f"full (E={args.full_epochs})"}.get(name, name)
        lines.append(
            f"| {title}{f' [{label}]' if label else ''} | {len(group)} | {avg('seconds')} "
            f"| {avg('learner_seconds')} | {avg('merge_seconds')} | {avg('evaluations')} "
            f"| {ratio} | {mean_std([r.get('soup_val_accuracy') for r in group])} "
            f"| {mean_std([r.get('independent_val_accuracy') for r in group])} |"
        )
    sizes = sorted({r["independent_size"] for r in rows if "independent_size" in r})
    lines.append(
        f"\nindependent: the soup's (or model's) top-1 on the {sizes or '-'} validation images "
        "outside every variant's merge eval set; accuracies mean ± std over seeds"
    )
    return "\n".join(lines)


def table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    """One line per strategy and jigsaw variant: the first seed's costs, and the test accuracy
    over the seeds of that strategy and variant alone."""
    keys = list(dict.fromkeys((r["strategy"], r.get("variant", "")) for r in rows))
    first = {k: r for r in rows if r["seed"] == 0 for k in [(r["strategy"], r.get("variant", ""))]}
    acc = {
        key: [
            r["test_accuracy"]
            for r in rows
            if (r["strategy"], r.get("variant", "")) == key and "test_accuracy" in r
        ]
        for key in keys
    }
    jig_extra = f", {' '.join(args.jigsaw)}" if args.jigsaw else ""
    labels = {"none": "none (untrained init)", "full": f"full (E={args.full_epochs})"}
    labels["jigsaw"] = f"jigsaw (defaults{jig_extra})"
    pct = round(100 * args.fraction)
    lines = [
        f"| pre-training | wall time (s) | of which merge (s) | training samples | unique samples "
        f"| test acc. %, {args.selector} {pct}% (mean ± std, {args.seeds} seeds) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key in (k for k in keys if k in first and k[0] in STRATEGIES):
        r, (name, label) = first[key], key
        merge = r.get("merge_seconds")
        lines.append(
            f"| {labels[name]}{f' [{label}]' if label else ''} | {r['seconds']:.1f} "
            f"| {'-' if merge is None else f'{merge:.1f}'} "
            f"| {r['samples']:,} | {r['unique_samples']:,} | {mean_std(acc[key])} |"
        )
    random = acc.get(("random", ""), [])
    lines.append(f"| random {pct}% subset (no model) | - | - | - | - | {mean_std(random)} |")
    jigsaws = [k for k in keys if k[0] == "jigsaw" and k in first]
    if ("full", "") not in first or not jigsaws:
        return "\n".join(lines)
    full, jig = first[("full", "")], first[jigsaws[0]]
    soup = jig.get("soup_val_accuracy")
    lines += [
        "",
        f"full / jigsaw{f' [{jigsaws[0][1]}]' if jigsaws[0][1] else ''}: wall time "
        f"{full['seconds'] / max(jig['seconds'], 1e-9):.2f}x, "
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
    if not (ROOT / "configs" / "selector" / f"{args.selector}.yaml").is_file():
        sys.exit(f"error: no configs/selector/{args.selector}.yaml; pass --selector random")
    with pinned(args.threads, args.core):
        log(host_line())
        rows = measure_all(args, strategies)
    print(tax_table(args, rows) if args.tax_only else table(args, rows))
    print_caveat(rows)


def measure_all(args: argparse.Namespace, strategies: list[str]) -> list[dict[str, Any]]:
    """Every strategy, variant and seed: each row to --json as it lands, or from it (resumed)."""
    from lipt.stages.build import build_datamodule

    base = [f"dataset={args.dataset}", "model=convnet", "logger=none"]
    base += ["trainer.enable_progress_bar=false", f"fraction={args.fraction}"]
    base += [f"selector={args.selector}"]
    base += [f"trainer.max_epochs={args.main_epochs}"] if args.main_epochs else []
    base += args.override
    results = ResultFile(args.json, vars(args))
    with tempfile.TemporaryDirectory(prefix="pretrain_tax_") as tmp:
        out = args.out or Path(tmp)
        dm = build_datamodule(validated(base, out))  # one pool and split for every run
        variants = parse_variants(args)
        jigsaw_runs = [[*base, "pretrain=jigsaw", *args.jigsaw, *o] for o in variants.values()]
        eval_sizes = [validated(o, out).node("merge")["eval_size"] for o in jigsaw_runs]
        for seed in range(args.seeds):
            independent = independent_positions(dm, seed, eval_sizes)
            for name in strategies:
                if name == "full" and args.full_seeds is not None and seed >= args.full_seeds:
                    continue
                for variant in variants.items() if name == "jigsaw" else [("", [])]:
                    key = {"strategy": name, "variant": variant[0], "seed": seed}
                    inputs = (args, base, name, seed, out, dm, variant, independent)
                    results.measure(key, run_strategy, *inputs)
            if not args.tax_only:
                results.measure({"strategy": "random", "seed": seed}, run_random, base, seed, out)
    return results.rows


if __name__ == "__main__":
    with user_errors():
        main()
