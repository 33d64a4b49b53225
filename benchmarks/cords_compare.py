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

(CORDS' package __init__ imports its data set builders, which need `load_boston` and
torchtext; both are stubbed before the import: neither is used by the selection code.)
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import types
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
FRACTION = 0.1
BATCH = 256


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


def run_cords(strategies, name: str, model: nn.Module, dm, budget: int) -> float:
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
    torch.manual_seed(0)
    start = time.perf_counter()
    idxs, _ = s.select(budget, wrapped.state_dict())
    seconds = time.perf_counter() - start
    assert abs(len(idxs) - budget) <= 10, (name, len(idxs), budget)  # per-class rounding
    return seconds


def run_lipt(name: str, model: nn.Module, dm) -> float:
    from hydra import compose, initialize_config_dir

    from lipt.select import choose_subset

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                "paths.output_dir=/tmp/lipt-bench",
                f"selector={name}",
                f"fraction={FRACTION}",
            ],
        )
    start = time.perf_counter()
    choose_subset(cfg, dm, [model], seed=0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--selectors", nargs="+", default=["glister", "gradmatch", "craig"])
    args = parser.parse_args()
    strategies = import_cords()
    if strategies is None:
        return
    from hydra import compose, initialize_config_dir

    from lipt.build import build_datamodule, build_model

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["paths.output_dir=/tmp/lipt-bench"])
    dm = build_datamodule(cfg)
    model = build_model(cfg, 0).eval()
    budget = round(FRACTION * len(dm.pool_indices))
    print(f"CPU ({torch.get_num_threads()} threads), Fashion-MNIST pool {len(dm.pool_indices):,}")
    print(f"(validation {len(dm.val_indices):,}), untrained convnet, budget {budget:,} (10%)")
    print(f"best of {args.repeats}, CORDS and lipt alternating\n")
    print("| selector | CORDS | lipt | lipt / CORDS |")
    print("|---|---:|---:|---:|")
    from lipt import console

    for name in args.selectors:
        cords_s, lipt_s = [], []
        for _ in range(args.repeats):
            cords_s.append(run_cords(strategies, name, model, dm, budget))
            with console.no_bars():
                lipt_s.append(run_lipt(name, model, dm))
        c, lp = min(cords_s), min(lipt_s)
        print(f"| {name} | {c:.1f} s | {lp:.1f} s | {lp / c:.2f} |", flush=True)


if __name__ == "__main__":
    main()
