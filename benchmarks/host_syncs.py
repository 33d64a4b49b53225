"""Host synchronisations: how often a training step and an inference batch make the host wait
for the device, for a plain torch loop and for lipt, counted on the CPU.

A read of a device value by the host (`.item()`, `float(t)`, `bool(t)`, `nonzero`, `unique`,
`masked_select`, boolean-mask indexing, `torch.equal`, ...) stalls the CPU on a GPU until every
queued kernel has run, and so does a blocking copy between host and device (`.cpu()`,
`.to(device)` from host memory, `torch.tensor(..., device=)`: a stream sync before or after
the copy). While the host waits it queues no kernels, so the device idles after each wait until
the next ones arrive: a fixed cost per wait, which weighs most where a batch costs least.

No GPU is needed: a `TorchDispatchMode` sees every aten op on CPU tensors too, and counts those
that wait on CUDA (`SYNC_OPS`, boolean-mask indexing); a `TorchFunctionMode` counts the blocking
moves between devices (a copy on CUDA where the tensor crosses host and device, nothing where
it does not: on the CPU both sides are the host). Each is placed at the innermost Python frame
outside torch, as lipt's (src/lipt), Lightning's (lightning, torchmetrics) or the loop's own.

- training: steady-state steps of the main job (configs/train.yaml: budget=lipt's dynamic
  pruning, the default callbacks and CSV logger, log_every_n_steps 10, convnet, batch 256) on
  Fashion-MNIST's resident DataModule (crop + flip on the device), the validation passes left
  out; against a plain loop (slices of a pre-normalised tensor, weighted cross-entropy, SGD).
  On the CPU lipt checks each step's loss for NaN (one read); on an accelerator only every
  log_every_n_steps steps (Classifier.checks_loss_now).
- inference: `lipt.selection.model_outputs` over `DataModule.pool_dataloader()` (what
  selectors and dynamic pruning's scoring read), against `classifier(embed(x))` over slices
  of a tensor with a `.cpu()` of each batch's logits.

    python benchmarks/host_syncs.py
    python benchmarks/host_syncs.py --steps 20 --batches 10 --sites   # where each comes from

It prints the machine first. Counts, not seconds: the same on any CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))  # measure.py, also under runpy
from measure import compose_config, host_line, user_errors

import lipt
from lipt.core.errors import UserError

BATCH = 256
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
# The main job (configs/train.yaml's defaults) on Fashion-MNIST, on the CPU, without a terminal
# bar.
MAIN_JOB = [
    "dataset=fashion_mnist",
    f"dataset.data_dir={FASHION_MNIST}",
    "dataset.download=false",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
]

# Ops whose CUDA kernels return to the host before the op ends: a value read (item, float,
# bool, is_nonzero), an output whose size depends on the values, a comparison answered on the
# host.
WAITING_OPS = (
    "_local_scalar_dense is_nonzero equal nonzero masked_select bincount repeat_interleave histc "
    "unique _unique _unique2 unique_dim unique_consecutive unique_dim_consecutive"
)
SYNC_OPS = frozenset(f"aten.{name}" for name in WAITING_OPS.split())
# Ops that wait where an index is a boolean mask (it is turned into positions on the host).
MASK_INDEXED = frozenset(
    {"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"}
)
TORCH_DIR = str(Path(torch.__file__).resolve().parent)
LIPT_DIR = str(Path(lipt.__file__).resolve().parent)
LIGHTNING_DIRS = ("/lightning/", "/lightning_fabric/", "/torchmetrics/", "/pytorch_lightning/")
THIS_FILE = str(Path(__file__).resolve())
# Lightning moves batches with non_blocking=True to a CUDA device, blocking to the CPU
# (lightning.fabric.utilities.apply_func.move_data_to_device): counted as on CUDA, not at all.
LIGHTNING_BATCH_MOVE = "batch_to"


def origin(frame: Any) -> tuple[str, str, str]:
    """(lipt | Lightning | plain, "file:line", function) of the innermost frame outside torch
    (and outside this file's counters)."""
    while frame is not None:
        name = frame.f_code.co_filename
        counting = name == THIS_FILE and frame.f_code.co_name.startswith("__torch_")
        if not name.startswith(TORCH_DIR) and not counting:
            break
        frame = frame.f_back
    if frame is None:
        return "plain", "?", "?"
    name, line, func = frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name
    if name.startswith(LIPT_DIR):
        return "lipt", f"lipt{name[len(LIPT_DIR) :]}:{line}", func
    for folder in LIGHTNING_DIRS:
        if folder in name:
            return "Lightning", f"{folder.strip('/')}/{name.split(folder, 1)[1]}:{line}", func
    return "plain", f"{Path(name).name}:{line}", func


@dataclass
class Syncs:
    """Waits by origin (lipt, Lightning, plain) and by (origin, kind, site)."""

    by_origin: Counter[str] = field(default_factory=Counter)
    by_site: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def add(self, other: Syncs) -> None:
        self.by_origin.update(other.by_origin)
        self.by_site.update(other.by_site)

    def of(self, who: str) -> int:
        return self.by_origin[who]


class Recorder:
    """Where the counters add what they see: `target` (None: nowhere)."""

    def __init__(self, target: Syncs | None = None) -> None:
        self.target = target

    def saw(self, kind: str, frame: Any) -> None:
        if self.target is None:
            return
        who, site, func = origin(frame)
        if who == "Lightning" and func == LIGHTNING_BATCH_MOVE:
            return
        self.target.by_origin[who] += 1
        self.target.by_site[(who, kind, f"{site} {func}")] += 1


def _masked(args: tuple) -> bool:
    """Whether an index/index_put op's indices hold a boolean mask."""
    indices = args[1] if len(args) > 1 else []
    return any(isinstance(t, Tensor) and t.dtype in (torch.bool, torch.uint8) for t in indices)


class SyncOps(TorchDispatchMode):
    """Counts the aten ops that wait for the device on CUDA (SYNC_OPS, boolean-mask indexing)."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        packet = str(func.overloadpacket)
        if packet in SYNC_OPS:
            self.recorder.saw(packet.removeprefix("aten."), sys._getframe(1))
        elif packet in MASK_INDEXED and _masked(args):
            self.recorder.saw(f"{packet.removeprefix('aten.')} (bool mask)", sys._getframe(1))
        return func(*args, **(kwargs or {}))


def _names_device(args: tuple, kwargs: dict) -> bool:
    """Whether a `Tensor.to` call names a device (or a tensor whose device it takes)."""
    if kwargs.get("device") is not None:
        return True
    return any(isinstance(a, (torch.device, str, Tensor)) for a in args[1:])


class BlockingMoves(TorchFunctionMode):
    """Counts the blocking moves between devices: `.to(device)`, `.cpu()`, `.cuda()`,
    `torch.tensor/as_tensor(..., device=)` without `non_blocking=True`, and host reads of a
    whole tensor (`.tolist()`, `.numpy()`)."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        kind = None
        if name == "to" and _names_device(args, kwargs) and not kwargs.get("non_blocking"):
            kind = ".to(device)"
        elif name in ("cpu", "cuda", "tolist", "numpy") and func is getattr(Tensor, name, None):
            kind = f".{name}()"
        elif func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None:
            kind = f"torch.{name}(device=)"
        if kind is not None:
            self.recorder.saw(kind, sys._getframe(1))
        return func(*args, **kwargs)


@contextlib.contextmanager
def counting(recorder: Recorder) -> Iterator[Recorder]:
    """Both counters on while the block runs, adding to `recorder.target`."""
    with BlockingMoves(recorder), SyncOps(recorder):
        yield recorder


# --- training ------------------------------------------------------------------------------


class CountSteps(L.Callback):
    """Counts `steps` training steps, each from its batch's start to the next one's (the
    fetch of that batch and the logging after the step included), and then stops the fit. An
    epoch's last step is not counted: what follows it (validation, the next epoch's plan and
    loader, checkpoints) is once an epoch, not once a step."""

    def __init__(self, recorder: Recorder, steps: int) -> None:
        self.recorder, self.steps = recorder, steps
        self.total, self.counted = Syncs(), 0
        self.epoch = -1

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        step = self.recorder.target
        if step is not None and trainer.current_epoch == self.epoch:
            self.total.add(step)  # the step before this batch, whole
            self.counted += 1
        self.epoch = trainer.current_epoch
        self.recorder.target = None if self.counted == self.steps else Syncs()
        if self.counted == self.steps:
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.recorder.target = None  # the epoch's last step: cut by what ends the epoch

    def on_validation_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.recorder.target = None  # a validation within an epoch: its step is not counted


def lipt_training(steps: int, overrides: list[str]) -> Syncs:
    """Syncs of `steps` training steps of train.py's main training with `overrides` (MAIN_JOB:
    the main job on Fashion-MNIST)."""
    from lipt.dynamic.callback import DynamicPruning
    from lipt.run.config import run_of
    from lipt.stages.build import build_parts
    from lipt.stages.dynamic import DynamicSetup
    from lipt.stages.training_plan import training_plan

    with tempfile.TemporaryDirectory() as out:
        run = run_of(compose_config("train", [*overrides, f"paths.output_dir={out}"]))
        parts = build_parts(run)
        dm = parts.dm
        # Epoch 0's scores stand in for the jigsaw ensemble's (a pre-training is no step's).
        scores = torch.rand(len(dm.pool_indices), generator=torch.Generator().manual_seed(0))
        method = run.budget.pruning(run.settings.fraction)
        callback = DynamicPruning(method, dm, run.settings.seed, scores + 0.1)
        model = parts.initial_model(run.settings.seed)
        whole = len(dm.pool_indices)
        plan = training_plan(
            run, parts, Path(out), model, None, DynamicSetup(callback), whole, None
        )
        recorder = Recorder()
        counter = CountSteps(recorder, steps)
        plan.trainer.callbacks.append(counter)  # type: ignore[attr-defined]
        L.seed_everything(run.settings.seed, verbose=False)
        with counting(recorder):
            plan.trainer.fit(plan.module, datamodule=dm)
    if counter.counted < steps:
        raise UserError(
            f"the fit ended after {counter.counted} of {steps} counted steps: count fewer "
            "(--steps) or train longer (trainer.max_epochs=...)"
        )
    return counter.total


def plain_training(steps: int, x: Tensor, y: Tensor, model: nn.Module) -> Syncs:
    """Syncs of `steps` steps of a plain loop (weighted cross-entropy, SGD) over `x`."""
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4
    )
    w = torch.ones(len(x))
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    total = Syncs()
    with counting(Recorder(total)):
        for i in range(steps):
            rows = perm[i * BATCH : (i + 1) * BATCH]
            per_sample = F.cross_entropy(model(x[rows]), y[rows], reduction="none")
            loss = (w[rows] * per_sample).sum() / w[rows].sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return total


# --- inference -----------------------------------------------------------------------------


class Counted:
    """The first `n` batches of `loader`, counted from the first one's arrival to the next
    one's fetch after the last (the loader's start, and sorting by index after the loop, are
    once a pass)."""

    def __init__(self, loader: Any, n: int, recorder: Recorder, total: Syncs) -> None:
        self.loader, self.n, self.recorder, self.total = loader, n, recorder, total

    def __iter__(self) -> Iterator[Any]:
        try:
            for i, batch in enumerate(self.loader):
                self.recorder.target = self.total  # from the first batch's end: once a pass
                if i == self.n:
                    return  # the last counted batch's successor fetched: n fetches
                yield batch
        finally:
            self.recorder.target = None


def lipt_inference(batches: int, model: nn.Module, dm: Any) -> Syncs:
    """Syncs of `model_outputs` over the first `batches` batches of the pool loader."""
    from lipt.selection import model_outputs

    total, recorder = Syncs(), Recorder()
    with counting(recorder):
        model_outputs(model, Counted(dm.pool_dataloader(), batches, recorder, total), "cpu")
    return total


def plain_inference(batches: int, model: Any, x: Tensor) -> Syncs:
    """Syncs of `classifier(embed(x))` over `batches` slices of `x`, each batch's logits to
    the host."""
    model.eval()
    total = Syncs()
    with counting(Recorder(total)), torch.no_grad():
        out = [
            model.classifier(model.embed(x[i : i + BATCH])).cpu()
            for i in range(0, batches * BATCH, BATCH)
        ]
    assert len(out) == batches
    return total


# --- the table -----------------------------------------------------------------------------


def print_sites(title: str, syncs: Syncs, n: int) -> None:
    print(f"\n{title}, per {'step' if 'train' in title else 'batch'}:")
    for (who, kind, site), count in sorted(syncs.by_site.items(), key=lambda kv: -kv[1]):
        print(f"  {count / n:5.2f}  {who:9s}  {kind:28s}  {site}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps counted")
    parser.add_argument("--batches", type=int, default=10, help="inference batches counted")
    parser.add_argument("--sites", action="store_true", help="list where each comes from")
    parser.add_argument("overrides", nargs="*", help="more overrides of the main job's config")
    args = parser.parse_args()
    for name in ("steps", "batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: give a count of at least 1")
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "lipt"):
        logging.getLogger(name).setLevel(logging.ERROR)
    print(host_line())
    train, infer = measure(args.steps, args.batches, [*MAIN_JOB, *args.overrides])
    print(
        f"\nconvnet, batch {BATCH}; training: {args.steps} steps of the main job (an "
        f"epoch's last left out); inference: {args.batches} pool batches"
    )
    print("waits for the device a training step or an inference batch would cause on CUDA\n")
    print("| | plain loop | lipt: lipt's code | lipt: Lightning's | lipt: total |")
    print("|---|---:|---:|---:|---:|")
    for label, (plain, ours), n in (
        ("training step", train, args.steps),
        ("inference batch", infer, args.batches),
    ):
        total = f"{(ours.of('lipt') + ours.of('Lightning')) / n:.1f}"
        counts = (plain.of("plain"), ours.of("lipt"), ours.of("Lightning"))
        row = [*(f"{c / n:.1f}" for c in counts), total]
        print(f"| {label} | {' | '.join(row)} |")
    if args.sites:
        print_sites("plain training", train[0], args.steps)
        print_sites("lipt training", train[1], args.steps)
        print_sites("plain inference", infer[0], args.batches)
        print_sites("lipt inference", infer[1], args.batches)


Pair = tuple[Syncs, Syncs]  # (plain loop, lipt)


def measure(steps: int, batches: int, overrides: list[str]) -> tuple[Pair, Pair]:
    """(plain, lipt) counts of training steps and of inference batches, the main job's
    config with `overrides` (MAIN_JOB: the main job on Fashion-MNIST)."""
    from lipt.run.config import run_of
    from lipt.stages.build import build_datamodule, build_model

    with tempfile.TemporaryDirectory() as out:
        run = run_of(compose_config("train", [*overrides, f"paths.output_dir={out}"]))
    dm = build_datamodule(run)
    if len(dm.pool_indices) < max(steps, batches) * BATCH:
        raise UserError(
            f"the pool of {len(dm.pool_indices):,} holds fewer than {max(steps, batches)} "
            f"batches of {BATCH}: count fewer (--steps, --batches) or give a larger pool"
        )
    images = dm.train_source.images[dm.pool_indices].float() / 255  # type: ignore[attr-defined]
    mean = torch.tensor(dm.mean).view(1, -1, 1, 1)
    std = torch.tensor(dm.std).view(1, -1, 1, 1)
    x, y = (images - mean) / std, dm.train_source.labels[dm.pool_indices]
    make: Callable[[], nn.Module] = lambda: build_model(run, run.settings.seed)  # noqa: E731
    train = (plain_training(steps, x, y, make()), lipt_training(steps, overrides))
    model = make()
    infer = (plain_inference(batches, model, x), lipt_inference(batches, model, dm))
    return train, infer


if __name__ == "__main__":
    with user_errors():
        main()
