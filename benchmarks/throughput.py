"""Throughput: lipt's training epoch and inference pass against a plain torch loop, same model,
same data, same process, interleaved, best of `--repeats`.

CPU part (always): 20,000 Fashion-MNIST training images, `convnet`, batch 256.
- training: one epoch of lipt (Lightning `Trainer.fit` of lipt's Classifier, fed by lipt's
  DataModule with crop + flip and per-sample weights) against a plain loop (a pre-normalised
  float tensor, a random permutation, slices, weighted cross-entropy, the same SGD settings, no
  augmentation), also with its batches in channels_last, the strides lipt's resident crop gives
  grey batches (they pick the NHWC kernels: most of the resident path's lead over the plain
  loop on a CPU is that layout, not the path). Both the resident path (`dataset.resident=true`,
  the default) and the DataLoader path (`dataset.resident=false`) are measured; only the
  training epoch is timed (a callback), not Lightning's start-up.
- inference: lipt's pool pass (`model_outputs` over `DataModule.pool_dataloader()`, what
  selectors score) against `embed` + `classifier` over slices of a pre-normalised tensor, at
  several eval batch sizes (the default `dataset.eval_batch_size` is chosen from these).
CUDA part (when a GPU is present): the same comparison on synthetic CIFAR-shaped uint8 data
(20,000 x 3x32x32), `convnet` and `resnet18`, fp32 and bf16 (autocast), absolute images/s.

    python benchmarks/throughput.py               # CPU part, and the CUDA part when present
    python benchmarks/throughput.py --repeats 5
    python benchmarks/throughput.py --repeats 1 --images 2000 --eval-batches 256   # a smoke run

It prints the machine first and, after the tables, a caveat where other work shared it (pin
with `--core C --threads 1` to learn how busy the other cores were).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # measure.py, also under runpy
from measure import host_line, measured, pinned, print_caveat, user_errors

N_IMAGES = 20_000  # --images for a quick smoke run
BATCH = 256


class EpochTimer(L.Callback):
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(pl_module)
        self.start = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(pl_module)
        self.seconds = time.perf_counter() - self.start

    @staticmethod
    def _sync(pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_datamodule(load: Callable, channels: int, size: int, resident: bool, device: str):
    from lipt.data import DataModule

    mean, std = [0.5] * channels, [0.25] * channels
    dm = DataModule(
        load, 10, channels, size, mean, std, val_size=0, crop_padding=2, resident=resident
    )
    dm.device = device
    dm.setup()
    return dm


def lipt_epoch(model: nn.Module, dm, device: torch.device, precision: str) -> float:
    """Seconds of one training epoch of lipt's Classifier on `dm`'s pool."""
    from lipt.models.classifier import QUIET_TRAINER, Classifier

    module = Classifier(model, num_classes=10)
    timer = EpochTimer()
    trainer = L.Trainer(
        accelerator=device.type,
        devices=1,
        precision=precision,  # type: ignore[arg-type]
        max_epochs=1,
        callbacks=[timer],
        **QUIET_TRAINER,
    )
    dm.set_subset(None)
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    return timer.seconds


def plain_epoch(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, bf16: bool, channels_last: bool = False
) -> float:
    """One epoch of a hand-written loop over a pre-normalised tensor on the model's device;
    `channels_last`: each batch in that layout, as lipt's resident crop hands grey batches
    (their strides pick the NHWC kernels, about 1.4x faster on a CPU for `convnet`)."""
    device = x.device
    model.to(device).train()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4
    )
    w = torch.ones(len(x), device=device)
    sync(device)
    start = time.perf_counter()
    perm = torch.randperm(len(x), device=device)
    for i in range(0, len(x), BATCH):
        rows = perm[i : i + BATCH]
        batch = x[rows]
        if channels_last:
            batch = batch.to(memory_format=torch.channels_last)  # restrides C=1 too
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            per_sample = F.cross_entropy(model(batch), y[rows], reduction="none")
        loss = (w[rows] * per_sample).sum() / w[rows].sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    sync(device)
    return time.perf_counter() - start


def lipt_inference(model: nn.Module, dm, device: torch.device, batch: int) -> float:
    from lipt.selection import model_outputs

    dm.eval_batch_size = batch
    model.to(device)
    sync(device)
    start = time.perf_counter()
    model_outputs(model, dm.pool_dataloader(), device)
    sync(device)
    return time.perf_counter() - start


def plain_inference(model: nn.Module, x: torch.Tensor, batch: int) -> float:
    model.to(x.device).eval()
    sync(x.device)
    start = time.perf_counter()
    with torch.no_grad():
        out = [
            model.classifier(model.embed(x[i : i + batch])).cpu() for i in range(0, len(x), batch)
        ]
    sync(x.device)
    assert sum(len(o) for o in out) == len(x)
    return time.perf_counter() - start


def fresh(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return make()


def normalised(dm, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    images = dm.train_source.images[dm.pool_indices].float() / 255
    mean = torch.tensor(dm.mean).view(1, -1, 1, 1)
    std = torch.tensor(dm.std).view(1, -1, 1, 1)
    x = ((images - mean) / std).to(device)
    return x, dm.train_source.labels[dm.pool_indices].to(device)


def best(fn: Callable[[], float], repeats: int) -> float:
    return min(fn() for _ in range(repeats))


def cpu_part(repeats: int, eval_batches: list[int]) -> None:
    from lipt.data.sources import Splits, TensorImages, load_fashion_mnist
    from lipt.models import ConvNet

    full = load_fashion_mnist(None, download=False)
    train = TensorImages(full.train.images[:N_IMAGES], full.train.labels[:N_IMAGES])
    splits = Splits(train, full.test, "fashion_mnist:20k")
    cpu = torch.device("cpu")
    dms = {r: make_datamodule(lambda: splits, 1, 28, r, "cpu") for r in (True, False)}
    x, y = normalised(dms[True], cpu)
    n = len(x)  # what an epoch trains: --images, or the whole split where it has fewer
    make = lambda: ConvNet(1, 10, 32)  # noqa: E731
    lipt_epoch(fresh(make), dms[True], cpu, "32-true")  # warm-up (allocator, oneDNN)

    times: dict[str, list[float]] = {"plain": [], "plain_cl": [], "resident": [], "dataloader": []}
    for _ in range(repeats):  # interleaved, so drifting load hits every row alike
        times["plain"].append(plain_epoch(fresh(make), x, y, bf16=False))
        times["plain_cl"].append(plain_epoch(fresh(make), x, y, False, channels_last=True))
        times["resident"].append(lipt_epoch(fresh(make), dms[True], cpu, "32-true"))
        times["dataloader"].append(lipt_epoch(fresh(make), dms[False], cpu, "32-true"))
    plain = n / min(times["plain"])
    print(f"\nCPU ({torch.get_num_threads()} threads), {n:,} Fashion-MNIST images, convnet")
    print(f"best of {repeats}, interleaved; training batch {BATCH}\n")
    print("| path | img/s | against the plain torch loop |")
    print("|---|---:|---:|")
    print(f"| plain torch training loop (no augmentation) | {plain:,.0f} | 1.00x |")
    rows = (
        ("plain_cl", "plain torch training loop, channels_last batches"),
        ("resident", "lipt training epoch, resident, crop+flip"),
        ("dataloader", "lipt training epoch, DataLoader path"),
    )
    for key, label in rows:
        rate = n / min(times[key])
        print(f"| {label} | {rate:,.0f} | {rate / plain:.2f}x |")

    model = fresh(make)
    rows = []
    for batch in eval_batches:
        t_plain, t_res, t_loader = [], [], []
        for _ in range(repeats):
            t_plain.append(plain_inference(model, x, batch))
            t_res.append(lipt_inference(model, dms[True], cpu, batch))
            if batch in (256, 1024):  # the old path at the old and the new default only
                t_loader.append(lipt_inference(model, dms[False], cpu, batch))
        rows.append((batch, min(t_plain), min(t_res), min(t_loader, default=float("nan"))))
    print("\n| eval batch | plain tensor img/s | lipt resident img/s | ratio | DataLoader img/s |")
    print("|---:|---:|---:|---:|---:|")
    for batch, tp, tr, tl in rows:
        loader = "—" if tl != tl else f"{n / tl:,.0f}"  # NaN: not measured at this batch
        print(f"| {batch} | {n / tp:,.0f} | {n / tr:,.0f} | {tp / tr:.2f}x | {loader} |")


def cuda_part(repeats: int) -> None:
    from lipt.data.sources import Splits, TensorImages
    from lipt.models import ConvNet, ResNet18

    device = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (N_IMAGES, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (N_IMAGES,), generator=g)
    data = TensorImages(images, labels)
    splits = Splits(data, TensorImages(images[:1000], labels[:1000]), "synthetic-cifar")
    dm = make_datamodule(lambda: splits, 3, 32, True, "cuda")
    x, y = normalised(dm, device)
    print(f"\nCUDA: {torch.cuda.get_device_name()}, {N_IMAGES:,} synthetic CIFAR-shaped images")
    print(f"best of {repeats}; training batch {BATCH}, eval batch 1024\n")
    print(
        "| model | precision | plain train img/s | lipt train img/s | ratio "
        "| plain infer img/s | lipt infer img/s | ratio |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    models: dict[str, Callable[[], nn.Module]] = {
        "convnet": lambda: ConvNet(3, 10, 32),
        "resnet18": lambda: ResNet18(3, 10),
    }
    for name, make in models.items():
        for precision in ("32-true", "bf16-mixed"):
            cuda_row(name, make, precision, dm, x, y, repeats)


def cuda_row(
    name: str,
    make: Callable[[], nn.Module],
    precision: str,
    dm: object,
    x: torch.Tensor,
    y: torch.Tensor,
    repeats: int,
) -> None:
    device, bf16 = x.device, precision == "bf16-mixed"
    lipt_epoch(fresh(make), dm, device, precision)  # warm-up (cuDNN autotune)
    tp = best(lambda: plain_epoch(fresh(make), x, y, bf16), repeats)
    tl = best(lambda: lipt_epoch(fresh(make), dm, device, precision), repeats)
    model = fresh(make).to(device)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        ip = best(lambda: plain_inference(model, x, 1024), repeats)
        il = best(lambda: lipt_inference(model, dm, device, 1024), repeats)
    n = len(x)
    print(
        f"| {name} | {precision} | {n / tp:,.0f} | {n / tl:,.0f} | {tp / tl:.2f}x "
        f"| {n / ip:,.0f} | {n / il:,.0f} | {ip / il:.2f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument("--images", type=int, default=N_IMAGES)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--core", type=int, default=None, help="run on this core alone")
    parser.add_argument("--eval-batches", type=int, nargs="+", default=[128, 256, 512, 1024])
    args = parser.parse_args()
    for name in ("repeats", "images"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: give a count of at least 1")
    if any(b < 1 for b in args.eval_batches):
        parser.error(f"--eval-batches {args.eval_batches}: give batch sizes of at least 1")
    globals()["N_IMAGES"] = args.images
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    records: list[dict[str, Any]] = []  # one a part: the machine and how busy it was
    with pinned(args.threads or None, args.core):
        print(host_line())
        if not args.skip_cpu:
            with measured() as record:
                cpu_part(args.repeats, args.eval_batches)
            records.append(record)
        if torch.cuda.is_available():
            with measured() as record:
                cuda_part(args.repeats)
            records.append(record)
        else:
            print("\nno CUDA device: the GPU part was not run")
    print_caveat(records)


if __name__ == "__main__":
    with user_errors():
        main()
