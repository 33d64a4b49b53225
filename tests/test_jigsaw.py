"""The jigsaw pre-training stage (lipt.stages.jigsaw), end to end on the synthetic data set:
its learners, soups, failures, reuse on resumes and multirun halves; and what every pre-training
leaves to the stages after it (pretrain.ckpt's data split, the opening line)."""

from __future__ import annotations

import copy
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import TensorDataset

import lipt
import lipt.jigsaw.checkpoints
import lipt.stages.build
from lipt.core.errors import UserError
from lipt.data import DataModule
from lipt.jigsaw import api as jigsaw_api
from lipt.jigsaw import learner as jigsaw_learner
from lipt.jigsaw import strategy as jigsaw_strategy
from lipt.jigsaw.checkpoints import recipe, recipe_difference
from lipt.jigsaw.context import heads_from_payload
from lipt.jigsaw.learner import Learner, learner_shards, state_digest
from lipt.jigsaw.merge import HeldOut, bn_positions, merge_learners
from lipt.jigsaw.parts import (
    GreedyInterpMerge,
    MagnitudePruning,
    RandAugment,
    RandomPruning,
    SnipPruning,
)
from lipt.jigsaw.weights import recompute_batchnorm_stats
from lipt.run.config import run_of, validate
from lipt.run.hydra_callbacks import learner_sweep
from lipt.run.sweep_settings import check_learner_sweep
from lipt.stages import jigsaw as jigsaw_stage
from lipt.stages.build import build_datamodule, build_model, build_part, build_parts
from lipt.stages.pretrain import load_pretrained, pretrain_model, ranking_models
from lipt.stages.pretrain import run as pretrain_run
from tests.helpers import run_entry

N, M, K, B = 4, 1, 2, 32
# Small and quick: 4 learners, 2 passes over one minibatch of 32 each, 5 interpolation ratios,
# one thread on the CPU (so learners are bit-identical across processes, GPU or not).
JIGSAW = [
    "pretrain=jigsaw",
    "trainer.accelerator=cpu",
    "dataset=synthetic",
    "model.width=8",
    f"batch_size={B}",
    "logger=none",
    f"pretrain.num_learners={N}",
    f"pretrain.batches_per_learner={M}",
    f"pretrain.local_epochs={K}",
    "pretrain.num_threads=1",
]
FEW_RATIOS = "merge.ratios=5"  # of the default merge=greedy_interp


@pytest.fixture
def jigsaw_cfg(make_cfg: Callable[..., DictConfig]) -> Callable[..., DictConfig]:
    def _make(*overrides: str) -> DictConfig:
        other_merge = any(o.startswith("merge=") for o in overrides)
        ratios = [] if other_merge else [FEW_RATIOS]
        return make_cfg([*JIGSAW, *ratios, *overrides], config_name="pretrain")

    return _make


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _learner_files(run_dir: Path) -> list[dict]:
    """The learner checkpoints a run wrote to its learners/ folder, by id."""
    paths = (run_dir / "learners").glob("learner_*.ckpt")
    return [_load(p) for p in sorted(paths, key=lambda p: int(p.stem.split("_")[1]))]


def _accuracy(model: torch.nn.Module, dm: DataModule) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y, _ in dm.val_dataloader():
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return correct / total


# --------------------------------------------------------------------------- the stage


def test_stage_writes_learners_with_disjoint_shards_and_counts_samples(
    jigsaw_cfg, tmp_path, monkeypatch
):
    cfg = jigsaw_cfg("pretrain.batches_per_learner=2")
    n, m = N, 2
    # What the learners were actually given to train on.
    given: list[torch.Tensor] = []
    original = DataModule.shard_dataloader

    def spy(self, positions, randaugment):
        given.append(positions.clone())
        assert randaugment == {"num_ops": 1, "magnitude": 9, "num_magnitude_bins": 31}
        return original(self, positions, randaugment)

    monkeypatch.setattr(DataModule, "shard_dataloader", spy)
    summary = pretrain_run(validate(cfg))

    stats = summary["stages"]["pretrain"]
    assert stats["samples"] == n * K * m * B  # the shard divides evenly into minibatches
    assert stats["unique_samples"] == n * m * B
    assert json.loads((tmp_path / "summary.json").read_text())["stages"]["pretrain"] == stats
    # The stage's seconds, split: the learners' training and the merge apart.
    assert 0 < stats["merge_seconds"] < stats["seconds"]
    assert 0 < stats["learner_seconds"] < stats["seconds"]
    assert stats["merge_seconds"] + stats["learner_seconds"] <= stats["seconds"]

    dm = build_datamodule(run_of(cfg))
    shards = []
    for i in range(n):
        ckpt = _load(tmp_path / "learners" / f"learner_{i}.ckpt")
        assert ckpt["learner"] == i and ckpt["pretrain"] == "jigsaw"
        assert torch.equal(ckpt["shard"], given[i])
        shards.append(ckpt["shard"])
    union = torch.cat(shards)
    assert len(union) == len(union.unique()) == n * m * B  # disjoint, exactly n*M*B
    assert bool(torch.isin(union, dm.pool_indices).all())  # never the validation split
    assert not bool(torch.isin(union, dm.val_indices).any())

    # select.py ckpt_path=pretrain.ckpt reads the soup.
    soup = _load(tmp_path / "pretrain.ckpt")
    model = load_pretrained(run_of(cfg), build_parts(run_of(cfg), dm), tmp_path / "pretrain.ckpt")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in soup["state_dict"].items())
    # One learner's checkpoint is no soup, and records no split to check: refused, naming the
    # soup and the merge.
    learner_0 = tmp_path / "learners" / "learner_0.ckpt"
    with pytest.raises(
        UserError, match=r"one jigsaw learner's checkpoint, not the soup;.*merge_from"
    ):
        load_pretrained(run_of(cfg), build_parts(run_of(cfg), dm), learner_0)
    # ... and the learners' heads, for the coverage selector's ensemble (no second training).
    heads = heads_from_payload(soup)
    assert heads is not None and len(heads) == n
    for i in range(n):
        state = _load(tmp_path / "learners" / f"learner_{i}.ckpt")["state_dict"]
        assert torch.equal(heads.weight[i], state["classifier.weight"])
        assert torch.equal(heads.bias[i], state["classifier.bias"])
    report = json.loads((tmp_path / "merge_report.json").read_text())
    assert [le["id"] for le in report["learners"]] == list(range(n))
    for key in ("kept", "ratios", "soup_accuracy", "best_learner_accuracy", "trials"):
        assert key in report
    assert all(0 <= le["accuracy"] <= 1 for le in report["learners"])
    assert report["eval_split"] == "validation" and report["eval_size"] == len(dm.val_indices)


def test_learners_start_from_one_init_and_end_with_different_masks(
    jigsaw_cfg, monkeypatch, tmp_path
):
    cfg = jigsaw_cfg()
    dm = build_datamodule(run_of(cfg))
    starts: list[dict[str, torch.Tensor]] = []
    original = lipt.stages.build.build_classifier

    def spy(cfg, model, **optim):
        starts.append({k: v.clone() for k, v in model.state_dict().items()})
        return original(cfg, model, **optim)

    monkeypatch.setattr(lipt.stages.build, "build_classifier", spy)
    pretrain_model(build_parts(run_of(cfg), dm), seed=0)

    init = build_model(run_of(cfg), 0).state_dict()
    assert len(starts) == N
    for start in starts:
        assert start.keys() == init.keys()
        assert all(torch.equal(start[k], init[k]) for k in init)

    learners = [p["state_dict"] for p in _learner_files(tmp_path)]
    densities = [p["density"] for p in _learner_files(tmp_path)]
    assert len(set(densities)) == N and all(0.85 <= d <= 0.95 for d in densities)
    masks = [
        torch.cat([sd[k].ne(0).flatten() for k in sd if k.endswith("weight") and sd[k].ndim > 1])
        for sd in learners
    ]
    for i in range(N):
        assert abs(float(masks[i].float().mean()) - densities[i]) < 0.01
        for j in range(i + 1, N):
            assert not torch.equal(masks[i], masks[j])


@pytest.mark.parametrize(
    ("merge", "search"), [("greedy", None), ("greedy_interp", "grid"), ("greedy_interp", "scan")]
)
def test_greedy_soup_never_scores_below_its_best_learner(jigsaw_cfg, merge, search):
    interp = merge == "greedy_interp"
    cfg = jigsaw_cfg(f"merge={merge}", *([FEW_RATIOS, f"merge.search={search}"] if interp else []))
    dm = build_datamodule(run_of(cfg))
    result = pretrain_model(build_parts(run_of(cfg), dm), seed=0)
    report = result.report
    scores = [le["accuracy"] for le in report["learners"]]
    assert report["soup_accuracy"] >= max(scores)
    assert report["best_learner_accuracy"] == max(scores)
    # Each distinct candidate is scored once: alpha = 1 of the grid blends the soup into exactly
    # the candidate learner, scored already (so one re-use per trial at alpha = 1, and no more).
    trials = report["trials"]
    reused = sum(t["alpha"] == 1.0 for t in trials) if interp else 0
    if search == "scan":  # from the smallest ratio up, stopped at the first drop
        assert (N - 1) <= len(trials) < (N - 1) * 5
    else:
        assert len(trials) == (N - 1) * (5 if search == "grid" else 1)
    assert report["evaluations_reused"] == reused
    assert report["evaluations"] == 1 + N + len(trials) - reused  # 1: the init
    # Scored independently on the whole validation split, the returned model is what the soup
    # reported (BatchNorm statistics recomputed as when it was scored).
    assert _accuracy(result.model, dm) == pytest.approx(report["soup_accuracy"], abs=1e-9)


def test_held_out_scores_in_channels_last_as_the_model_does_and_the_soup_keeps_its_format(
    make_cfg, fashion_mnist_dir
):
    # Fashion-MNIST shapes and the default convnet width: NHWC scoring is only a speed-up.
    cfg = make_cfg(
        [
            "pretrain=jigsaw",
            "dataset=fashion_mnist",
            f"dataset.data_dir={fashion_mnist_dir}",
            "dataset.download=false",
            "dataset.val_size=100",
            "trainer.accelerator=cpu",
            "logger=none",
            "pretrain.num_learners=4",
            "batch_size=32",
            FEW_RATIOS,
        ],
        config_name="pretrain",
    )
    dm = build_datamodule(run_of(cfg))
    init = build_model(run_of(cfg), 0)
    ctx, settings = (
        build_parts(run_of(cfg), dm).context,
        build_part(run_of(cfg).node("pretrain")),
    )
    evaluate = HeldOut(ctx.merge, ctx.device, dm, init, 0, bn_positions(settings, ctx.merge, dm, 0))
    assert evaluate.model.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    digest = state_digest(init.state_dict())
    learners = []
    for i, shard in enumerate(learner_shards(settings, dm, 0)):
        g = torch.Generator().manual_seed(i)
        state = {
            k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in init.state_dict().items()
        }
        learners.append(Learner(i, shard, state_dict=state, init_digest=digest))
        # The reference: the model in its own (NCHW) format, statistics re-estimated likewise.
        reference = copy.deepcopy(init)
        reference.load_state_dict(state)
        recompute_batchnorm_stats(reference, [x.contiguous() for x in evaluate.bn_batches])
        assert evaluate(state) == _accuracy(reference, dm)

    model, report = merge_learners(ctx, settings, dm, init, 0, learners, evaluate)
    assert len(report["kept"]) > 1  # a blend, so the statistics below are the soup's own
    assert all(p.is_contiguous() for p in model.parameters())  # NCHW, as the model was built
    # The soup's statistics are its own: re-estimated on NCHW batches, not one bit changes.
    again = copy.deepcopy(model)
    recompute_batchnorm_stats(again, [x.contiguous() for x in evaluate.bn_batches])
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in model.state_dict().items())
    assert _accuracy(model, dm) == pytest.approx(report["soup_accuracy"], abs=1e-9)


def test_uniform_soup_without_bn_recompute_averages_all_learners(jigsaw_cfg, tmp_path):
    cfg = jigsaw_cfg("merge=uniform", "merge.recompute_bn=false", "prune=none", "augment=none")
    dm = build_datamodule(run_of(cfg))
    result = pretrain_model(build_parts(run_of(cfg), dm), seed=0)
    assert result.report["kept"] == list(range(N))
    learners = [p["state_dict"] for p in _learner_files(tmp_path)]
    for key, value in result.model.state_dict().items():
        if value.is_floating_point():
            expected = torch.stack([sd[key] for sd in learners]).mean(0)
            assert torch.allclose(value, expected, atol=1e-6), key
    assert all(p["density"] == 1.0 for p in _learner_files(tmp_path))


def test_learner_depends_on_seed_and_id_not_on_global_rng(jigsaw_cfg):
    cfg = jigsaw_cfg()
    dm = build_datamodule(run_of(cfg))
    init = build_model(run_of(cfg), 0)
    ctx, settings = (
        build_parts(run_of(cfg), dm).context,
        build_part(run_of(cfg).node("pretrain")),
    )
    shard = jigsaw_learner.learner_shard(settings, dm, 0, 2)
    assert torch.equal(shard, jigsaw_learner.learner_shards(settings, dm, 0)[2])
    torch.manual_seed(123)
    a = jigsaw_learner.train_learner(ctx, settings, dm, init, 0, 2, shard)
    torch.manual_seed(7)
    torch.rand(1000)
    b = jigsaw_learner.train_learner(ctx, settings, dm, init, 0, 2, shard)
    assert a.state_dict is not None and b.state_dict is not None
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    # another id: other augmentations
    c = jigsaw_learner.train_learner(ctx, settings, dm, init, 0, 3, shard)
    assert c.state_dict is not None
    assert not all(torch.equal(a.state_dict[k], c.state_dict[k]) for k in a.state_dict)


# --------------------------------------------------------------------------- failures


def _poison(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    bad = {k: v.clone() for k, v in state_dict.items()}
    first = next(k for k, v in bad.items() if v.is_floating_point())
    bad[first].view(-1)[0] = float("nan")
    return bad


def test_diverged_and_failed_learners_are_left_out_with_a_warning(
    jigsaw_cfg, monkeypatch, caplog, tmp_path
):
    cfg = jigsaw_cfg()
    dm = build_datamodule(run_of(cfg))
    calls = {"state": 0, "prune": 0}
    state_dict_cpu, prune = jigsaw_learner.state_dict_cpu, jigsaw_learner.prune_learner

    def nan_for_learner_1(model):
        calls["state"] += 1
        sd = state_dict_cpu(model)
        return _poison(sd) if calls["state"] == 2 else sd

    def raise_for_learner_3(ctx, dm, model, seed, learner, shard):
        if learner == 3:
            raise RuntimeError("out of memory (simulated)")
        return prune(ctx, dm, model, seed, learner, shard)

    monkeypatch.setattr(jigsaw_learner, "state_dict_cpu", nan_for_learner_1)
    monkeypatch.setattr(jigsaw_learner, "prune_learner", raise_for_learner_3)
    with caplog.at_level(logging.WARNING, logger="lipt.jigsaw"):
        result = pretrain_model(build_parts(run_of(cfg), dm), seed=0)
    report = result.report
    status = {le["id"]: le["status"] for le in report["learners"]}
    assert status == {0: "ok", 1: "diverged", 2: "ok", 3: "failed"}
    assert report["left_out"] == [1, 3]
    assert set(report["kept"]) <= {0, 2}
    assert "out of memory" in report["learners"][3]["error"]
    assert "learner 1 diverged" in caplog.text and "learner 3 failed" in caplog.text
    assert all(torch.isfinite(v).all() for v in result.model.state_dict().values())
    # Its data was read and its steps were taken: the cost still counts.
    assert result.samples == N * K * M * B and result.unique_samples == N * M * B
    # The diverged learner's checkpoint is still written (for inspection); the failed one has none.
    assert [p["learner"] for p in _learner_files(tmp_path)] == [0, 1, 2]


def test_no_learner_left_is_a_clear_error(jigsaw_cfg, monkeypatch):
    cfg = jigsaw_cfg()
    dm = build_datamodule(run_of(cfg))
    monkeypatch.setattr(jigsaw_learner, "state_dict_cpu", lambda model: _poison(model.state_dict()))
    with pytest.raises(UserError, match=r"no jigsaw learner is left to merge: all 4 diverged"):
        pretrain_model(build_parts(run_of(cfg), dm), seed=0)


def test_shards_larger_than_the_pool_are_a_clear_error(jigsaw_cfg):
    cfg = jigsaw_cfg("pretrain.num_learners=20")  # 20 * 1 * 32 > the pool of 500
    dm = build_datamodule(run_of(cfg))
    with pytest.raises(UserError, match=r"pretrain\.num_learners"):
        pretrain_model(build_parts(run_of(cfg), dm), seed=0)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("pretrain.learners=[0,4]", "pretrain.learners"),
        ("pretrain.learners=[1,1]", "pretrain.learners"),
        ("pretrain.num_threads=0", "pretrain.num_threads"),
        ("prune.density_low=0", "prune.density_low"),
        ("prune.density_high=1.5", "prune.density_high"),
        ("merge.ratios=0", "merge.ratios"),
        ("merge.ratios=[0.0]", "merge.ratios"),
        ("merge.ratios=sometimes", "merge.ratios"),
        ("merge.bn_batches=0", "merge.bn_batches"),
        ("merge.search=golden", "merge.search"),
        ("merge.eval_size=0", "merge.eval_size"),
        ("augment.magnitude=31", "augment.magnitude"),
        ("augment.num_ops=15", "augment.num_ops"),
        ("pretrain.local_epochs=0", "pretrain.local_epochs"),
    ],
)
def test_bad_jigsaw_settings_are_refused(jigsaw_cfg, override, needle):
    with pytest.raises(UserError, match=needle.replace(".", r"\.")):
        validate(jigsaw_cfg(override))


def test_good_jigsaw_settings_pass(jigsaw_cfg):
    for overrides in (
        [],
        ["pretrain.learners=3"],
        ["pretrain.learners=[0,2]"],
        ["merge.ratios=running_mean"],
        ["merge.ratios=[0.25,0.5,1.0]"],
        ["merge.search=scan"],
        ["prune=snip", "augment=none", "merge=uniform", "merge.eval_size=50"],
        ["prune=none", "merge=greedy"],
    ):
        validate(jigsaw_cfg(*overrides))


def test_a_bad_learner_sweep_fails_before_any_job(tmp_path):
    out = run_entry(
        "pretrain.py",
        ["-m", *JIGSAW, "pretrain.learners=range(6)", f"hydra.sweep.dir={tmp_path}/sweep"],
        timeout=120,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "pretrain.learners=4 is invalid" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "sweep").exists()


def test_learner_ids_are_for_multirun_jobs_only(jigsaw_cfg):
    cfg = jigsaw_cfg("pretrain.learners=1")
    with pytest.raises(UserError, match=r"pretrain\.learners selects learners"):
        pretrain_model(build_parts(run_of(cfg)), seed=0)


def test_snip_and_random_pruning_run(jigsaw_cfg, tmp_path):
    for method in ("snip", "random"):
        cfg = jigsaw_cfg(f"prune={method}", "pretrain.num_learners=2", "merge=uniform")
        result = pretrain_model(build_parts(run_of(cfg)), seed=0)
        extra = B if method == "snip" else 0  # SNIP's one forward+backward batch per learner
        assert result.samples == 2 * (K * M * B + extra)
        assert all(0.85 <= p["density"] <= 0.95 for p in _learner_files(tmp_path))


# --------------------------------------------------------------------------- reuse and resumes


def _recipe(cfg: DictConfig) -> dict:
    parts = build_parts(run_of(cfg))
    return recipe(parts.context, parts.pretrain, parts.dm, 0)


@pytest.mark.parametrize(
    "override",
    [
        "+trainer.max_steps=1",
        "trainer.precision=bf16-mixed",
        "+trainer.gradient_clip_val=0.01",
        "+trainer.accumulate_grad_batches=4",
        "+trainer.limit_train_batches=1",
        "dataset.flip=false",
        "dataset.crop_padding=0",
        "dataset.mean=[0.4]",
    ],
)
def test_a_setting_that_changes_a_learner_changes_its_recipe(jigsaw_cfg, override):
    changed = override.lstrip("+").split("=")[0].replace("dataset.", "inputs.")
    assert recipe_difference(_recipe(jigsaw_cfg()), _recipe(jigsaw_cfg(override))) == [changed]


def test_main_trainings_epochs_devices_and_logging_leave_the_recipe_as_it_is(jigsaw_cfg):
    base = _recipe(jigsaw_cfg())
    for override in (
        "trainer.max_epochs=3",
        "trainer.devices=2",
        "trainer.accelerator=auto",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
    ):
        assert _recipe(jigsaw_cfg(override)) == base, override


def test_learners_of_other_trainer_settings_are_trained_again_not_reused(
    jigsaw_cfg, tmp_path, caplog
):
    one_step = jigsaw_cfg("+trainer.max_steps=1")
    pretrain_model(build_parts(run_of(one_step)), seed=0)
    assert [p["samples"] for p in _learner_files(tmp_path)] == [B] * N
    cfg = jigsaw_cfg()  # the same run folder, every learner's step limit lifted
    with caplog.at_level(logging.WARNING, logger="lipt.jigsaw"):
        result = pretrain_model(build_parts(run_of(cfg)), seed=0)
    assert caplog.text.count("is trained again") == N and "trainer.max_steps" in caplog.text
    assert result.samples == N * K * M * B
    assert [p["samples"] for p in _learner_files(tmp_path)] == [K * M * B] * N


def _took(path: Path, seconds: float) -> None:
    """As if the learner at `path` had trained for `seconds` in an earlier attempt."""
    payload = _load(path)
    payload["seconds"] = seconds
    torch.save(payload, path)


def test_a_resumed_stage_counts_the_seconds_of_the_learners_it_reuses(jigsaw_cfg, tmp_path):
    cfg = jigsaw_cfg()
    pretrain_model(build_parts(run_of(cfg)), seed=0)
    for path in (tmp_path / "learners").glob("learner_*.ckpt"):
        _took(path, 100.0)
    stats = pretrain_model(build_parts(run_of(cfg)), seed=0).stats()
    assert stats["learner_seconds"] == N * 100.0  # every learner reused
    assert stats["learner_seconds"] + stats["merge_seconds"] <= stats["seconds"]


def test_a_rerun_learner_job_counts_the_seconds_of_the_learners_it_reuses(jigsaw_cfg, tmp_path):
    job = jigsaw_cfg("pretrain.learners=[0]", f"pretrain.learner_dir={tmp_path}/shared")
    jigsaw_stage.run_learner_job(run_of(job))
    _took(tmp_path / "shared" / "learner_0.ckpt", 100.0)
    stats = jigsaw_stage.run_learner_job(run_of(job))["stages"]["pretrain"]
    assert stats["learners"][0]["seconds"] == 100.0 and stats["seconds"] >= 100.0


def test_a_learner_job_refuses_another_settings_learner_in_its_shared_folder(jigsaw_cfg, tmp_path):
    """A shared learner folder holds the other jobs' work: a job of another seed (a sweep of
    `seed` beside `pretrain.learners`) stops rather than replace their checkpoints."""
    shared = f"pretrain.learner_dir={tmp_path}/shared"
    jigsaw_stage.run_learner_job(run_of(jigsaw_cfg("pretrain.learners=[0]", shared)))
    before = (tmp_path / "shared" / "learner_0.ckpt").read_bytes()
    other = jigsaw_cfg("pretrain.learners=[0]", shared, "seed=1")
    with pytest.raises(UserError, match=r"learner_0\.ckpt was trained with other settings \(seed"):
        jigsaw_stage.run_learner_job(run_of(other))
    assert (tmp_path / "shared" / "learner_0.ckpt").read_bytes() == before
    # an in-process run given that folder (pretrain.learner_dir) leaves it as it is too
    in_process = jigsaw_cfg(shared, "seed=1")
    with pytest.raises(UserError, match=r"shares the folder; give each setting its own"):
        pretrain_model(build_parts(run_of(in_process)), seed=1)
    assert (tmp_path / "shared" / "learner_0.ckpt").read_bytes() == before


def test_a_learner_another_run_wrote_while_this_one_trained_it_is_not_replaced(
    jigsaw_cfg, tmp_path, monkeypatch
):
    """Two runs of other seeds sharing a learner folder both found learner 0 missing and both
    trained it; the later write replaced the other's, which then failed at its merge after all
    its training. The one finishing second now finds the other's and stops, replacing nothing."""
    theirs = tmp_path / "theirs"
    jigsaw_stage.run_learner_job(
        run_of(jigsaw_cfg("pretrain.learners=[0]", f"pretrain.learner_dir={theirs}"))
    )
    shared = tmp_path / "shared"
    train_learner = lipt.jigsaw.checkpoints.train_learner

    def the_other_run_finishes_first(*args, **kwargs):  # type: ignore[no-untyped-def]
        trained = train_learner(*args, **kwargs)
        shared.mkdir(exist_ok=True)
        (shared / "learner_0.ckpt").write_bytes((theirs / "learner_0.ckpt").read_bytes())
        return trained

    monkeypatch.setattr(lipt.jigsaw.checkpoints, "train_learner", the_other_run_finishes_first)
    ours = jigsaw_cfg("pretrain.learners=[0]", f"pretrain.learner_dir={shared}", "seed=1")
    with pytest.raises(UserError, match=r"learner_0\.ckpt was trained with other settings \(seed"):
        jigsaw_stage.run_learner_job(run_of(ours))
    assert (shared / "learner_0.ckpt").read_bytes() == (theirs / "learner_0.ckpt").read_bytes()


def _soup_without_training(make_cfg: Callable[..., DictConfig], *overrides: str) -> DictConfig:
    """pretrain=none's config: its pretrain.ckpt records the split as a soup's does."""
    return make_cfg(
        [
            "pretrain=none",
            "trainer.accelerator=cpu",
            "dataset=synthetic",
            "model.width=8",
            "logger=none",
            *overrides,
        ],
        config_name="pretrain",
    )


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("dataset.split_seed=1", r"split_seed 0, this run 1\); pass dataset\.split_seed=0,"),
        ("dataset.val_size=50", r"val_size 100, this run 50\); pass dataset\.val_size=100,"),
        ("dataset.pool_size=200", r"a pool of 500 rows, this run 200\); pass dataset\.pool_size"),
        ("dataset.label_noise.rate=0.4", r"\(other labels\); pass dataset\.label_noise"),
    ],
)
def test_a_pretrain_checkpoint_of_another_split_is_refused(make_cfg, tmp_path, override, needle):
    pretrain_run(run_of(_soup_without_training(make_cfg)))
    ckpt = tmp_path / "pretrain.ckpt"
    same = run_of(_soup_without_training(make_cfg))
    load_pretrained(same, build_parts(same), ckpt)
    other = run_of(_soup_without_training(make_cfg, override))
    with pytest.raises(UserError, match=needle):
        load_pretrained(other, build_parts(other), ckpt)


def test_a_pretrain_checkpoint_of_another_model_is_refused_naming_the_key(make_cfg, tmp_path):
    """model.width=16 beside a soup of width 8: the setting and both values, not torch's
    "Error(s) in loading state_dict for ConvNet:" with nothing after it."""
    pretrain_run(run_of(_soup_without_training(make_cfg)))
    ckpt = tmp_path / "pretrain.ckpt"
    wider = run_of(_soup_without_training(make_cfg, "model.width=16"))
    with pytest.raises(UserError) as caught:
        load_pretrained(wider, build_parts(wider), ckpt)
    message = str(caught.value)
    assert "model.width=8, this run 16" in message and "\n" not in message, message
    # a checkpoint that records no model: torch's first reason, not its empty heading
    payload = _load(ckpt)
    del payload["model"]
    torch.save(payload, ckpt)
    with pytest.raises(UserError, match=r"does not fit model=lipt\.models\.ConvNet \(\w"):
        load_pretrained(wider, build_parts(wider), ckpt)


def test_main_trainings_checkpoint_is_no_pretrain_checkpoint(make_cfg, tmp_path):
    """select.py ckpt_path=<a train.py run>/checkpoints/last.ckpt: said so, where it was
    "pre-trained on None"."""
    pretrain_run(run_of(_soup_without_training(make_cfg)))
    soup = _load(tmp_path / "pretrain.ckpt")
    # Lightning's layout: the Classifier's keys under model., its version, epoch and loops
    lightning = {
        "epoch": 0,
        "global_step": 16,
        "pytorch-lightning_version": "2.6.6",
        "state_dict": {f"model.{k}": v for k, v in soup["state_dict"].items()},
        "loops": {},
        "callbacks": {},
        "optimizer_states": [],
        "lr_schedulers": [],
    }
    last = tmp_path / "last.ckpt"
    torch.save(lightning, last)
    run = run_of(_soup_without_training(make_cfg))
    with pytest.raises(UserError, match=r"is a checkpoint of main training \(train\.py\), not"):
        load_pretrained(run, build_parts(run), last)


def test_a_pretrain_checkpoint_that_records_no_split_is_loaded_with_a_warning(
    make_cfg, tmp_path, caplog
):
    pretrain_run(run_of(_soup_without_training(make_cfg)))
    ckpt = tmp_path / "pretrain.ckpt"
    payload = _load(ckpt)
    del payload["split"]  # as pretrain.ckpt was written before it recorded one
    torch.save(payload, ckpt)
    other = run_of(_soup_without_training(make_cfg, "dataset.split_seed=1"))
    with caplog.at_level(logging.WARNING, logger="lipt.stages.pretrain"):
        load_pretrained(other, build_parts(other), ckpt)
    assert "records no data split" in caplog.text


def test_the_full_warm_up_logs_the_epochs_kappa_gives(make_cfg, caplog):
    cfg = make_cfg(
        [
            "pretrain=full",
            "pretrain.kappa=0.5",
            "trainer.max_epochs=12",
            "fraction=0.5",
            "trainer.accelerator=cpu",
            "dataset=synthetic",
            "model.width=8",
            "logger=none",
        ]
    )
    parts = build_parts(run_of(cfg))
    assert parts.pretrain.describe(parts.context, 500).startswith(
        "pre-training: full, 3 epochs (kappa 0.5 x 12 x 0.5) on the whole pool of 500"
    )  # ceil(0.5 x 12 x 0.5), not pretrain.epochs' 10


# --------------------------------------------------------------------------- multirun


def _run_jobs(cfg: DictConfig, folder: Path) -> None:
    """The learner jobs of a multirun, run here one after the other."""
    for i in range(N):
        job = cfg.copy()
        job.pretrain.learners = i
        job.pretrain.learner_dir = str(folder)
        job.paths.output_dir = str(folder.parent / f"job{i}")
        jigsaw_stage.run_learner_job(run_of(job))


def test_merge_of_job_checkpoints_leaves_out_missing_and_nan(jigsaw_cfg, tmp_path, caplog):
    cfg = jigsaw_cfg()
    folder = tmp_path / "sweep" / "learners"
    _run_jobs(cfg, folder)
    job0 = json.loads((tmp_path / "sweep" / "job0" / "summary.json").read_text())
    assert job0["stages"]["pretrain"]["samples"] == K * M * B
    assert job0["stages"]["pretrain"]["unique_samples"] == M * B

    (folder / "learner_2.ckpt").unlink()
    bad = _load(folder / "learner_1.ckpt")
    bad["state_dict"] = _poison(bad["state_dict"])
    torch.save(bad, folder / "learner_1.ckpt")
    out = tmp_path / "sweep"
    with caplog.at_level(logging.WARNING, logger="lipt.jigsaw"):
        summary = jigsaw_stage.merge_learner_dir(run_of(cfg), folder, out)
    report = json.loads((out / "merge_report.json").read_text())
    assert report["left_out"] == [1, 2]
    assert [le["status"] for le in report["learners"]] == ["ok", "diverged", "missing", "ok"]
    assert set(report["kept"]) <= {0, 3}
    assert "learner 1 is left out" in caplog.text and "learner 2 is left out" in caplog.text
    assert _load(out / "pretrain.ckpt")["pretrain"] == "jigsaw"
    assert summary["stages"]["pretrain"]["samples"] == 3 * K * M * B  # the ones that trained

    for path in folder.glob("*.ckpt"):
        if path.name != "learner_1.ckpt":
            path.unlink()
    with pytest.raises(UserError, match="no jigsaw learner is left"):
        jigsaw_stage.merge_learner_dir(run_of(cfg), folder, out)


def test_merge_from_saved_learners_equals_the_sweep_merge(jigsaw_cfg, tmp_path):
    cfg = jigsaw_cfg()
    folder = tmp_path / "sweep" / "learners"
    _run_jobs(cfg, folder)
    summary = jigsaw_stage.merge_learner_dir(run_of(cfg), folder, tmp_path / "sweep")
    again = jigsaw_cfg(f"pretrain.merge_from={folder}")
    validate(again)
    result = pretrain_model(build_parts(run_of(again)), seed=0)
    merged = _load(tmp_path / "sweep" / "pretrain.ckpt")["state_dict"]
    assert all(torch.equal(merged[k], v) for k, v in result.model.state_dict().items())
    assert result.samples == summary["stages"]["pretrain"]["samples"] == N * K * M * B
    assert not (tmp_path / "learners").exists()  # nothing trained, nothing written
    with pytest.raises(UserError, match="merge_from"):
        validate(jigsaw_cfg(f"pretrain.merge_from={tmp_path}/nowhere"))


def test_merge_refuses_checkpoints_of_another_recipe(jigsaw_cfg, tmp_path):
    cfg = jigsaw_cfg()
    folder = tmp_path / "learners"
    _run_jobs(cfg, folder)
    other = jigsaw_cfg("seed=1")
    with pytest.raises(UserError, match="seed"):
        jigsaw_stage.merge_learner_dir(run_of(other), folder, tmp_path)
    # Every setting equal but the labels: learners of the clean pool are not a noisy pool's.
    noisy = jigsaw_cfg("dataset.label_noise.rate=0.4")
    with pytest.raises(UserError, match=r"other settings \(labels\)"):
        jigsaw_stage.merge_learner_dir(run_of(noisy), folder, tmp_path)


def _sweep_config(*task: str) -> DictConfig:
    return OmegaConf.create(
        {
            "pretrain": {"name": "jigsaw"},
            "hydra": {"overrides": {"task": list(task)}, "sweeper": {"params": None}},
        }
    )


def test_soup_callback_only_merges_a_learner_sweep():
    assert learner_sweep(_sweep_config("pretrain.learners=range(10)", "pretrain=jigsaw"))
    assert not learner_sweep(_sweep_config("seed=0,1"))
    with pytest.raises(UserError, match="also sweeps seed"):
        learner_sweep(_sweep_config("pretrain.learners=range(10)", "seed=0,1"))


def test_a_learner_sweep_of_another_key_needs_a_folder_per_setting():
    """Without the soup callback, learners of two seeds in the one default folder would replace
    each other's: refused before any job, unless each setting has its own folder."""
    sweep = ["pretrain.learners=range(2)", "seed=0,1"]
    with pytest.raises(UserError, match=r"also sweeps seed: .*learner_dir=<folder>_\$\{seed\}"):
        check_learner_sweep(sweep, {"name": "jigsaw"}, merges=False)
    own = {"name": "jigsaw", "learner_dir": "/scratch/learners_${seed}"}
    assert check_learner_sweep(sweep, own, merges=False)
    fixed = {"name": "jigsaw", "learner_dir": "/scratch/learners"}  # one folder for both seeds
    with pytest.raises(UserError, match=r"one folder \(/scratch/learners\), but it also sweeps"):
        check_learner_sweep(sweep, fixed, merges=False)
    assert check_learner_sweep(sweep[:1], {"name": "jigsaw"}, merges=False)
    assert not check_learner_sweep(sweep[1:], {"name": "jigsaw"}, merges=False)


def _same_soup(a: Path, b: Path) -> None:
    sa, sb = _load(a / "pretrain.ckpt")["state_dict"], _load(b / "pretrain.ckpt")["state_dict"]
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.allclose(sa[key].double(), sb[key].double(), atol=1e-6), key
    for i in range(N):
        la = _load(a / "learners" / f"learner_{i}.ckpt")["state_dict"]
        lb = _load(b / "learners" / f"learner_{i}.ckpt")["state_dict"]
        assert all(torch.allclose(la[k].double(), lb[k].double(), atol=1e-6) for k in la)
    ra = json.loads((a / "merge_report.json").read_text())
    rb = json.loads((b / "merge_report.json").read_text())
    assert (ra["kept"], ra["ratios"]) == (rb["kept"], rb["ratios"])
    assert ra["soup_accuracy"] == pytest.approx(rb["soup_accuracy"])
    pa = json.loads((a / "summary.json").read_text())["stages"]["pretrain"]
    pb = json.loads((b / "summary.json").read_text())["stages"]["pretrain"]
    assert (pa["samples"], pa["unique_samples"]) == (pb["samples"], pb["unique_samples"])


def _multirun(tmp_path: Path, *launcher: str) -> Path:
    sweep = tmp_path / "sweep"
    out = run_entry(
        "pretrain.py",
        [
            "-m",
            *JIGSAW,
            FEW_RATIOS,
            f"pretrain.learners=range({N})",
            "hydra/callbacks=soup",
            f"hydra.sweep.dir={sweep}",
            *launcher,
        ],
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return sweep


def test_multirun_jobs_and_soup_callback_match_the_in_process_soup(jigsaw_cfg, tmp_path):
    sweep = _multirun(tmp_path)  # the basic launcher: jobs one after the other
    pretrain_run(validate(jigsaw_cfg()))  # in-process, in tmp_path
    assert sorted(p.name for p in (sweep / "learners").iterdir()) == [
        f"learner_{i}.ckpt" for i in range(N)
    ]
    _same_soup(tmp_path, sweep)


@pytest.mark.parametrize("merge", ["greedy_interp", "greedy", "uniform"])
def test_a_merge_part_built_in_python_is_the_configs(make_cfg, merge):
    """`GreedyInterpMerge()` in a script gets what `merge=greedy_interp` gives a run."""
    part = build_part(make_cfg([*JIGSAW, f"merge={merge}"], config_name="pretrain").merge)
    assert part == type(part)(name=part.name)


# --------------------------------------------------------------------------- Python API inputs


def _api_data() -> tuple[Callable[[], torch.nn.Module], lipt.PoolDataModule]:
    """A 10-class pool of 28x28 one-channel images and a ConvNet with BatchNorm whose head is
    `head`: the shapes the jigsaw learners train on (Fashion-MNIST's)."""
    g = torch.Generator().manual_seed(0)
    images, labels = torch.randn(400, 1, 28, 28, generator=g), torch.arange(400) % 10

    def net() -> torch.nn.Module:
        body = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(),
        )
        return torch.nn.Sequential(OrderedDict(body=body, head=torch.nn.Linear(128, 10)))

    data = lipt.PoolDataModule(TensorDataset(images, labels), val_size=0.2, batch_size=16)
    return net, data


def _no_learner(*args: object, **kwargs: object) -> Learner:
    raise AssertionError("a learner was trained")


@pytest.mark.parametrize("accelerator", ["cuda:0", "GPU", "gpu"])
def test_jigsaw_pretrain_refuses_an_accelerator_lightning_cannot_run_before_any_learner(
    monkeypatch: pytest.MonkeyPatch, accelerator: str
) -> None:
    """Lightning refuses the name (the learners take one device: "cuda", not "cuda:0"), or the
    device is not on this machine: one ValueError naming it, not every learner left out as
    failed and then "no jigsaw learner is left to merge" (nor CUDA's traceback for "gpu")."""
    if accelerator == "gpu" and torch.cuda.is_available():
        pytest.skip("this machine runs accelerator='gpu'")
    net, data = _api_data()
    monkeypatch.setattr(jigsaw_api, "train_learner", _no_learner)
    with pytest.raises(
        ValueError, match=rf"^accelerator='{accelerator}' cannot train the learners"
    ):
        lipt.jigsaw_pretrain(net, data, num_learners=4, local_epochs=1, accelerator=accelerator)


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: MagnitudePruning("omp", 0.95, 0.85), r"prune\.density_low=0\.95, prune\.densi"),
        (lambda: RandomPruning("random", 0.9, 0.5), r"0 < density_low <= density_high <= 1"),
        (lambda: SnipPruning("snip", 0.6, 0.5), r"prune\.density_low=0\.6"),
        (lambda: GreedyInterpMerge("greedy_interp", ratios=[0.0]), r"merge\.ratios=\[0\.0\]"),
        (lambda: GreedyInterpMerge("greedy_interp", ratios=[]), r"needs one above 0"),
        (lambda: RandAugment(magnitude=31), r"augment\.magnitude=31 is invalid: use 0\.\.30"),
    ],
)
def test_a_part_of_crossed_settings_is_refused_when_built_not_after_the_learners(make, needle):
    """What the config's rules refuse across a part's keys, the part itself refuses for the
    Python API: crossed density bounds failed every learner after its training (and the soup
    then found none), a ratio list with nothing above 0 failed the soup after all learners."""
    with pytest.raises(ValueError, match=needle):
        make()


def test_parts_of_sound_settings_are_still_built():
    assert MagnitudePruning("omp", 0.9, 0.9).density_low == 0.9
    assert GreedyInterpMerge("greedy_interp", ratios=[0.0, 0.5]).grid() == [0.0, 0.5]
    assert RandAugment(magnitude=30).magnitude == 30


# --------------------------------------------------------------------------- selector.repeats


def _repeats_cfg(make_cfg: Callable[..., DictConfig], *overrides: str) -> DictConfig:
    """select.py's config: GraNd averaging two soups, one per seed."""
    settings = [*JIGSAW, FEW_RATIOS, "selector=grand", "selector.repeats=2", *overrides]
    return make_cfg(settings, config_name="select")


def _one_seed_cfg(make_cfg: Callable[..., DictConfig], folder: Path) -> DictConfig:
    """pretrain.py's config keeping its learners (of the run's seed alone) in `folder`."""
    return make_cfg([*JIGSAW, FEW_RATIOS, f"pretrain.learner_dir={folder}"], config_name="pretrain")


def test_merge_from_a_learner_folder_of_two_seeds_gives_each_seeds_soup(make_cfg, tmp_path):
    """A run with selector.repeats keeps each seed's learners apart (seed_<seed> in its learner
    folder); pretrain.merge_from of that folder merges each seed's soup from its own learners,
    the soups the run made, rather than failing on the second with "trained with other
    settings (seed)"."""
    folder = tmp_path / "kept"
    trained = run_of(_repeats_cfg(make_cfg, f"pretrain.learner_dir={folder}"))
    made = ranking_models(trained, build_parts(trained)).models
    assert len(list(folder.glob("seed_*/learner_*.ckpt"))) == N
    merged = run_of(_repeats_cfg(make_cfg, f"pretrain.merge_from={folder}"))
    again = ranking_models(merged, build_parts(merged)).models
    for one, other in zip(made, again, strict=True):
        theirs = other.state_dict()
        assert all(torch.equal(v, theirs[k]) for k, v in one.state_dict().items())


def test_merge_from_without_the_other_seeds_learners_is_refused_before_any_merge(
    make_cfg, tmp_path, monkeypatch
):
    folder = tmp_path / "one_seed"
    pretrain_model(build_parts(run_of(_one_seed_cfg(make_cfg, folder))), seed=0)
    monkeypatch.setattr(jigsaw_strategy, "merge_saved", _no_learner)
    run = run_of(_repeats_cfg(make_cfg, f"pretrain.merge_from={folder}"))
    with pytest.raises(UserError, match=r"holds no learners of seed \d+ \(looked in .*seed_\d+\)"):
        ranking_models(run, build_parts(run))


def test_a_head_without_a_bias_gives_the_learners_heads_after_the_soup():
    """nn.Linear(..., bias=False) as the final layer: the learners' heads come back with zero
    biases (the same logits), where reading `<head>.bias` raised KeyError after all the
    learners and the merge; selection ranks with them."""
    net, data = _api_data()

    def no_bias() -> torch.nn.Module:
        model = net()
        model.head = torch.nn.Linear(128, 10, bias=False)
        return model

    result = lipt.jigsaw_pretrain(no_bias, data, num_learners=3, local_epochs=1, head="head")
    heads = result.learner_heads
    assert heads is not None and heads.weight.shape == (3, 10, 128)
    assert torch.equal(heads.bias, torch.zeros(3, 10))
    subset = lipt.select(result.model, data, 0.1, head="head", learner_heads=heads)
    assert len(subset.indices) == round(0.1 * len(data.pool_indices))


def test_numpy_numbers_pass_as_the_python_numbers_they_are():
    """check_pretrain_args takes any integer for min_learners, so numpy's too: it reached the
    settings as np.int64 and was refused as "pretrain holds a value that is no setting", as a
    numpy learning rate in `optim` was; each now makes the soup its Python value makes."""
    net, data = _api_data()
    given = {"num_learners": 2, "local_epochs": 1, "head": "head"}
    plain = lipt.jigsaw_pretrain(net, data, min_learners=1, optim={"lr": 0.05}, **given)
    numpy = lipt.jigsaw_pretrain(
        net, data, min_learners=np.int64(1), optim={"lr": np.float64(0.05)}, **given
    )
    theirs = numpy.model.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in plain.model.state_dict().items())
