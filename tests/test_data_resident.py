"""The device-resident data path: the same items as the DataLoader path, batches sliced from one
tensor, augmentation per sample on whole batches, seeded, DDP slicing, cheap re-selection."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from lipt.data.batch_transforms import (
    RANDAUGMENT_OPS,
    RandAugmentSettings,
    apply_op,
    augment_batch,
    rand_augment,
    random_crop,
    random_flip,
)
from lipt.data.resident import Augmentation, ResidentBatches, ResidentImages
from lipt.data.sources import load_fashion_mnist
from lipt.run.config import run_of
from lipt.stages.build import build_datamodule

FMNIST_MEAN, FMNIST_STD = [0.2860], [0.3530]


@pytest.fixture(scope="module")
def fashion_mnist():
    return load_fashion_mnist(None, download=False)


def _dm(make_cfg, data_dir, resident: bool, *extra: str):
    dm = build_datamodule(
        run_of(
            make_cfg(
                [
                    "dataset.val_size=50",
                    f"dataset.data_dir={data_dir}",
                    f"dataset.resident={str(resident).lower()}",
                    *extra,
                ]
            )
        )
    )
    # These compare the resident path with the DataLoader's on the CPU; with no Trainer attached,
    # a machine with CUDA would keep the resident copy there (the gpu-marked test's case).
    dm.device = "cpu"
    return dm


def _epoch(loader) -> list[tuple[torch.Tensor, ...]]:
    return [tuple(t.clone() for t in batch) for batch in loader]


def test_resident_evaluation_batches_equal_the_dataloader_path(make_cfg, fashion_mnist_dir):
    resident = _dm(make_cfg, fashion_mnist_dir, True)
    loader = _dm(make_cfg, fashion_mnist_dir, False)
    assert resident.is_resident and not loader.is_resident
    for name in ("pool_dataloader", "val_dataloader", "test_dataloader"):
        a, b = getattr(resident, name)(), getattr(loader, name)()
        assert isinstance(a, ResidentBatches)
        xa, ya, ia = (torch.cat(t) for t in zip(*a, strict=True))
        xb, yb, ib = (torch.cat(t) for t in zip(*b, strict=True))
        assert torch.equal(ia, ib) and torch.equal(ya, yb)
        torch.testing.assert_close(xa, xb, rtol=0, atol=1e-6)


def test_training_epoch_visits_the_subset_once_with_its_weights(make_cfg, fashion_mnist_dir):
    dm = _dm(make_cfg, fashion_mnist_dir, True, "batch_size=32")
    subset = dm.pool_indices[::2]  # 125 positions
    weights = subset.float() / 7 + 1  # a weight that names its sample
    dm.set_subset(subset, weights)
    loader = dm.train_dataloader()
    batches = _epoch(loader)
    assert len(batches) == len(loader) == math.ceil(125 / 32)
    idx = torch.cat([b[2] for b in batches])
    assert torch.equal(idx.sort().values, subset)  # each position exactly once
    assert not torch.equal(idx, subset)  # shuffled
    for x, y, i, w in batches:
        assert x.dtype == torch.float32 and x.shape[1:] == (1, 28, 28)
        assert torch.equal(y, dm.train_source.labels[i])
        torch.testing.assert_close(w, i.float() / 7 + 1)  # weights travel with their index
    again = torch.cat([b[2] for b in _epoch(loader)])
    assert not torch.equal(again, idx)  # a new permutation each epoch


def test_same_seed_same_batches_run_after_run(make_cfg, fashion_mnist_dir):
    def run(seed: int) -> list[list[tuple[torch.Tensor, ...]]]:
        dm = _dm(make_cfg, fashion_mnist_dir, True, "batch_size=64")
        L.seed_everything(seed, verbose=False)
        loader = dm.train_dataloader()
        shard = dm.shard_dataloader(dm.pool_indices[:100], {"num_ops": 2, "magnitude": 9})
        return [_epoch(loader), _epoch(loader), _epoch(shard)]

    first, second, other = run(0), run(0), run(1)
    for a, b in zip(first, second, strict=True):
        for ba, bb in zip(a, b, strict=True):
            assert all(torch.equal(ta, tb) for ta, tb in zip(ba, bb, strict=True))
    assert not torch.equal(first[0][0][2], other[0][0][2])


def test_reselection_swaps_positions_and_keeps_the_resident_copy(make_cfg, fashion_mnist_dir):
    dm = _dm(make_cfg, fashion_mnist_dir, True)
    dm.set_subset(dm.pool_indices[:40])
    first = torch.cat([b[2] for b in dm.train_dataloader()])
    copy = dm._resident_train._copies["cpu"]  # the device copy made for the first loader
    dm.set_subset(dm.pool_indices[100:130], torch.full((30,), 3.0))
    batches = _epoch(dm.train_dataloader())
    assert set(first.tolist()) == set(dm.pool_indices[:40].tolist())
    assert set(torch.cat([b[2] for b in batches]).tolist()) == set(
        dm.pool_indices[100:130].tolist()
    )
    assert all(torch.all(b[3] == 3.0) for b in batches)
    assert dm._resident_train._copies == {"cpu": copy}  # not copied again
    assert dm._resident_train._copies["cpu"] is copy


def test_ddp_ranks_take_disjoint_equal_parts_of_one_permutation(fashion_mnist):
    images = ResidentImages(fashion_mnist.train)
    positions = torch.arange(1_001, 3_000)  # 1,999 rows: odd, so one rank's part is padded
    parts = [
        ResidentBatches(
            images,
            positions,
            256,
            torch.device("cpu"),
            FMNIST_MEAN,
            FMNIST_STD,
            Augmentation(2, True),
            seed=5,
            world_size=2,
            rank=rank,
        )
        for rank in (0, 1)
    ]
    seen = [torch.cat([b[2] for b in part]) for part in parts]
    assert len(parts[0]) == len(parts[1]) == math.ceil(1_000 / 256)
    assert len(seen[0]) == len(seen[1]) == 1_000
    union = torch.cat(seen)
    assert set(union.tolist()) == set(positions.tolist())  # together: the whole subset
    assert len(set(seen[0].tolist()) & set(seen[1].tolist())) == 1  # only the one pad row


def test_crop_and_flip_draw_per_sample(fashion_mnist):
    image = fashion_mnist.train.images[0]  # [1, 28, 28]
    batch = image.expand(256, -1, -1, -1).contiguous()
    g = torch.Generator().manual_seed(0)
    cropped = random_crop(batch, 2, g)
    padded = torch.nn.functional.pad(image, (2, 2, 2, 2))
    crops = {(dy, dx): padded[:, dy : dy + 28, dx : dx + 28] for dy in range(5) for dx in range(5)}
    offsets = set()
    for out in cropped:
        match = [k for k, c in crops.items() if torch.equal(out, c)]
        assert match, "each output is a crop of the zero-padded image"
        offsets.add(match[0])
    assert len(offsets) >= 20  # 25 possible offsets, drawn per sample
    flipped = random_flip(batch, g)
    is_flipped = torch.tensor([torch.equal(o, image.flip(-1)) for o in flipped])
    assert torch.all(is_flipped | torch.tensor([torch.equal(o, image) for o in flipped]))
    assert 0.35 < float(is_flipped.float().mean()) < 0.65


def test_randaugment_draws_an_operation_per_sample(fashion_mnist):
    image = fashion_mnist.train.images[1].float()
    batch = image.expand(512, -1, -1, -1).contiguous()
    settings = RandAugmentSettings(num_ops=1, magnitude=9)
    out = rand_augment(batch, settings, torch.Generator().manual_seed(0))
    distinct = {tuple(o.flatten()[::7].tolist()) for o in out}
    # 14 operations x 2 signs for the signed ones; a whole-batch op would give one image.
    assert len(distinct) >= 15
    unchanged = sum(torch.equal(o, image) for o in out)
    assert 0 < unchanged < 512 // 4  # identity (and no-op draws), not most samples


def _torchvision_op(op: str, img: torch.Tensor, m: float) -> torch.Tensor:
    nearest = InterpolationMode.NEAREST
    if op in ("shear_x", "shear_y"):
        angle = math.degrees(math.atan(m))
        shear = [angle, 0.0] if op == "shear_x" else [0.0, angle]
        return TF.affine(img, 0.0, [0, 0], 1.0, shear, nearest, 0, center=[0, 0])
    if op in ("translate_x", "translate_y"):
        shift = [int(m), 0] if op == "translate_x" else [0, int(m)]
        return TF.affine(img, 0.0, shift, 1.0, [0.0, 0.0], nearest, 0)
    if op == "rotate":
        return TF.rotate(img, m, nearest, fill=0)
    factor = {
        "brightness": TF.adjust_brightness,
        "contrast": TF.adjust_contrast,
        "sharpness": TF.adjust_sharpness,
        "color": TF.adjust_saturation,
    }
    if op in factor:
        return factor[op](img, 1.0 + m)
    if op == "posterize":
        return TF.posterize(img, int(m))
    if op == "solarize":
        return TF.solarize(img, m)
    return {"autocontrast": TF.autocontrast, "equalize": TF.equalize}[op](img)


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("op", [op for op in RANDAUGMENT_OPS if op != "identity"])
def test_each_randaugment_operation_matches_torchvision(fashion_mnist, op, channels):
    """Per-sample magnitudes and signs; at most a level of rounding apart from torchvision's
    uint8 result on (nearly) every pixel."""
    images = fashion_mnist.train.images[:64]
    if channels == 3:  # colour images: three different grey images as R, G, B
        images = torch.cat([images, fashion_mnist.train.images[64:128], images.flip(-1)], 1)
    magnitude = {
        "shear_x": 0.2,
        "shear_y": 0.2,
        "translate_x": 9.0,
        "translate_y": 6.0,
        "rotate": 20.0,
        "brightness": 0.5,
        "color": 0.6,
        "contrast": 0.5,
        "sharpness": 0.7,
        "posterize": 4.0,
        "solarize": 128.0,
    }.get(op, 0.0)
    signs = torch.where(torch.arange(64) % 2 == 0, 1.0, -1.0)
    m = magnitude * signs if op not in ("posterize", "solarize") else torch.full((64,), magnitude)
    ours = apply_op(op, images.float(), m)
    ref = torch.stack(
        [_torchvision_op(op, img, float(k)) for img, k in zip(images, m, strict=True)]
    )
    close = ((ours - ref.float()).abs() <= 1.0).float().mean()
    assert float(close) >= 0.97, f"{op}: {float(close):.3f} of pixels within one level"


def test_augment_batch_is_the_same_on_any_device_given_the_seed(fashion_mnist):
    """The CPU run of the function the CUDA path runs (device is a parameter)."""
    _same_batches_on(torch.device("cpu"), fashion_mnist)


@pytest.mark.gpu  # skipped without CUDA (conftest)
def test_resident_batches_on_cuda_equal_the_cpu_ones(fashion_mnist):
    _same_batches_on(torch.device("cuda"), fashion_mnist)
    images = ResidentImages(fashion_mnist.train)
    first = images.on(torch.device("cuda"))[0]
    assert images.on(torch.device(f"cuda:{torch.cuda.current_device()}"))[0] is first


def test_cuda_and_its_current_device_share_one_resident_copy(monkeypatch):
    """The learners and the soup ask for "cuda", the trainer for "cuda:0": the split was copied
    to the one GPU twice."""
    from lipt.data.resident import copy_key

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert copy_key(torch.device("cuda")) == copy_key("cuda:1") == "cuda:1"
    assert copy_key("cuda:0") == "cuda:0" and copy_key(torch.device("cpu")) == "cpu"


def _same_batches_on(device: torch.device, fashion_mnist) -> None:
    images = ResidentImages(fashion_mnist.train)
    positions = torch.arange(0, 2_000)
    aug = Augmentation(2, True, RandAugmentSettings(2, 9))
    weights = torch.rand(2_000)
    reference, batches = (
        _epoch(ResidentBatches(images, positions, 500, d, FMNIST_MEAN, FMNIST_STD, aug, weights, 3))
        for d in (torch.device("cpu"), device)
    )
    assert images.on(device)[0].device.type == device.type  # the uint8 copy lives there
    for ours, ref in zip(batches, reference, strict=True):
        assert all(t.device.type == device.type for t in ours)
        assert torch.equal(ours[2].cpu(), ref[2]) and torch.equal(ours[3].cpu(), ref[3])
        # Same parameters; pixels may differ only by float rounding at nearest-sample edges.
        differ = ((ours[0].cpu() - ref[0]).abs() > 1e-3).float().mean()
        assert float(differ) < 1e-3
    plain = augment_batch(images.on(device)[0][:8], torch.Generator(), FMNIST_MEAN, FMNIST_STD)
    expected = (fashion_mnist.train.images[:8].float() / 255 - 0.2860) / 0.3530
    torch.testing.assert_close(plain.cpu(), expected)


def test_epoch_source_draws_that_epochs_order_and_augmentation(fashion_mnist):
    """A loader made after a resume (or by a re-selection's reload) asks the trainer's epoch
    when its iteration starts and draws exactly what the uninterrupted loader drew then."""
    images = ResidentImages(fashion_mnist.train)
    positions = torch.arange(0, 2_000)
    aug = Augmentation(2, True, RandAugmentSettings(2, 9))

    def loader(source=None) -> ResidentBatches:
        cpu = torch.device("cpu")
        return ResidentBatches(
            images, positions, 500, cpu, FMNIST_MEAN, FMNIST_STD, aug, seed=3, epoch_source=source
        )

    running = loader()
    epochs = [_epoch(running) for _ in range(3)]  # epochs 0, 1, 2 of one loader
    trainer_epoch = 2
    fresh = loader(lambda: trainer_epoch)
    for ours, ref in zip(_epoch(fresh), epochs[2], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))
    assert not torch.equal(epochs[2][0][2], epochs[0][0][2])  # epochs do differ
    unknown = loader(lambda: None)  # no trainer attached: it counts its own iterations
    assert torch.equal(_epoch(unknown)[0][2], epochs[0][0][2])
    assert torch.equal(_epoch(unknown)[0][2], epochs[1][0][2])
