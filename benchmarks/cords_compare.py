"""CORDS' own selection code against lipt's `select.py`, back to back in one process: same model
(an untrained `convnet`, seed 0), same data (the Fashion-MNIST pool and validation split),
same machine, 10% of the pool, for GLISTER, GradMatch and CRAIG.

Settings on both sides are lipt's defaults, mapped onto CORDS' per-sample variants:
- GLISTER: CORDS `PerClass` (per-class budgets), stochastic greedy, eta 0.1, last-layer
  weights and bias; lipt `selector=glister` (balance, stochastic greedy, eta 0.1).
- GradMatch: CORDS `PerClassPerGradient`, matching the training gradient (valid=False), lam 0.5,
  eps 1e-4; lipt `selector=gradmatch` (granularity class, target train, lam 0.5).
- CRAIG: CORDS `PerClass`, bias gradients (linear_layer=False), lazy greedy (apricot); lipt
  `selector=craig` (balance, bias_only, lazy).
CORDS gets DataLoaders over pre-normalised float tensors (its cheapest input; no per-sample
transforms) with batch 256, lipt its default data path. Timings include each side's forward
passes over the pool (and the validation split where the selector uses it).

CORDS 0.0.4 is not installable next to lipt (it pins torchtext 0.10 and pyyaml 5.4); a separate
venv that sees lipt's torch works:

    python3 -m venv /work/cords-venv
    echo "$(python -c 'import site; print(site.getsitepackages()[0])')" \\
        > /work/cords-venv/lib/python3.11/site-packages/zz_shared_torch.pth   # lipt's venv
    /work/cords-venv/bin/pip install --no-deps cords==0.0.4
    /work/cords-venv/bin/pip install apricot-select scipy scikit-learn numba pandas dotmap
    PYTHONPATH=src /work/cords-venv/bin/python benchmarks/cords_compare.py

With `--ckpt out/pretrain/seed0/pretrain.ckpt --seed 0 --subsets-dir DIR` both sides rank with
that pre-trained model instead, and each side's subset is written to DIR/{cords,lipt}_<name>.npz
for `train.py subset_path=... seed=0`: the quality of CORDS' reference implementation beside
lipt's on the same model (docs/results/quality/glister.md).

(CORDS' package __init__ imports its data set builders, which need `load_boston` and
torchtext; both are stubbed before the import: neither is used by the selection code.)

It prints the machine first and, after the table, a caveat where other work shared it.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
import types
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))  # measure.py, also under runpy
from measure import compose_config, host_line, measured, print_caveat, user_errors

FRACTION = 0.1
BATCH = 256
CORDS_SELECTORS = ["glister", "gradmatch", "craig"]


def import_cords() -> types.ModuleType | None:
    try:
        import sklearn.datasets

        sklearn.datasets.load_boston = None  # type: ignore[attr-defined]  # removed in 1.2
        for name in ("torchtext", "torchtext.data", "torchtext.vocab", "torchtext.datasets"):
            sys.modules.setdefault(name, types.ModuleType(name))
        import cords.selectionstrategies.SL as strategies  # noqa: N811
    except ImportError as e:
        print(f"CORDS is not importable here ({e}); nothing compared.")
        print("Install it in a separate venv: see this script's docstring.")
        return None
    return strategies


class CordsModel(nn.Module):
    """lipt's model behind the interface CORDS' strategies call: `model(x, last=True,
    freeze=True) -> (logits, embedding)` and `get_embedding_dim()`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model

    def forward(self, x: torch.Tensor, last: bool = False, freeze: bool = False):
        with torch.set_grad_enabled(not freeze and torch.is_grad_enabled()):
            e = self.inner.embed(x)  # type: ignore[operator]
        out = self.inner.classifier(e)  # type: ignore[operator]
        return (out, e) if last else out

    def get_embedding_dim(self) -> int:
        return int(self.inner.classifier.in_features)  # type: ignore[union-attr,arg-type]


def cords_loaders(dm) -> tuple[DataLoader, DataLoader]:
    def tensors(positions: torch.Tensor) -> TensorDataset:
        images = dm.train_source.images[positions].float() / 255
        mean = torch.tensor(dm.mean).view(1, -1, 1, 1)
        std = torch.tensor(dm.std).view(1, -1, 1, 1)
        return TensorDataset((images - mean) / std, dm.train_source.labels[positions])

    return (
        DataLoader(tensors(dm.pool_indices), batch_size=BATCH, shuffle=False),
        DataLoader(tensors(dm.val_indices), batch_size=BATCH, shuffle=False),
    )


def run_cords(
    strategies, name: str, model: nn.Module, dm, budget: int, seed: int
) -> tuple[float, torch.Tensor]:
    """Seconds of CORDS' `select`, and its picks as positions in the training split."""
    train, val = cords_loaders(dm)
    wrapped = CordsModel(model).eval()
    loss = nn.CrossEntropyLoss(reduction="none")
    log = logging.getLogger("cords")
    if name == "glister":
        s = strategies.GLISTERStrategy(
            train, val, wrapped, loss, 0.1, "cpu", 10, True, "PerClass", "Stochastic", log
        )
    elif name == "gradmatch":
        s = strategies.GradMatchStrategy(
            train, val, wrapped, loss, 0.1, "cpu", 10, True, "PerClassPerGradient", log,
            valid=False, lam=0.5, eps=1e-4,
        )  # fmt: skip
    else:
        s = strategies.CRAIGStrategy(
            train, val, wrapped, loss, "cpu", 10, False, False, "PerClass", log, optimizer="lazy"
        )
    torch.manual_seed(seed)
    random.seed(seed)  # CORDS' stochastic greedy samples with Python's `random`
    start = time.perf_counter()
    idxs, _ = s.select(budget, wrapped.state_dict())
    seconds = time.perf_counter() - start
    assert abs(len(idxs) - budget) <= 10, (name, len(idxs), budget)  # per-class rounding
    picks = torch.as_tensor([int(i) for i in idxs], dtype=torch.long)  # pool positions
    return seconds, dm.pool_indices[picks]


def lipt_cfg(name: str, seed: int, pretrained: bool):
    return compose_config(
        "train",
        [
            "paths.output_dir=/tmp/lipt-bench",
            f"selector={name}",
            f"fraction={FRACTION}",
            f"seed={seed}",
            f"pretrain={'jigsaw' if pretrained else 'none'}",
        ],
    )


def run_lipt(cfg, model: nn.Module, dm, seed: int) -> tuple[float, torch.Tensor]:
    from lipt.run.config import run_of
    from lipt.stages.build import build_parts
    from lipt.stages.select import choose_subset

    run = run_of(cfg)  # before the clock: resolving the config is not selection
    parts = build_parts(run, dm)
    start = time.perf_counter()
    indices, _ = choose_subset(run, parts, [model], seed=seed)
    return time.perf_counter() - start, indices


def save_picks(path: Path, indices: torch.Tensor, cfg, dm) -> None:
    from lipt.core.artifacts import save_subset
    from lipt.run.config import run_of
    from lipt.stages.select import subset_meta

    save_subset(path, indices.sort().values, torch.ones(len(indices)), subset_meta(run_of(cfg), dm))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    # Only these three have a CORDS counterpart here (run_cords): another name would be timed
    # against CORDS' CRAIG under its own name.
    parser.add_argument("--selectors", nargs="+", choices=CORDS_SELECTORS, default=CORDS_SELECTORS)
    parser.add_argument("--ckpt", help="rank with this pretrain.ckpt (default: untrained model)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subsets-dir", help="write each side's subset here for train.py")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give a count of at least 1")
    strategies = import_cords()
    if strategies is None:
        return
    from lipt.run.config import run_of
    from lipt.stages.build import build_datamodule, build_model, build_parts
    from lipt.stages.pretrain import load_pretrained

    run = run_of(compose_config("train", ["paths.output_dir=/tmp/lipt-bench", f"seed={args.seed}"]))
    dm = build_datamodule(run)
    pretrained = args.ckpt is not None
    if pretrained:
        model = load_pretrained(run, build_parts(run, dm), Path(args.ckpt)).eval()
    else:
        model = build_model(run, args.seed).eval()
    budget = round(FRACTION * len(dm.pool_indices))
    what = f"the model of {args.ckpt}" if pretrained else "untrained convnet"
    print(host_line())
    print(f"CPU ({torch.get_num_threads()} threads), Fashion-MNIST pool {len(dm.pool_indices):,}")
    print(f"(validation {len(dm.val_indices):,}), {what}, budget {budget:,} (10%)")
    print(f"best of {args.repeats}, CORDS and lipt alternating\n")
    print("| selector | CORDS | lipt | lipt / CORDS |")
    print("|---|---:|---:|---:|")
    from lipt.core import console

    records = []  # one a selector: the machine and how busy it was
    for name in args.selectors:
        selector_cfg = lipt_cfg(name, args.seed, pretrained)
        cords_s, lipt_s = [], []
        with measured() as record:
            for _ in range(args.repeats):
                seconds, cords_picks = run_cords(strategies, name, model, dm, budget, args.seed)
                cords_s.append(seconds)
                with console.no_bars():
                    seconds, lipt_picks = run_lipt(selector_cfg, model, dm, args.seed)
                lipt_s.append(seconds)
        records.append(record)
        if args.subsets_dir:
            out = Path(args.subsets_dir)
            save_picks(out / f"cords_{name}.npz", cords_picks, selector_cfg, dm)
            save_picks(out / f"lipt_{name}.npz", lipt_picks, selector_cfg, dm)
        c, lp = min(cords_s), min(lipt_s)
        print(f"| {name} | {c:.1f} s | {lp:.1f} s | {lp / c:.2f} |", flush=True)
    print_caveat(records)


if __name__ == "__main__":
    with user_errors():
        main()
