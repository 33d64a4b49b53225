"""lipt's Python API on a model and a data set defined here only: selection, re-selection,
dynamic pruning and jigsaw pre-training, on the DataLoader and the resident paths and under DDP
on the CPU; what it refuses, at the start; and the README's example, run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, TensorDataset

import lipt
from lipt.selection.api import labels_of_pool
from tests.helpers import run_entry

ROOT = Path(__file__).resolve().parents[1]
CLASSES, DIM, N = 10, 48, 1200


def blobs(n: int = N, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Class clusters in DIM dimensions, overlapping enough that training matters."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLASSES, DIM, generator=g) * 0.5
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return centres[y] + torch.randn(n, DIM, generator=g), y


class Points(Dataset):
    """A map-style data set of (input, label) items, with noise as its own augmentation."""

    def __init__(self, augment: bool = False) -> None:
        self.x, self.y = blobs()
        self.augment = augment

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        x = self.x[i]
        if self.augment:
            x = x + 0.05 * torch.randn_like(x)
        return x, int(self.y[i])


class Unlabelled(Points):
    def __getitem__(self, i: int) -> Tensor:  # type: ignore[override]
        return self.x[i]


class SoftLabels(Points):
    def __getitem__(self, i: int) -> tuple[Tensor, float]:  # type: ignore[override]
        return self.x[i], float(self.y[i])


def make_net() -> nn.Module:
    net = nn.Sequential()
    net.add_module("body", nn.Sequential(nn.Linear(DIM, 64), nn.BatchNorm1d(64), nn.ReLU()))
    net.add_module("head", nn.Linear(64, CLASSES))
    return net


class Model(L.LightningModule):
    """The user's module: per-sample losses through lipt.weighted_loss; records what each
    training batch held."""

    def __init__(self, norm: str = "weights") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net, self.norm = make_net(), norm
        self.last_losses: Tensor | None = None
        self.fed: dict[int, list[Tensor]] = {}

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x, y, idx, w = batch
        self.fed.setdefault(self.current_epoch, []).append(idx.cpu())
        losses = F.cross_entropy(self(x), y, reduction="none")
        return lipt.weighted_loss(self, losses, w, norm=self.norm)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def fed_in(self, epoch: int) -> Tensor:
        return torch.cat(self.fed[epoch])


class MeanLossModel(Model):
    """A module whose training step reduces the loss itself: no per-sample losses."""

    def __init__(self) -> None:
        super().__init__()
        del self.last_losses

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x, y, _, _ = batch
        return F.cross_entropy(self(x), y)


def data_module(resident: bool, **kwargs) -> lipt.PoolDataModule:
    if resident:
        return lipt.PoolDataModule(TensorDataset(*blobs()), resident=True, **kwargs)
    return lipt.PoolDataModule(Points(augment=True), eval_view=Points(), **kwargs)


def trainer(epochs: int, callbacks: list, devices: int = 1, **kwargs) -> L.Trainer:
    return L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=devices,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


PATHS = pytest.mark.parametrize("resident", [False, True], ids=["dataloader", "resident"])


# --------------------------------------------------------------------------- selection


@PATHS
def test_select_ranks_the_pool_with_any_module_and_keeps_it_apart_from_validation(resident):
    data = data_module(resident, val_size=0.1, batch_size=64)
    module = Model()
    subset = lipt.select(module, data, 0.1, "el2n", head="net.head", seed=3)
    pool = set(data.pool_indices.tolist())
    assert len(subset) == round(0.1 * len(pool)) == 108
    assert set(subset.indices.tolist()) <= pool
    assert torch.equal(subset.indices, subset.indices.sort().values)
    assert not set(subset.indices.tolist()) & set(data.val_indices.tolist())
    assert subset.profile["coverage_ratio"] > 0
    # The head found without a name (the last nn.Linear) and the inner model by lipt's own
    # protocol-free path agree with the named head, row for row.
    again = lipt.select(module, data, 0.1, "el2n", seed=3)
    inner = lipt.select(module.net, data, 0.1, "el2n", seed=3)
    assert torch.equal(again.indices, subset.indices) and torch.equal(inner.indices, subset.indices)


def test_both_data_paths_give_the_same_selection():
    chosen = [
        lipt.select(Model(), data_module(resident, val_size=0.1), 200, "coverage", seed=1)
        for resident in (False, True)
    ]
    assert torch.equal(chosen[0].indices, chosen[1].indices)
    assert torch.equal(chosen[0].weights, chosen[1].weights)


def indexed_pool(n: int = 5000) -> TensorDataset:
    """(x, y, idx) items, idx the row's own position, as a user's pool loader yields them."""
    x, y = blobs(n)
    return TensorDataset(x, y, torch.arange(n))


def test_a_pool_loader_that_yields_each_index_once_gives_every_row_once():
    pool = indexed_pool()
    shuffled = DataLoader(pool, batch_size=256, shuffle=True)
    outputs = labels_of_pool(shuffled)
    assert torch.equal(outputs.indices, torch.arange(len(pool)))
    assert torch.equal(outputs.targets, pool.tensors[1])
    subset = lipt.select(None, shuffled, 0.5, "random")
    assert len(subset) == len(torch.unique(subset.indices)) == 2500


def test_a_pool_loader_that_repeats_an_index_is_refused_naming_it():
    pool = indexed_pool()
    # Every index once, but 1234 twice (the second time in another batch).
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(0)).tolist()
    repeating = DataLoader(pool, batch_size=256, sampler=[*order, 1234])
    with pytest.raises(ValueError, match=r"dataset index 1234 twice; .*each pool index exactly"):
        labels_of_pool(repeating)
    # as `select` reads it for a labels-only selector, with a budget it would pass
    with pytest.raises(ValueError, match=r"dataset index 1234 twice; .*sampler that repeats"):
        lipt.select(None, repeating, len(pool), "random")
    # a sampler drawing with replacement repeats many indices
    drawing = DataLoader(
        pool,
        batch_size=256,
        sampler=RandomSampler(pool, replacement=True, generator=torch.Generator().manual_seed(0)),
    )
    with pytest.raises(ValueError, match=r"index \d+ (twice|\d+ times) \(\d+ indices repeat\)"):
        lipt.select(None, drawing, 0.1, "random")
    # The model's path refuses it too (lipt.selection.gradients.model_outputs).
    with pytest.raises(ValueError, match="twice"):
        lipt.select(Model(), repeating, 0.1, "el2n")


class Counted(Model):
    """The user's module, counting the batches its forward ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def forward(self, x: Tensor) -> Tensor:
        self.batches += 1
        return super().forward(x)


class Broken(Model):
    """A module whose embeddings are NaN for the items whose first input is above 2.5 (a
    diverged layer or a bad input row does this)."""

    def forward(self, x: Tensor) -> Tensor:
        h = self.net.body(x)  # [B, 64]
        h = torch.where((x[:, 0] > 2.5)[:, None], torch.full_like(h, float("nan")), h)
        return self.net.head(h)


def test_outputs_no_selector_can_rank_are_refused_naming_the_item():
    data = data_module(True, val_size=0.1)
    bad = torch.nonzero(blobs()[0][:, 0] > 2.5).flatten()  # the resident path's inputs
    pool_bad = sorted(set(bad.tolist()) & set(data.pool_indices.tolist()))
    assert len(pool_bad) > 0
    # every selector that ranks: a NaN row was ranked silently (CRAIG's greedy never ended)
    for selector in ("el2n", "coverage", "glister"):
        with pytest.raises(ValueError, match=rf"NaN or infinite for {len(pool_bad)} item\(s\) "):
            lipt.select(Broken(), data, 0.1, selector)
    with pytest.raises(ValueError, match=rf"\(dataset index {pool_bad[0]} first\)"):
        lipt.select(Broken(), data, 0.1, "el2n")
    # a label past the head's outputs (an IndexError deep in a selector, or another class's
    # logit for a negative one)
    x, y = blobs()
    for label, shown in ((CLASSES, CLASSES), (-1, -1)):
        labels = y.clone()
        labels[7] = label
        loader = DataLoader(TensorDataset(x, labels, torch.arange(len(y))), batch_size=128)
        with pytest.raises(
            ValueError,
            match=rf"^the pool has 1 label\(s\) outside the head's {CLASSES} classes "
            rf"\(dataset index 7: label {shown}\); give the head one output per class",
        ):
            lipt.select(Model(), loader, 0.1, "grand")


def test_a_selector_that_matches_the_validation_split_needs_one_before_the_model_runs():
    no_val = data_module(True)
    module = Counted()
    for selector in ("glister", partial(lipt.SELECTORS["gradmatch"], target="val")):
        with pytest.raises(ValueError, match=r"matches the validation split, which is empty"):
            lipt.select(module, no_val, 0.1, selector)
        with pytest.raises(ValueError, match=r"matches the validation split, which is empty"):
            lipt.Reselection(2, no_val, 0.1, selector)
    assert module.batches == 0
    # GradMatch matching the pool needs none; `val=` batches are a validation split
    assert len(lipt.select(module, no_val, 0.1, "gradmatch")) == 120
    x, y = blobs(200, seed=1)
    val = DataLoader(TensorDataset(x, y, torch.arange(200)), batch_size=64)
    subset = lipt.select(module, no_val, 0.1, "glister", val=val)
    assert len(subset) == 120 and subset.diagnostics["pool_as_target"] == 0


def test_a_selectors_bound_settings_are_held_to_their_ranges_before_the_model_runs():
    data = data_module(True, val_size=0.1)
    module = Counted()
    glister, gradmatch, coverage = (lipt.SELECTORS[k] for k in ("glister", "gradmatch", "coverage"))
    refused = {
        partial(gradmatch, lam=float("nan")): r"select_gradmatch\.lam=nan is invalid: .*finite",
        partial(glister, chunk_size=0): r"select_glister\.chunk_size=0 is invalid: .* 1$",
        partial(coverage, class_tilt=100): r"select_coverage\.class_tilt=100 is invalid: .*20",
        partial(coverage, kmeans=3): r"select_coverage\.kmeans is not a setting here",
        partial(glister, eta="0.1"): r"select_glister\.eta='0\.1' is invalid",
    }
    for selector, message in refused.items():
        with pytest.raises(ValueError, match=rf"^({message})"):
            lipt.select(module, data, 0.1, selector)
        with pytest.raises(ValueError, match=rf"^({message})"):
            lipt.Reselection(2, data, 0.1, selector)
    assert module.batches == 0
    # numpy's numbers are settings and budgets as Python's are: the same subset
    tuned = partial(coverage, class_tilt=np.float64(0.25), kmeans_iters=np.int64(3))
    plain = partial(coverage, class_tilt=0.25, kmeans_iters=3)
    for budget in (np.int64(108), np.float64(0.1)):
        subset = lipt.select(module, data, budget, tuned, seed=2)
        same = lipt.select(module, data, 108, plain, seed=2)
        assert torch.equal(subset.indices, same.indices) and len(subset) == 108


def test_the_embeddings_are_the_head_input_read_by_a_forward_hook():
    from lipt.selection.gradients import model_outputs

    data = data_module(False)
    module = Model()
    outputs = model_outputs(module, data.pool_dataloader(), head="net.head")
    module.eval()
    x = Points().x
    with torch.no_grad():
        h = module.net.body(x)
        assert torch.allclose(outputs.embeddings, h, atol=1e-6)
        assert torch.allclose(outputs.logits, module.net.head(h), atol=1e-6)
    assert module.training is False  # restored to what it was


# --------------------------------------------------------------------------- training


@PATHS
def test_infobatch_prunes_any_module_and_feeds_exactly_each_epochs_plan(resident):
    data = data_module(resident, val_size=0.1, batch_size=50)
    pruning = lipt.DynamicPruning(lipt.InfoBatch(ratio=0.5, delta=0.75), data, seed=2)
    plans: dict[int, Tensor] = {}
    real_subset = pruning.epoch_subset

    def spy(trainer_: L.Trainer, epoch: int) -> tuple[Tensor, Tensor]:
        indices, weights = real_subset(trainer_, epoch)
        plans[epoch] = indices
        return indices, weights

    pruning.epoch_subset = spy  # type: ignore[method-assign]
    module = Model(norm="batch")
    trainer(4, [pruning]).fit(module, datamodule=data)
    for epoch in range(4):
        fed = module.fed_in(epoch)
        assert sorted(fed.tolist()) == sorted(plans[epoch].tolist()), epoch  # each once
    pool = len(data.pool_indices)
    assert len(plans[0]) == pool  # epoch 0: all scores equal, nothing pruned
    assert 0.1 < pruning.pruned_share["1"] < 0.5 and pruning.pruned_share["3"] == 0.0
    assert pruning.unique_samples() == pool
    assert len(torch.unique(pruning.scores)) > pool // 2  # the training losses replaced them


@PATHS
def test_reselection_swaps_the_subset_any_module_trains_on(resident, tmp_path):
    data = data_module(resident, val_size=0.1, batch_size=32)
    first = lipt.select(None, data, 0.25, "random", seed=0)
    data.set_subset(first.indices, first.weights)
    reselect = lipt.Reselection(1, data, 0.25, "el2n", head="net.head", out_dir=tmp_path)
    module = Model()
    trainer(3, [reselect]).fit(module, datamodule=data)
    assert reselect.reselections == 2
    assert set(module.fed_in(0).tolist()) == set(first.indices.tolist())
    second = set(module.fed_in(1).tolist())
    assert len(second) == len(first) and second != set(first.indices.tolist())
    assert (tmp_path / "subsets" / "epoch_1.npz").is_file()
    assert reselect.profiles["1"]["coverage_ratio"] > 0


# --------------------------------------------------------------------------- jigsaw


@pytest.fixture(scope="module")
def soup():
    data = data_module(False, val_size=0.2, batch_size=32)
    # the head by default: make_net has no `classifier`, its last nn.Linear is "head"
    result = lipt.jigsaw_pretrain(
        make_net, data, num_learners=4, batches_per_learner=2, local_epochs=3
    )
    return data, result


def test_jigsaw_pretrain_merges_learners_of_any_factory_into_a_soup(soup):
    data, result = soup
    report = result.report
    assert isinstance(result.model, nn.Sequential)
    assert result.counts["learners_merged"] == 4 and result.samples == 4 * 3 * 2 * 32
    assert report["soup_accuracy"] >= report["init_accuracy"] + 0.1  # it learnt something
    assert report["soup_accuracy"] >= max(le["accuracy"] for le in report["learners"]) - 1e-9
    heads = result.learner_heads
    assert heads is not None and heads.weight.shape == (4, CLASSES, 64)
    # The same seed gives the same soup, bit for bit; the default head is the one named.
    again = lipt.jigsaw_pretrain(
        make_net, data, num_learners=4, batches_per_learner=2, local_epochs=3, head="head"
    )
    for key, value in result.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[key]), key


def test_jigsaw_pretrain_runs_on_the_resident_path_too():
    data = data_module(True, val_size=0.2, batch_size=32)
    result = lipt.jigsaw_pretrain(
        make_net, data, num_learners=2, batches_per_learner=2, local_epochs=2, head="head"
    )
    assert result.counts["learners_merged"] == 2
    assert result.report["soup_accuracy"] > result.report["init_accuracy"]
    assert result.learner_heads is not None and len(result.learner_heads) == 2


def test_jigsaw_pretrain_trains_its_learners_at_the_optim_given(monkeypatch):
    """`optim` reaches each learner: its lr and weight decay on the paper's SGD, its schedule."""
    import lipt.jigsaw.api

    seen: list[tuple[float, float, str]] = []
    real = lipt.jigsaw.api.train_learner

    def spy(ctx, settings, *args, **kwargs):
        module = ctx.classifier(nn.Linear(2, 2), **settings.learner_optim())
        optimizer = module.make_optimizer([nn.Parameter(torch.zeros(1))])
        group = optimizer.param_groups[0]
        seen.append((group["lr"], group["weight_decay"], module.make_scheduler.__name__))
        return real(ctx, settings, *args, **kwargs)

    monkeypatch.setattr(lipt.jigsaw.api, "train_learner", spy)
    data = data_module(False, val_size=0.2, batch_size=32)
    result = lipt.jigsaw_pretrain(
        make_net, data, num_learners=2, batches_per_learner=1, local_epochs=1, head="head",
        optim={"lr": 0.05, "weight_decay": 1e-4, "scheduler": "linear"},
    )  # fmt: skip
    assert result.counts["learners_merged"] == 2
    assert seen and set(seen) == {(0.05, 1e-4, "linear")}


def test_jigsaw_pretrain_refuses_min_learners_outside_its_learners_before_training(monkeypatch):
    import lipt.jigsaw.api

    def no_training(*args, **kwargs):
        raise AssertionError("a learner trained before min_learners was checked")

    monkeypatch.setattr(lipt.jigsaw.api, "train_learner", no_training)
    data = data_module(False, val_size=0.2, batch_size=32)
    for bad in (0, 4):
        with pytest.raises(
            ValueError, match=r"min_learners must be an integer in 1\.\.num_learners \(3\)"
        ):
            lipt.jigsaw_pretrain(
                make_net, data, num_learners=3, local_epochs=1, head="head", min_learners=bad
            )


def test_the_api_doc_names_the_optim_keys_jigsaw_pretrain_takes():
    """docs/API.md's `optim` keys are LearnerOptim's: another (momentum) is refused."""
    from lipt.core.settings import LearnerOptim

    doc = " ".join((ROOT / "docs" / "API.md").read_text().split())
    (said,) = re.findall(r"`optim` sets ([^)]*)\)", doc)
    assert set(re.findall(r"\w+", said)) - {"and"} == set(LearnerOptim.__annotations__)
    data = data_module(False, val_size=0.2, batch_size=32)
    with pytest.raises(ValueError, match="momentum is not a setting"):
        lipt.jigsaw_pretrain(make_net, data, num_learners=2, head="head", optim={"momentum": 0.5})


def test_the_soup_ranks_the_pool_and_seeds_lipts_dynamic_pruning(soup):
    data, result = soup
    heads = result.learner_heads
    subset = lipt.select(result.model, data, 0.2, head="head", learner_heads=heads)
    assert len(subset) == round(0.2 * len(data.pool_indices))
    scores = lipt.ensemble_scores(result.model, data, heads, head="head")
    assert scores.shape == (len(data.pool_indices),) and bool((scores > 0).all())
    pruning = lipt.DynamicPruning(lipt.LiptBudget(budget=0.5), data, initial_scores=scores)
    module = Model(norm="batch")
    trainer(4, [pruning]).fit(module, datamodule=data)
    fed = sum(len(module.fed_in(e)) for e in range(4))
    assert 0.35 < fed / (4 * len(data.pool_indices)) < 0.65  # the budget, within the draw
    assert pruning.pruned_share["0"] > 0.3  # epoch 0 pruned by the ensemble's scores


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("dataset", "words"),
    [
        (Unlabelled(), "not an (input, label) pair"),
        (SoftLabels(), "not a class index"),
        (TensorDataset(torch.randn(8, 3)), "not an (input, label) pair"),
        (TensorDataset(torch.randn(8, 3), torch.rand(8)), "not a class index"),
        ([], "is empty"),
    ],
    ids=["no-label", "float-label", "tensors-without-labels", "float-tensor-labels", "empty"],
)
def test_data_without_labels_is_refused_when_wrapped(dataset, words):
    with pytest.raises(ValueError, match="^[^\n]*" + words.replace("(", r"\(").replace(")", r"\)")):
        lipt.PoolDataModule(dataset)


def test_a_module_without_per_sample_losses_is_refused_before_training():
    data = data_module(False)
    module = MeanLossModel()
    pruning = lipt.DynamicPruning(lipt.InfoBatch(), data)
    with pytest.raises(ValueError, match=r"gives no per-sample losses.*weighted_loss"):
        trainer(2, [pruning]).fit(module, datamodule=data)
    assert module.fed == {}  # refused before the first batch


def test_a_step_that_stops_giving_losses_is_refused_at_that_batch():
    class Forgets(Model):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            if batch_idx == 1:
                self.last_losses = self.last_losses[:1]  # a reduced loss, not per sample
            return loss

    data = data_module(True, batch_size=100)
    with pytest.raises(ValueError, match="per-sample losses"):
        trainer(1, [lipt.DynamicPruning(lipt.InfoBatch(), data)]).fit(Forgets(), datamodule=data)


def test_bad_arguments_are_refused_before_any_work(soup):
    data, _ = soup
    with pytest.raises(ValueError, match="no submodule 'nope'"):
        lipt.select(Model(), data, 0.1, head="nope")
    with pytest.raises(ValueError, match=r"not an nn\.Linear"):
        lipt.select(Model(), data, 0.1, head="net.body")
    with pytest.raises(ValueError, match="budget"):
        lipt.select(Model(), data, 0.0)
    with pytest.raises(ValueError, match="unknown selector"):
        lipt.Reselection(1, data, 0.1, "nope")
    with pytest.raises(ValueError, match=r"a budget .* or choose, not both"):
        lipt.Reselection(1, data)  # neither says how to re-select
    with pytest.raises(ValueError, match=r"a budget .* or choose, not both"):
        lipt.Reselection(1, data, 0.1, choose=lambda module, epoch, profile: (None, None))
    module = Model()
    with pytest.raises(ValueError, match=r"no submodule 'net\.fc'"):
        trainer(2, [lipt.Reselection(1, data, 0.1, head="net.fc")]).fit(module, datamodule=data)
    assert module.fed == {}
    with pytest.raises(ValueError, match="validation split"):
        lipt.jigsaw_pretrain(make_net, data_module(False), head="head")
    with pytest.raises(ValueError, match="no submodule"):
        lipt.jigsaw_pretrain(make_net, data, head="classifier")
    # the API's keywords, not train.py's pretrain.* keys
    with pytest.raises(ValueError, match=r"^[^\n]*pool has \d+: lower num_learners or batches_"):
        lipt.jigsaw_pretrain(make_net, data, num_learners=1000)
    with pytest.raises(ValueError, match=r"^local_epochs must be an integer >= 1, got 2\.5$"):
        lipt.jigsaw_pretrain(make_net, data, local_epochs=2.5)
    with pytest.raises(ValueError, match=r"^the model's head '1' has 1 output: "):
        lipt.jigsaw_pretrain(lambda: nn.Sequential(nn.Flatten(), nn.Linear(DIM, 1)), data)
    with pytest.raises(ValueError, match=r"trainer\.fit.*datamodule"):
        other = data_module(False)
        trainer(1, [lipt.DynamicPruning(lipt.InfoBatch(), data)]).fit(Model(), datamodule=other)
    with pytest.raises(ValueError, match=r"needs a lipt data module.*PoolDataModule"):
        lipt.DynamicPruning(lipt.InfoBatch(), L.LightningDataModule())
    with pytest.raises(ValueError, match="needs a lipt data module"):
        lipt.Reselection(1, L.LightningDataModule(), 0.1)
    with pytest.raises(ValueError, match="resident=True needs a TensorDataset"):
        lipt.PoolDataModule(Points(), resident=True)


# --------------------------------------------------------------------------- DDP and the example


def ddp_main(out: Path) -> None:
    """Two CPU ranks (gloo) prune with InfoBatch, a fit on each data path (one launch of the
    two processes for both); each rank writes its scores and what it trained on."""
    for resident in (False, True):
        L.seed_everything(0, verbose=False)
        data = data_module(resident, val_size=0.1, batch_size=40)
        pruning = lipt.DynamicPruning(lipt.InfoBatch(ratio=0.5, delta=0.75), data, seed=1)
        module = Model(norm="batch")
        trainer(3, [pruning], strategy="ddp", devices=2).fit(module, datamodule=data)
        rank = module.global_rank
        record = {
            "scores": pruning.scores.cpu().tolist(),
            "fed": {str(e): module.fed_in(e).tolist() for e in range(3)},
            "pruned_share": pruning.pruned_share,
            "pool": len(data.pool_indices),
        }
        (out / f"{PATH_IDS[resident]}.rank{rank}.json").write_text(json.dumps(record))


PATH_IDS = {False: "dataloader", True: "resident"}


@pytest.mark.slow
@pytest.mark.ddp
def test_ddp_ranks_prune_alike_and_split_each_plan(tmp_path):
    env = {"PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    done = run_entry(str(Path(__file__)), [str(tmp_path)], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for path in PATH_IDS.values():  # each data path's fit
        r0, r1 = (json.loads((tmp_path / f"{path}.rank{r}.json").read_text()) for r in (0, 1))
        assert r0["scores"] == r1["scores"] and r0["pruned_share"] == r1["pruned_share"], path
        assert r0["pruned_share"]["1"] > 0.1, path
        for epoch in ("0", "1", "2"):
            a, b = set(r0["fed"][epoch]), set(r1["fed"][epoch])
            kept = round((1 - r0["pruned_share"][epoch]) * r0["pool"])
            assert len(a | b) == kept, (path, epoch)
            assert abs(len(r0["fed"][epoch]) - len(r1["fed"][epoch])) == 0, (path, epoch)


def test_the_readme_example_runs_as_written():
    done = run_entry("examples/own_model.py", [], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dynamic pruning: pruned shares" in done.stdout
    lines = [line for line in done.stdout.splitlines() if "test accuracy" in line]
    accuracies = [float(line.rsplit(" ", 1)[1]) for line in lines]
    assert len(accuracies) == 2, done.stdout
    assert all(a > 0.8 for a in accuracies), done.stdout


if __name__ == "__main__":
    ddp_main(Path(sys.argv[1]))


def test_lipts_packages_are_reached_from_import_lipt_alone():
    """The docs bind a selector's knobs as functools.partial(lipt.selection.select_gradmatch,
    ...) after `import lipt`: in a fresh interpreter that was an AttributeError until something
    else had imported the package. Every package of src/lipt is reached so, and none of them
    at `import lipt` itself (which stays light)."""
    packages = sorted(
        p.name for p in (ROOT / "src" / "lipt").iterdir() if (p / "__init__.py").is_file()
    )
    code = (
        "import functools, sys, lipt\n"
        f"packages = {packages!r}\n"
        "assert not [p for p in packages if f'lipt.{p}' in sys.modules], sys.modules.keys()\n"
        "functools.partial(lipt.selection.select_gradmatch, target='val')\n"
        "assert all(getattr(lipt, p).__name__ == f'lipt.{p}' for p in packages)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]


def test_dynamic_pruning_takes_numpy_scores_and_refuses_nan_ones():
    """numpy's initial_scores gave AttributeError ('numpy.ndarray' has no 'float'); NaN ones
    were taken, and every epoch's draw would rank them anyhow."""
    data = data_module(False, val_size=0.2, batch_size=32)
    n = len(data.pool_indices)
    scores = np.linspace(0.1, 1.0, n)
    pruning = lipt.DynamicPruning(lipt.LiptBudget(budget=0.5), data, initial_scores=scores)
    assert torch.equal(pruning.scores, torch.as_tensor(scores).float())
    scores[3] = np.nan
    with pytest.raises(ValueError, match="initial_scores hold NaN"):
        lipt.DynamicPruning(lipt.LiptBudget(budget=0.5), data, initial_scores=scores)


def test_budgets_take_numpy_numbers_of_every_width():
    """np.float64 is a float, np.float32 is not: LiptBudget(budget=np.float32(0.5)) was refused
    as "a value that is no setting"."""
    assert lipt.LiptBudget(budget=np.float32(0.5)).budget == 0.5
    assert lipt.InfoBatch(ratio=np.float32(0.25), delta=np.float16(0.875)).ratio == 0.25
    with pytest.raises(ValueError, match="budget"):  # lipt's UserError is a ValueError
        lipt.LiptBudget(budget=np.float32(1.5))


def test_reselection_refuses_a_seed_before_training():
    """Reselection(seed=None) was taken, and failed at the first re-selection, an epoch in."""
    data = data_module(False, val_size=0.2, batch_size=32)
    with pytest.raises(ValueError, match="seed must be an integer"):
        lipt.Reselection(1, data, 0.2, "random", seed=None)
    assert lipt.Reselection(1, data, 0.2, "random", seed=np.int64(3)) is not None
