"""GPU options on the CPU as well: bf16 autocast through `trainer.precision` with per-sample loss
weights, channels_last and torch.compile as model options that keep the state dict's names."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from lipt.models.classifier import Classifier
from lipt.run.config import run_of
from lipt.stages.build import build_datamodule, build_model
from tests.helpers import FAST


def _bf16_step_matches_fp32_weighted_loss(device: torch.device, make_cfg) -> None:
    model = build_model(run_of(make_cfg(["model=convnet", *FAST])), seed=0).to(device)
    module = Classifier(model, num_classes=4)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 1, 12, 12, generator=g).to(device)
    y = torch.randint(0, 4, (256,), generator=g).to(device)
    w = torch.rand(256, generator=g).to(device) * 3
    logits: list[torch.Tensor] = []
    model.classifier.register_forward_hook(lambda _m, _i, out: logits.append(out))
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = module.training_step((x, y, torch.arange(256), w), 0)
    assert logits[0].dtype == torch.bfloat16  # the model ran in bf16
    assert loss.dtype == torch.float32  # the weighted loss is reduced in fp32
    per_sample = F.cross_entropy(logits[0].float(), y, reduction="none")
    # fp32 up to the order of a CUDA reduction (2e-5 relative seen on an H200); a bf16
    # reduction would be ~4e-3 off
    torch.testing.assert_close(loss, (w * per_sample).sum() / w.sum(), rtol=1e-4, atol=1e-5)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        uniform = module.training_step((x, y, torch.arange(256), torch.ones_like(w)), 0)
    assert abs(float(loss - uniform)) > 1e-3  # the weights matter under bf16


def test_bf16_autocast_keeps_the_weighted_loss(make_cfg):
    _bf16_step_matches_fp32_weighted_loss(torch.device("cpu"), make_cfg)


@pytest.mark.gpu  # skipped without CUDA (conftest)
def test_bf16_autocast_keeps_the_weighted_loss_on_cuda(make_cfg):
    _bf16_step_matches_fp32_weighted_loss(torch.device("cuda"), make_cfg)


@pytest.mark.slow  # bf16 backward on the CPU: ~15 s the first time in a process
def test_bf16_mixed_precision_trains_end_to_end_on_resident_batches(make_cfg):
    """`trainer.precision=bf16-mixed`: Lightning's autocast around the module's steps, fed by
    the resident data path with subset weights; the parameters stay fp32 and it learns."""
    cfg = make_cfg([*FAST, "trainer.precision=bf16-mixed", "trainer.max_epochs=3"])
    # Shuffling draws from the global RNG: seeded, so the tests run before do not move the result.
    L.seed_everything(0, verbose=False)
    dm = build_datamodule(run_of(cfg))
    dm.set_subset(dm.pool_indices[:400], torch.linspace(0.5, 2.0, 400))
    module = Classifier(build_model(run_of(cfg), seed=0), num_classes=4)
    trainer = L.Trainer(
        accelerator="cpu",
        precision="bf16-mixed",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=dm)
    assert all(p.dtype == torch.float32 for p in module.parameters())
    assert module.samples_seen == 3 * 400
    accuracy = trainer.test(module, datamodule=dm, verbose=False)[0]["test/acc"]
    assert accuracy > 0.6  # 4 classes: chance is 0.25


@pytest.mark.parametrize(
    "option",
    ["channels_last", pytest.param("compile", marks=pytest.mark.slow)],  # compile: ~10 s
)
def test_model_speed_options_keep_names_and_outputs(make_cfg, option):
    plain = build_model(run_of(make_cfg([*FAST, "model.width=16"])), seed=0)
    fast = build_model(run_of(make_cfg([*FAST, "model.width=16", f"model.{option}=true"])), seed=0)
    assert list(fast.state_dict()) == list(plain.state_dict())  # checkpoints, soups unchanged
    assert type(fast) is type(plain)
    conv = fast.features[4].weight  # [32, 16, 3, 3]: the layout shows with > 1 input channel
    assert conv.is_contiguous(memory_format=torch.channels_last) == (option == "channels_last")
    x = torch.randn(64, 1, 12, 12)
    plain.eval(), fast.eval()
    torch.testing.assert_close(fast(x), plain(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fast.embed(x), plain.embed(x), rtol=1e-4, atol=1e-4)
    twin = copy.deepcopy(fast)  # soups and learners copy models
    torch.testing.assert_close(twin(x), plain(x), rtol=1e-4, atol=1e-4)
