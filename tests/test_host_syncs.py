"""lipt's own waits for the device per training step and per pool batch, counted on the CPU by
benchmarks/host_syncs.py's counters (a read of a device value, a blocking move between host and
device), each of which would stall the host on a GPU until the device drains. Not timed:
counts, the same on any CPU."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# The main job's config (budget=lipt's dynamic pruning, the default callbacks, the CSV logger,
# convnet, batch 256) on Fashion-MNIST-shaped data made in memory: 28x28 grey, 10 classes.
MAIN_JOB = [
    "dataset=synthetic",
    "dataset.image_size=28",
    "dataset.num_classes=10",
    "dataset.num_train=12000",
    "dataset.val_size=500",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
]


@pytest.fixture(scope="module")
def bench() -> dict[str, Any]:
    """benchmarks/host_syncs.py's globals, loaded as the doc checker loads it (not run)."""
    return runpy.run_path(str(ROOT / "benchmarks" / "host_syncs.py"), run_name="bench_test")


def lipt_sites(syncs: Any) -> dict[str, int]:
    return {f"{kind} {site}": n for (who, kind, site), n in syncs.by_site.items() if who == "lipt"}


def test_the_counters_see_reads_masks_and_blocking_moves(bench: dict[str, Any]) -> None:
    """What each counter counts, on CPU tensors: the waits they would be on CUDA."""
    syncs = bench["Syncs"]()
    x = torch.randn(256, 10)
    with bench["counting"](bench["Recorder"](syncs)):
        float(x.sum())  # a read
        x[x > 0]  # a boolean mask
        torch.nonzero(x)
        x.cpu()  # a blocking move (a copy to the host on CUDA)
        x.to("cpu", non_blocking=True)  # not a wait
        x.float().mean(0) * 2  # kernels alone
    kinds = sorted(kind for _, kind, _ in syncs.by_site)
    assert kinds == [".cpu()", "_local_scalar_dense", "index (bool mask)", "nonzero"], kinds
    assert syncs.of("plain") == 4 and syncs.of("lipt") == 0


def test_a_training_step_of_the_main_job_waits_only_for_its_nan_check(
    bench: dict[str, Any],
) -> None:
    """Per step of train.py's main training (dynamic pruning, resident batches with crop and
    flip, the default callbacks and logger), lipt's own code reads one value: the loss's NaN
    check, every step on the CPU (every log_every_n_steps steps on an accelerator). The
    resident batches' random crop and flip and their normalisation each moved a tensor from
    the host per batch (5 blocking copies a step, each a wait on CUDA)."""
    steps = 6
    syncs = bench["lipt_training"](steps, MAIN_JOB)
    sites = lipt_sites(syncs)
    assert syncs.of("lipt") == steps, sites
    assert list(sites) == [next(s for s in sites if "stop_if_diverged" in s)], sites
    assert sites[next(iter(sites))] == steps and "_local_scalar_dense" in next(iter(sites))


def test_a_pool_pass_batch_waits_for_nothing_of_lipts(bench: dict[str, Any]) -> None:
    """`model_outputs` over the resident pool loader: no wait of lipt's per batch. It copied
    each batch's four outputs to the host blocking, and the batch's normalisation moved its
    statistics there (7 waits a batch on CUDA); a plain loop's `.cpu()` of its logits waits
    once."""
    from lipt.run.config import run_of
    from lipt.stages.build import build_datamodule, build_model

    run = run_of(bench["compose_config"]("train", [*MAIN_JOB, "paths.output_dir=unused"]))
    dm = build_datamodule(run)
    model = build_model(run, 0)
    batches = 8
    syncs = bench["lipt_inference"](batches, model, dm)
    assert syncs.of("lipt") == 0, lipt_sites(syncs)
    plain = bench["plain_inference"](batches, model, torch.randn(batches * 256, 1, 28, 28))
    assert plain.of("plain") == batches  # the counter sees a plain loop's one wait a batch


@pytest.mark.gpu  # skipped without CUDA (conftest)
@pytest.mark.parametrize("resident", [True, False])
def test_the_pool_pass_on_cuda_reads_every_output_after_its_copy(
    bench: dict[str, Any], resident: bool
) -> None:
    """On CUDA the pass copies its outputs to the host without waiting and waits once at its
    end: every row must be the one computed (a read before its copy landed is garbage)."""
    from lipt.run.config import run_of
    from lipt.selection import model_outputs
    from lipt.stages.build import build_datamodule, build_model

    overrides = [*MAIN_JOB, f"dataset.resident={resident}", "paths.output_dir=unused"]
    run = run_of(bench["compose_config"]("train", overrides))
    passes = []
    for device in ("cpu", "cuda"):
        dm = build_datamodule(run)
        dm.device = device
        model = build_model(run, 0).to(device)
        passes.append(model_outputs(model, dm.pool_dataloader(), device))
    cpu, cuda = passes
    assert all(t.device.type == "cpu" for t in (cuda.logits, cuda.embeddings, cuda.indices))
    assert torch.equal(cuda.indices, cpu.indices) and torch.equal(cuda.targets, cpu.targets)
    torch.testing.assert_close(cuda.logits, cpu.logits, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(cuda.embeddings, cpu.embeddings, atol=1e-3, rtol=1e-3)
