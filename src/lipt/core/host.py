"""The machine a run's seconds were measured on, and whether other work shared it.

summary.json records `host` (CPU, cores, accelerator, torch threads, the cores the run may use)
and, over main training's stages, how busy the cores it may not use were: a run pinned to one
core with one thread (`hydra/callbacks=pin`, or `OMP_NUM_THREADS=1 taskset -c 1`) pays a
one-core rate, but shared cache and memory still inflate its seconds, by up to ~40% measured
here, when the other cores work beside it. The frontier's report names those runs. Also how
many processes a `trainer` node runs on this machine (`trainer_world_size`). No torch or
Lightning at import: `host()` and `every_device` import them where they run.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A pinned run whose other cores were busy more than this share of its time is flagged.
BUSY_SHARE = 0.25


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first CPU's model name, with its family and model numbers where /proc/cpuinfo has
    them: a virtual machine may name only "AMD EPYC", and two generations under that name run
    the same job at rates 2x apart (the 36-epoch reference: 2080 s and 1033 s), so seconds
    compare only within one."""
    fields: dict[str, str] = {}
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else ():
        if not line.strip():
            break  # the first CPU's block ends
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    numbers = [
        f"{label} {fields[key]}"
        for key, label in (("cpu family", "family"), ("model", "model"))
        if key in fields
    ]
    return f"{name} ({', '.join(numbers)})" if numbers else name


def allowed_cores() -> set[int]:
    """The cores this process may run on (taskset, a pinning callback, SLURM's cgroup)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def host() -> dict[str, Any]:
    """The machine and how this process uses it, now."""
    import torch

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "accelerator": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
        "torch_threads": torch.get_num_threads(),
        "cores_allowed": len(allowed_cores()),
    }


def core_ticks() -> dict[int, tuple[int, int]]:
    """(busy, total) jiffies per core from /proc/stat; empty where there is none."""
    stat = Path("/proc/stat")
    if not stat.is_file():
        return {}
    ticks = {}
    for line in stat.read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            values = [int(v) for v in fields[:8]]
            idle = values[3] + values[4]  # idle + iowait
            ticks[int(name[3:])] = (sum(values) - idle, sum(values))
    return ticks


def other_cores_busy(
    before: Mapping[int, tuple[int, int]],
    after: Mapping[int, tuple[int, int]],
    allowed: set[int] | None = None,
) -> float | None:
    """Busy share of the cores outside `allowed` (default: this process's) between two
    `core_ticks`; None where every core is allowed or nothing was counted."""
    mine = allowed_cores() if allowed is None else allowed
    others = [c for c in after if c not in mine and c in before]
    if not others:
        return None
    busy = sum(after[c][0] - before[c][0] for c in others)
    total = sum(after[c][1] - before[c][1] for c in others)
    return round(busy / total, 3) if total > 0 else None


def load_average() -> float:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else 0.0


def is_pinned(record: Mapping[str, Any]) -> bool:
    """Whether a run (its summary.json) ran on one core with one torch thread."""
    machine = record.get("host") or {}
    return machine.get("cores_allowed") == 1 and machine.get("torch_threads") == 1


def is_busy_beside(record: Mapping[str, Any]) -> bool:
    """Whether a pinned run's other cores worked beside it (its seconds are inflated)."""
    return (record.get("other_cores_busy") or 0.0) > BUSY_SHARE


def is_loaded(record: Mapping[str, Any]) -> bool:
    """Whether an unpinned run started or ended with more runnable work than cores."""
    cores = (record.get("host") or {}).get("cores") or os.cpu_count() or 1
    return max(record.get("load_average") or [0.0]) > cores


def trainer_world_size(trainer: Mapping[str, Any]) -> int | None:
    """The processes main training runs on, as Lightning's Trainer counts them: the `trainer`
    node's devices x num_nodes, devices `auto` (or -1) being every CUDA GPU where the
    accelerator may be one and there are some, else one device. None where the node alone does
    not tell (`auto` on another accelerator, or a value Lightning refuses)."""
    devices = trainer.get("devices", "auto")
    if isinstance(devices, str) and "," in devices:  # "0,1": those GPUs
        devices = [d for d in devices.split(",") if d.strip()]
    elif isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    count: int | None = None
    if isinstance(devices, (list, tuple)):
        count = len(devices)
    elif devices in ("auto", -1):
        count = every_device(str(trainer.get("accelerator", "auto")), devices)
    elif isinstance(devices, int) and devices > 0:
        count = devices
    return None if count is None else count * int(trainer.get("num_nodes", 1))


def every_device(accelerator: str, devices: str | int) -> int | None:
    """What devices `auto` or -1 count on `accelerator`, as Lightning resolves them."""
    from lightning.pytorch.accelerators import CUDAAccelerator

    if accelerator in ("auto", "gpu", "cuda") and CUDAAccelerator.is_available():
        return CUDAAccelerator.auto_device_count()
    if accelerator in ("auto", "cpu", "gpu", "mps") and devices == "auto":
        return 1  # no CUDA GPU: one CPU, or Apple's one GPU
    return None
