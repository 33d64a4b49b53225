"""Dynamic data pruning (lipt.dynamic): the pure plans at Fashion-MNIST's pool size with
realistic loss distributions, then main training with budget=infobatch and budget=lipt end to
end: both data paths, the audit trail, the ledger, a bit-for-bit resume, DDP, bad values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lipt.budget import infobatch_epochs
from lipt.core.errors import UserError
from lipt.core.seeding import generator
from lipt.data.seen import load_seen
from lipt.dynamic import (
    InfoBatch,
    LiptBudget,
    budget_plan,
    budget_schedule,
    ensemble_losses,
    infobatch_plan,
    keep_probabilities,
    pruned_epochs,
)
from lipt.dynamic.callback import audit_path
from lipt.models.classifier import Classifier
from lipt.run.composition import compose_jobs
from lipt.run.config import validate
from lipt.run.precheck import precheck
from lipt.selection import LearnerHeads
from lipt.stages import train as train_stage
from tests.helpers import FAST, compose_train, run_entry

POOL = 55_000  # Fashion-MNIST's pool: 60,000 minus the 5,000 validation images


def training_losses(seed: int = 0) -> torch.Tensor:
    """Per-sample cross-entropies as a half-trained classifier gives them: most samples well
    learned (small losses), a long tail of hard ones (log-normal, median 0.37, mean 0.76)."""
    g = torch.Generator().manual_seed(seed)
    return torch.exp(torch.randn(POOL, generator=g) * 1.2 - 1.0)


def ensemble_outputs(
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, LearnerHeads]:
    """A soup's logits and embeddings on the pool and five learners' heads: class prototypes
    plus noise, so the ensemble finds some samples easy and some hard."""
    g = torch.Generator().manual_seed(seed)
    classes, features = 10, 32
    targets = torch.randint(0, classes, (POOL,), generator=g)
    prototypes = torch.randn(classes, features, generator=g)
    embeddings = torch.relu(prototypes[targets] + 1.5 * torch.randn(POOL, features, generator=g))
    head = prototypes + 0.3 * torch.randn(classes, features, generator=g)
    logits = embeddings @ head.T
    weight = head + 0.5 * torch.randn(5, classes, features, generator=g)  # [L, C, D]
    return logits, embeddings, targets, LearnerHeads(weight, torch.zeros(5, classes))


# --- the pure plans ----------------------------------------------------------------------------


def test_infobatch_drops_ratio_of_the_below_mean_samples_and_keeps_the_rest():
    losses = training_losses()
    plan = infobatch_plan(losses, 1, 10, 0.5, 0.875, torch.Generator().manual_seed(0))
    below = losses < losses.double().mean()
    kept = torch.zeros(POOL, dtype=torch.bool)
    kept[plan.rows] = True
    assert kept[~below].all()  # every above-mean sample trains, with weight 1
    assert (plan.weights[~below[plan.rows]] == 1).all()
    assert (plan.weights[below[plan.rows]] == 2).all()  # 1 / (1 - ratio)
    assert int(kept[below].sum()) == int(0.5 * int(below.sum()))  # half the below-mean ones
    # ratio 0.5 acts on the below-mean samples only: a third of the epoch here, not half
    assert 0.2 < plan.pruned_share(POOL) < 0.45
    assert torch.equal(plan.rows, plan.rows.sort().values)


def test_infobatch_weights_keep_the_loss_sum_unbiased():
    losses = training_losses(1)
    full = float(losses.double().sum())
    weighted, unweighted = [], []
    for draw in range(50):
        plan = infobatch_plan(losses, 2, 10, 0.5, 0.875, torch.Generator().manual_seed(draw))
        weighted.append(float((plan.weights.double() * losses[plan.rows]).sum()) / full)
        unweighted.append(float(losses[plan.rows].double().sum()) / full)
    assert abs(np.mean(weighted) - 1) < 0.002
    assert abs(np.mean(unweighted) - 1) > 0.05  # without 1 / (1 - ratio) the test would fail


def test_lipt_weights_keep_the_loss_sum_unbiased_and_bounded():
    losses = training_losses(2)
    full = float(losses.double().sum())
    weighted, unweighted = [], []
    for draw in range(40):
        plan = budget_plan(losses, 1, 10, 0.5, 0.875, 0.25, torch.Generator().manual_seed(draw))
        weighted.append(float((plan.weights.double() * losses[plan.rows]).sum()) / full)
        unweighted.append(float(losses[plan.rows].double().sum()) / full)
    assert abs(np.mean(weighted) - 1) < 0.003
    assert abs(np.mean(unweighted) - 1) > 0.1
    _, share = budget_schedule(10, 0.5, 0.875)
    assert float(plan.weights.max()) <= 1 / (0.25 * share) + 1e-3  # the floor caps weights
    assert float(plan.weights.min()) >= 1.0


@pytest.mark.parametrize(("epochs", "pruning"), [(10, 8), (4, 3), (8, 7), (1, 0)])
def test_annealing_epochs_train_on_everything_with_weight_1(epochs, pruning):
    # delta * E = 8.75, 3.5, 7, 0.875: epochs e >= floor(delta * E) anneal, whole or not
    assert pruned_epochs(epochs, 0.875) == pruning
    losses = training_losses(3)
    # lipt anneals where its budget affords it: 0.6 * E / 1.4 epochs at most (none for E=1)
    lipt_pruning = budget_schedule(epochs, 0.6, 0.875)[0]
    assert lipt_pruning == (1 if epochs == 1 else pruning)
    for method, first_full in ((InfoBatch(), pruning), (LiptBudget(budget=0.6), lipt_pruning)):
        for epoch in range(epochs):
            plan = method.plan(losses, epoch, epochs, torch.Generator().manual_seed(epoch))
            if epoch >= first_full:
                assert plan.annealing and torch.equal(plan.rows, torch.arange(POOL))
                assert (plan.weights == 1).all()  # the last pruned epoch's weights are gone
            else:
                assert len(plan.rows) < POOL and (plan.weights > 1).any()
    assert pruned_epochs(100, 0.57) == 57  # 0.57 * 100 = 56.99999999999999 in floats


def test_infobatch_epoch_0_prunes_nothing_while_lipt_prunes_by_the_ensemble():
    method = InfoBatch()
    start = method.initial_scores(POOL)  # all 3.0, as published
    plan = method.plan(start, 0, 10, torch.Generator().manual_seed(0))
    assert len(plan.rows) == POOL and (plan.weights == 1).all()

    logits, embeddings, targets, heads = ensemble_outputs()
    scores = ensemble_losses(logits, embeddings, targets, heads)  # [N]
    assert scores.shape == (POOL,) and (scores >= 0).all() and scores.std() > 0.1
    lipt = LiptBudget(budget=0.5)
    plan = lipt.plan(scores, 0, 4, torch.Generator().manual_seed(0))
    assert budget_schedule(4, 0.5, 0.875) == (3, pytest.approx(1 / 3))
    assert abs(len(plan.rows) / POOL - 1 / 3) < 0.01  # epoch 0 already keeps its share
    # the ensemble's hard samples are kept far more often than its easy ones
    kept = torch.zeros(POOL, dtype=torch.bool)
    kept[plan.rows] = True
    hard = scores > scores.quantile(0.9)
    easy = scores < scores.quantile(0.1)
    assert kept[hard].float().mean() > 0.9 and kept[easy].float().mean() < 0.15


def test_infobatch_soup_prunes_epoch_0_by_the_ensemble_as_infobatch_prunes_later_ones():
    logits, embeddings, targets, heads = ensemble_outputs()
    scores = ensemble_losses(logits, embeddings, targets, heads)  # [N]
    method = InfoBatch(start="ensemble")
    assert method.needs_ensemble and not InfoBatch().needs_ensemble
    plan = method.plan(scores, 0, 10, torch.Generator().manual_seed(0))
    below = scores.double() < scores.double().mean()
    kept = torch.zeros(POOL, dtype=torch.bool)
    kept[plan.rows] = True
    # every above-mean (hard) sample is kept at weight 1; half the below-mean ones are left out
    assert kept[~below].all() and (plan.weights[~below[plan.rows]] == 1).all()
    assert int(kept[below].sum()) == int(0.5 * int(below.sum()))
    assert (plan.weights[below[plan.rows]] == 2).all()


def test_same_seed_and_epoch_give_the_same_plan():
    losses = training_losses(4)
    for method in (InfoBatch(), LiptBudget()):
        a, b, c = (
            method.plan(losses, 1, 10, torch.Generator().manual_seed(seed)) for seed in (7, 7, 8)
        )
        assert torch.equal(a.rows, b.rows) and torch.equal(a.weights, b.weights)
        assert not torch.equal(a.rows, c.rows)


@pytest.mark.parametrize("budget", [0.15, 0.3, 0.5, 0.8, 1.0])
def test_lipt_budget_is_the_share_of_the_full_data_cost(budget):
    losses, epochs = training_losses(5), 6
    total = 0
    for epoch in range(epochs):
        plan = budget_plan(losses, epoch, epochs, budget, 0.875, 0.25, torch.Generator())
        total += len(plan.rows)
    assert abs(total / (POOL * epochs) - budget) < 0.005
    pruning, share = budget_schedule(epochs, budget, 0.875)
    assert pruning * share + (epochs - pruning) == pytest.approx(budget * epochs)
    if budget * epochs / (2 - budget) < 1:  # no annealing epoch leaves half the share (0.15)
        assert (pruning, share) == (epochs, pytest.approx(budget))
    else:  # floor(0.875 * 6) = 5 prune, one anneals on full data
        assert pruning == 5 and budget / 2 <= share <= budget


def test_a_budget_of_a_few_rows_an_epoch_keeps_one_in_every_epoch():
    """0.4% of a 500-row pool keeps 2 rows an epoch in expectation, so some of 15 epochs'
    draws keep none; an empty epoch would end Lightning's fit there. Each keeps one at least,
    drawn by its keep probability, weight 1 / p; the budget is still met on average."""
    losses = training_losses(6)[:500]
    kept = []
    for epoch in range(15):
        stream = generator(0, "dynamic", epoch)  # as DynamicPruning draws each epoch's plan
        plan = budget_plan(losses, epoch, 15, 0.004, 0.875, 0.25, stream)
        p = keep_probabilities(losses, 0.004 * 500, 0.25 * 0.004)
        assert torch.allclose(plan.weights, (1 / p[plan.rows]).float())
        kept.append(len(plan.rows))
    assert min(kept) >= 1 and sum(kept) < 2 * 0.004 * 500 * 15, kept


def test_infobatch_epochs_cost_at_most_the_whole_pools_run():
    # round(1.0 x 4 / 0.7) = 6 epochs would cost more than the whole pool's 4: capped at E
    assert infobatch_epochs(1.0, 4) == 4 and infobatch_epochs(0.8, 10) == 10
    assert all(infobatch_epochs(f / 100, e) <= e for f in range(1, 101) for e in range(1, 40))
    # up to 0.7, the epochs `fraction` buys at InfoBatch's ~70% (the frontier's, at E = 12)
    assert [infobatch_epochs(f, 12) for f in (0.1, 0.3, 0.5, 0.7)] == [2, 5, 9, 12]


def test_bad_arguments_are_value_errors():
    losses = training_losses()
    g = torch.Generator()
    for call in (
        lambda: infobatch_plan(losses, 0, 10, 1.0, 0.875, g),
        lambda: infobatch_plan(losses, 0, 10, 0.5, 0.0, g),
        lambda: budget_plan(losses, 0, 10, 0.0, 0.875, 0.25, g),
        lambda: budget_plan(losses, 0, 10, 0.5, 0.875, 1.5, g),
        lambda: pruned_epochs(0, 0.5),
        lambda: InfoBatch(ratio=1.0),
        lambda: LiptBudget(budget=1.2),
    ):
        with pytest.raises(ValueError):
            call()


# --- main training end to end --------------------------------------------------------------


# InfoBatch as published: every epoch of trainer.max_epochs.
INFOBATCH = [*FAST, "budget.epochs=all", "trainer.max_epochs=4"]


@pytest.mark.parametrize("resident", ["true", "false"])
def test_infobatch_trains_on_both_data_paths_and_feeds_exactly_each_plan(tmp_path, resident):
    args = [*INFOBATCH, f"dataset.resident={resident}", "record_seen=true"]
    if resident == "true":
        args = [o for o in args if o != "logger=none"]  # the csv logger, for train/pruned_share
    summary = train_stage.run(validate(compose_train(tmp_path, args)))
    ledger = summary["stages"]["train"]["dynamic"]
    fed = 0
    for epoch in range(4):
        with np.load(audit_path(tmp_path, epoch, 0)) as planned:
            plan_indices, plan_weights = planned["indices"], planned["weights"]
        indices, weights = load_seen(tmp_path, epoch)
        order = np.argsort(indices)
        assert np.array_equal(indices[order], plan_indices)  # the plan, each sample once
        assert np.array_equal(weights[order], plan_weights)  # with its weight
        assert ledger["pruned_share"][str(epoch)] == pytest.approx(1 - len(indices) / 500)
        fed += len(indices)
    shares = ledger["pruned_share"]
    assert shares["0"] == 0 and shares["3"] == 0  # equal scores; floor(0.875 * 4) = 3 anneals
    assert shares["1"] > 0.1 and shares["2"] > 0.1
    train = summary["stages"]["train"]
    assert train["samples"] == fed and ledger["samples_full"] == 4 * 500
    assert ledger["samples_saved"] == 4 * 500 - fed and ledger["method"] == "infobatch"
    assert ledger["ratio"] == 0.5 and ledger["delta"] == 0.875
    assert summary["test_accuracy"] > 0.5  # 4 classes: chance is 0.25
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["stages"]["train"]["dynamic"] == ledger
    if resident == "true":
        metrics = next((tmp_path / "csv").rglob("metrics.csv")).read_text().splitlines()
        column = metrics[0].split(",").index("train/pruned_share")
        logged = [float(row.split(",")[column]) for row in metrics[1:] if row.split(",")[column]]
        assert logged == pytest.approx([shares[str(e)] for e in range(4)], abs=1e-6)
        # The bar's train/loss is the samples' own mean; the loss trained on carries the
        # weights that restore a whole epoch's sum: larger in the pruned epochs only.
        rows = [
            dict(zip(metrics[0].split(","), row.split(","), strict=True)) for row in metrics[1:]
        ]
        epoch_rows = [r for r in rows if r["train/weighted_loss"]]
        mean = [float(r["train/loss_epoch"]) for r in epoch_rows]
        weighted = [float(r["train/weighted_loss"]) for r in epoch_rows]
        assert len(mean) == 4
        assert weighted[1] > 1.05 * mean[1] and weighted[2] > 1.05 * mean[2]
        assert weighted[0] == pytest.approx(mean[0]) and weighted[3] == pytest.approx(mean[3])


def test_the_default_trains_infobatch_for_the_epochs_its_fraction_buys(tmp_path):
    # budget=infobatch (FAST's): 30% of a 10-epoch run's cost, at InfoBatch's ~70% kept, buys
    # round(3 / 0.7) = 4 epochs of the whole pool, pruned as InfoBatch prunes.
    summary = train_stage.run(
        validate(compose_train(tmp_path, [*FAST, "fraction=0.3", "trainer.max_epochs=10"]))
    )
    ledger = summary["stages"]["train"]["dynamic"]
    assert ledger["method"] == "infobatch" and summary["config"]["budget"]["name"] == "infobatch"
    assert summary["config"]["selector"]["name"] == "none" and len(ledger["pruned_share"]) == 4
    shares = ledger["pruned_share"]
    assert sorted(shares) == ["0", "1", "2", "3"]  # 4 epochs, not trainer.max_epochs=10
    assert shares["0"] == 0 and shares["3"] == 0 and shares["1"] > 0.1  # as published
    # measured against the whole pool's run, trainer.max_epochs of it, not its own 4 epochs
    assert ledger["samples_full"] == 10 * 500 and summary["subset_size"] == 500
    assert ledger["samples_saved"] == 10 * 500 - summary["stages"]["train"]["samples"]
    assert "pretrain" not in summary["stages"] and "select" not in summary["stages"]


class SimulatedCrashError(RuntimeError):
    pass


# A validation in mid-epoch (val_check_interval 0.5) checkpoints nothing: the crash after it
# resumes from epoch 1's end too (a resume from mid-epoch would draw epoch 2 anew).
@pytest.mark.parametrize(
    ("validation", "crash_at"), [([], 1), (["+trainer.val_check_interval=0.5"], 8)]
)
def test_a_dynamic_run_resumes_bit_for_bit(tmp_path, monkeypatch, validation, crash_at):
    args = [*INFOBATCH, "record_seen=true", *validation]
    real_step = Classifier.training_step

    def crash_in_epoch_2(self, batch, batch_idx):
        if self.current_epoch == 2 and batch_idx == crash_at:
            raise SimulatedCrashError("killed")  # after epochs 0 and 1 are checkpointed
        return real_step(self, batch, batch_idx)

    killed = tmp_path / "killed"
    monkeypatch.setattr(Classifier, "training_step", crash_in_epoch_2)
    with pytest.raises(SimulatedCrashError):
        train_stage.run(validate(compose_train(killed, args)))
    monkeypatch.setattr(Classifier, "training_step", real_step)
    resumed = train_stage.run(validate(compose_train(killed, [*args, "ckpt_path=last"])))
    clean = train_stage.run(validate(compose_train(tmp_path / "clean", args)))

    def weights(out: Path) -> dict[str, torch.Tensor]:
        return torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]

    a, b = weights(killed), weights(tmp_path / "clean")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["test_accuracy"] == clean["test_accuracy"]
    ledger, clean_ledger = resumed["stages"]["train"], clean["stages"]["train"]
    assert ledger["dynamic"] == clean_ledger["dynamic"]  # epochs 0-1 came via the checkpoint
    assert ledger["samples"] == clean_ledger["samples"]
    for epoch in (2, 3):  # planned again after the resume from the restored scores
        with (
            np.load(audit_path(killed, epoch, 0)) as x,
            np.load(audit_path(tmp_path / "clean", epoch, 0)) as y,
        ):
            assert np.array_equal(x["scores"], y["scores"])
            assert np.array_equal(x["indices"], y["indices"])


def test_lipt_prunes_from_epoch_0_with_the_jigsaw_ensemble_within_its_budget(tmp_path):
    jigsaw = ["pretrain=jigsaw", "pretrain.num_learners=3", "pretrain.local_epochs=2"]
    args = [*FAST, *jigsaw, "merge.ratios=3", "budget=lipt"]
    args += ["fraction=0.4", "trainer.max_epochs=5", "init_from=pretrained"]
    summary = train_stage.run(validate(compose_train(tmp_path, args)))
    stages = summary["stages"]
    assert stages["pretrain"]["learners_merged"] >= 2 and stages["score"]["samples"] == 500
    ledger = stages["train"]["dynamic"]
    assert ledger["method"] == "lipt" and ledger["budget"] == 0.4
    # floor(0.875 * 5) = 4: 0.4 * 5 / 1.6 = 1.25 affords the one annealing epoch
    pruning, share = budget_schedule(5, 0.4, 0.875)
    assert (pruning, share) == (4, pytest.approx(0.25))
    assert ledger["pruned_share"]["0"] > 0.5 and ledger["pruned_share"]["4"] == 0
    assert abs(stages["train"]["samples"] / (0.4 * 500 * 5) - 1) < 0.15  # Poisson draws of 500
    assert json.loads((tmp_path / "stages.json").read_text())["score"] == stages["score"]
    # the soup's merge report, as a selecting run writes it (wandb logs its table from it)
    merged = json.loads((tmp_path / "merge_report.json").read_text())
    assert len(merged["learners"]) == 3


def test_a_tiny_lipt_budget_trains_every_epoch_of_the_run(tmp_path):
    """0.4% of 15 epochs of a 500-image pool: about 2 images an epoch. An epoch whose draw
    kept none ended the fit there (Lightning stops at an epoch without batches), the summary
    reporting the 2 epochs trained as the run; every epoch trains now, within the budget."""
    jigsaw = ["pretrain=jigsaw", "pretrain.num_learners=3", "pretrain.local_epochs=2"]
    args = [*FAST, *jigsaw, "merge.ratios=3", "budget=lipt", "fraction=0.004"]
    summary = train_stage.run(validate(compose_train(tmp_path, [*args, "trainer.max_epochs=15"])))
    shares = summary["stages"]["train"]["dynamic"]["pruned_share"]
    assert list(shares) == [str(e) for e in range(15)]  # in epoch order ("10" after "9")
    assert all(share < 1 for share in shares.values())  # each trained a sample at least
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 14
    assert 15 <= summary["stages"]["train"]["samples"] < 2 * 0.004 * 500 * 15


def test_infobatch_soup_pre_trains_and_prunes_from_epoch_0_for_infobatch_epochs(tmp_path):
    jigsaw = ["pretrain=jigsaw", "pretrain.num_learners=3", "pretrain.local_epochs=2"]
    args = [*FAST, *jigsaw, "merge.ratios=3", "budget=infobatch_soup"]
    args += ["fraction=0.42", "trainer.max_epochs=5"]
    summary = train_stage.run(validate(compose_train(tmp_path, args)))
    stages = summary["stages"]
    assert stages["pretrain"]["learners_merged"] >= 2 and stages["score"]["samples"] == 500
    ledger = stages["train"]["dynamic"]
    assert ledger["method"] == "infobatch_soup"
    assert len(ledger["pruned_share"]) == 3  # round(0.42 * 5 / 0.7): InfoBatch's epochs
    # epoch 0 prunes (budget=infobatch's keeps all of it); floor(0.875 * 3) = 2: epoch 2 anneals
    assert 0.1 < ledger["pruned_share"]["0"] < 0.5 and ledger["pruned_share"]["2"] == 0


def test_a_lipt_run_resumes_bit_for_bit_without_pre_training_again(tmp_path, monkeypatch):
    from lipt.stages import dynamic as dynamic_stage

    jigsaw = ["pretrain=jigsaw", "pretrain.num_learners=3", "pretrain.local_epochs=2"]
    args = [*FAST, *jigsaw, "merge.ratios=3", "budget=lipt"]
    args += ["trainer.max_epochs=4", "record_seen=true"]
    real_step = Classifier.training_step

    def crash_in_epoch_2(self, batch, batch_idx):
        if self.current_epoch == 2 and batch_idx == 1:
            raise SimulatedCrashError("killed")
        return real_step(self, batch, batch_idx)

    killed = tmp_path / "killed"
    monkeypatch.setattr(Classifier, "training_step", crash_in_epoch_2)
    with pytest.raises(SimulatedCrashError):
        train_stage.run(validate(compose_train(killed, args)))
    first_attempt = json.loads((killed / "stages.json").read_text())
    monkeypatch.setattr(Classifier, "training_step", real_step)

    def no_pretraining(*_args, **_kwargs):
        raise AssertionError("a resumed run re-used the checkpoint's scores, not the ensemble")

    monkeypatch.setattr(dynamic_stage, "ranking_models", no_pretraining)
    resumed = train_stage.run(validate(compose_train(killed, [*args, "ckpt_path=last"])))
    monkeypatch.undo()
    clean = train_stage.run(validate(compose_train(tmp_path / "clean", args)))
    assert resumed["stages"]["pretrain"] == first_attempt["pretrain"]
    assert resumed["stages"]["score"] == first_attempt["score"]
    assert resumed["stages"]["train"]["dynamic"] == clean["stages"]["train"]["dynamic"]
    assert resumed["stages"]["train"]["dynamic"]["pruned_share"]["0"] > 0.5  # by the ensemble
    a, b = (
        torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        for out in (killed, tmp_path / "clean")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.ddp
def test_ddp_ranks_keep_identical_scores_and_train_halves_of_each_plan(tmp_path):
    run_dir = tmp_path / "run"
    out = run_entry(
        "train.py",
        [
            *INFOBATCH,
            "trainer.max_epochs=3",
            "record_seen=true",
            "trainer.devices=2",
            "trainer.strategy=ddp",
            f"hydra.run.dir={run_dir}",
        ],
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for epoch in range(3):
        with (
            np.load(audit_path(run_dir, epoch, 0)) as r0,
            np.load(audit_path(run_dir, epoch, 1)) as r1,
        ):
            for key in ("scores", "indices", "weights"):  # every rank scored and drew alike
                assert np.array_equal(r0[key], r1[key]), (epoch, key)
            plan = set(r0["indices"].tolist())
            scores = r0["scores"]
        (i0, _), (i1, _) = (load_seen(run_dir, epoch, rank) for rank in (0, 1))
        assert set(i0.tolist()) | set(i1.tolist()) == plan  # the ranks split the plan
        assert len(i0) == len(i1) == -(-len(plan) // 2)  # padded alike
        if epoch == 1:  # epoch 0's losses came from both ranks' halves
            assert len(np.unique(scores)) > 400
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stages"]["train"]["dynamic"]["pruned_share"]["1"] > 0


REFUSED = [
    (["budget=infobatch", "budget.ratio=1"], "budget.ratio"),
    (["budget=infobatch", "budget.ratio=-0.1"], "budget.ratio"),
    (["budget=infobatch", "budget.delta=0"], "budget.delta"),
    (["budget=infobatch", "budget.delta=1.5"], "budget.delta"),
    (["budget=infobatch", "budget.epochs=some"], "budget.epochs"),
    (["budget=infobatch", "+budget.budget=0.5"], "budget.budget"),
    (["budget=lipt", "pretrain=jigsaw", "fraction=0"], "fraction"),
    (["budget=lipt", "pretrain=jigsaw", "fraction=1.5"], "fraction"),
    (["budget=lipt", "pretrain=jigsaw", "budget.floor=0"], "budget.floor"),
    (["budget=lipt", "pretrain=none"], "pretrain=none"),
    (["budget=infobatch_soup", "pretrain=none"], "pretrain=none"),
    (["budget=infobatch", "selector=coverage"], "selector=coverage"),
    (["budget=subset"], "selector=none"),
]


@pytest.mark.parametrize(("overrides", "key"), REFUSED, ids=lambda v: str(v)[:50])
def test_bad_budget_settings_are_refused_naming_the_key(make_cfg, overrides, key):
    cfg = make_cfg([*FAST, *overrides])
    with pytest.raises(UserError) as caught:
        validate(cfg)  # the ranges are declared on the plans: the deep checks import them
    assert key in str(caught.value) and "\n" not in str(caught.value)


def test_budget_configs_compose_and_pass_every_check(make_cfg):
    validate(make_cfg([*FAST, "budget.epochs=all"]))
    validate(make_cfg(["budget=lipt", "fraction=0.3"]))  # jigsaw: the default pre-training
    # lipt for the default; a selector chooses budget=subset itself, a budget given wins.
    assert make_cfg([]).budget._target_ == "lipt.budget.LiptDynamic"
    assert make_cfg([]).selector.name == "none"
    assert make_cfg(["selector=coverage"]).budget._target_ == "lipt.budget.Subset"
    assert (
        make_cfg(["selector=coverage", "budget=lipt"]).budget._target_ == "lipt.budget.LiptDynamic"
    )
    assert make_cfg(["+approach=coverage"]).budget.name == "subset"
    assert make_cfg(["+approach=full_data"]).budget.name == "full"


def test_the_frontier_sweeps_pass_the_cli_precheck_and_a_bad_budget_fails_it(capsys):
    # The frontier's methods as overrides: every job's config composed as the sweeper does.
    infobatch = ["budget=infobatch", "pretrain=none", "trainer.max_epochs=2"]
    precheck("train", [*infobatch, "seed=0,1"], multirun=True)
    lipt = ["budget=lipt", "trainer.max_epochs=2", "seed=0"]
    precheck("train", [*lipt, "fraction=0.3,0.5"], multirun=True)
    with pytest.raises(SystemExit) as exit_:
        precheck("train", [*lipt, "budget.floor=0.5,1.5"], multirun=True)
    assert exit_.value.code == 2 and "budget.floor=1.5" in capsys.readouterr().err


def test_a_bad_dynamic_value_exits_2_with_one_line_before_any_stage(tmp_path):
    run_dir = tmp_path / "run"
    out = run_entry(
        "train.py",
        [*FAST, "budget=lipt", "budget.delta=2", f"hydra.run.dir={run_dir}"],
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "budget.delta=2" in lines[0], out.stderr
    assert not run_dir.exists()


def test_the_fewest_rows_an_epoch_keeps_bound_every_draw():
    """What a validation every N batches is checked against before main training: InfoBatch
    keeps at least every row at or above the mean and 1 - ratio of the others, exactly that
    when all but one row is below it; lipt's draw on Fashion-MNIST's pool at 10% of 12 epochs
    stays above its bound in each of 200 epochs drawn, and the bound is within 10% of the
    expected count there (not a bound too loose to refuse anything)."""
    worst = torch.zeros(POOL)
    worst[0] = 10.0  # one row above the mean, the rest below
    generator = torch.Generator().manual_seed(0)
    plan = infobatch_plan(worst, 1, 12, 0.5, 0.875, generator)
    assert len(plan.rows) == InfoBatch(ratio=0.5).fewest_rows(POOL, 12) == 1 + 27_499
    losses = torch.distributions.Gamma(2.0, 2.0).sample((POOL,))  # a loss-like spread
    assert len(infobatch_plan(losses, 1, 12, 0.5, 0.875, generator).rows) > 27_500
    method = LiptBudget(budget=0.1)
    fewest = method.fewest_rows(POOL, 12)
    _, share = budget_schedule(12, 0.1, 0.875)
    assert 0.9 * share * POOL < fewest < share * POOL
    kept = [len(method.plan(losses, 0, 12, generator).rows) for _ in range(200)]
    assert min(kept) >= fewest, (min(kept), fewest)


def test_a_lipt_budget_that_prunes_nothing_is_checked_against_whole_epochs(make_cfg):
    """budget=lipt fraction=1 trains every row of every epoch (q = 1, no draw), yet the
    validation check counted its epochs as a draw 4 standard deviations short (54,061 of
    55,000 rows, 212 batches of 256): a validation every 214 of its 215 batches was refused."""
    from lipt.stages.training_plan import check_validation_fits

    assert LiptBudget(budget=1.0).fewest_rows(POOL, 12) == POOL
    losses = training_losses()
    for epoch in range(12):
        assert len(LiptBudget(budget=1.0).plan(losses, epoch, 12, generator(0, epoch)).rows) == POOL
    args = [*FAST, "budget=lipt", "pretrain=jigsaw", "fraction=1", "batch_size=256"]
    args += ["trainer.max_epochs=12"]
    check_validation_fits(validate(make_cfg([*args, "+trainer.val_check_interval=215"])), POOL)
    with pytest.raises(UserError, match="main training's epoch has 215 "):
        check_validation_fits(validate(make_cfg([*args, "+trainer.val_check_interval=216"])), POOL)
    drawn = [*args, "fraction=0.99", "+trainer.val_check_interval=214"]  # a draw: a bound
    with pytest.raises(UserError, match=r"epoch has 209 \(as few as 53,407 of the 55,000"):
        check_validation_fits(validate(make_cfg(drawn)), POOL)


@pytest.mark.parametrize(
    ("overrides", "prunes"),
    [
        (["fraction=0.1", "trainer.max_epochs=15"], False),  # 2 epochs: equal, then annealing
        (["budget.epochs=all", "trainer.max_epochs=1"], False),  # epoch 0: all scores equal
        (["budget=infobatch_soup", "pretrain=jigsaw", "trainer.max_epochs=15"], True),  # epoch 0
        (["fraction=0.3", "trainer.max_epochs=15"], True),  # 6 epochs: 1 to 4 prune
    ],
)
def test_an_infobatch_run_that_prunes_no_epoch_is_checked_against_whole_epochs(
    make_cfg, overrides, prunes
):
    """budget=infobatch at its default fraction of 15 epochs trains 2 (round(1.5 / 0.7)):
    epoch 0 on equal scores, epoch 1 annealing, both every row. The validation check took it
    for a run pruned to 27,500 rows (108 batches of 256) and refused a validation every 200 of
    its 215 batches; it now counts the epochs the budget trains, and bounds those that prune."""
    from lipt.stages.training_plan import check_validation_fits

    args = [*FAST, "budget=infobatch", "batch_size=256", "+trainer.val_check_interval=200"]
    run = validate(make_cfg([*args, *overrides]))
    if prunes:
        with pytest.raises(UserError, match=r"epoch has 108 \(as few as 27,500 of the 55,000"):
            check_validation_fits(run, POOL)
    else:
        check_validation_fits(run, POOL)
        epochs = infobatch_epochs(0.1, 15) if "fraction=0.1" in overrides else 1
        losses = training_losses()
        for epoch in range(epochs):  # every row, as the check now counts them
            plan = InfoBatch().plan(
                losses if epoch else torch.full((POOL,), 3.0), epoch, epochs, generator(0, epoch)
            )
            assert len(plan.rows) == POOL


# --- step budgets: the steps the schedule spans are the steps the Trainer takes ---------------


def lightning_fit(rows: int, batch_size: int, devices: int, accumulate: int, limit, epochs, stop):
    """(optimiser steps, epochs) of a fit as Lightning runs it: each device's ceil(rows /
    devices) rows in batches, up to limit_train_batches, a step every `accumulate` batches and
    at an epoch's end, for `epochs` epochs or until StopAtStep's `stop` steps."""
    from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches
    from lightning.pytorch.trainer.setup import _determine_batch_limits
    from lightning.pytorch.trainer.states import RunningStage

    batches = math.ceil(math.ceil(rows / devices) / batch_size)
    if limit is not None:  # Lightning's own reading of the limit, then of the epoch's batches
        read = _determine_batch_limits(limit, "limit_train_batches")
        batches = int(_parse_num_batches(RunningStage.TRAINING, batches, read))
    steps = 0
    for epoch in range(epochs):
        for batch in range(batches):
            if (batch + 1) % accumulate == 0 or batch == batches - 1:
                steps += 1
            if steps >= stop:
                return steps, epoch + 1
    return steps, epochs


STEP_BUDGETS = [  # (budget, fraction, max_epochs) x (batch_size, devices, accumulate)
    (budget, batches)
    for budget in [
        ("full_schedule", 0.25, 10),
        ("full_schedule", 0.1, 15),
        ("full_steps", 0.1, 12),
        ("full_steps", 0.3, 36),
    ]
    for batches in [(128, 1, 1), (256, 2, 1), (512, 1, 2)]
]
# The step budgets' compositions by their group choices (two: the budgets), kept for every
# limit's case: compose_jobs sets each case's plain values on a copy, as the precheck composes a
# sweep (tests/test_dry_run.py: the same config as composing each alone)
STEP_BUDGET_COMPOSITIONS: dict = {}


@pytest.mark.parametrize("limit", [None, 0.5, 0.25, 40, 7, 10.0, "overfit", "overfit_float"])
def test_a_step_budgets_schedule_ends_where_the_trainer_stops(tmp_path, limit):
    """budget=full_schedule and full_steps on Fashion-MNIST's pool: the cosine runs over the
    budget's steps (Classifier's total_steps) and the fit stops at them, on the epochs planned.
    Under trainer.limit_train_batches the steps were counted on whole epochs while the epochs
    planned were the whole epochs' too: 3 limited epochs of a 10-epoch full_schedule at 25%
    took 12 of the cosine's 20 steps, its learning rate left at a third of its peak."""
    from lipt.stages.training_plan import schedule_of

    limited = [] if limit is None else [f"+trainer.limit_train_batches={limit}"]
    if limit == "overfit":  # overfit_batches replaces the limit, as Lightning reads it
        limited, limit = ["+trainer.limit_train_batches=0.5", "+trainer.overfit_batches=9"], 9
    elif limit == "overfit_float":  # given to the limit as is: 10.0 is then no share, all
        limited, limit = ["+trainer.limit_train_batches=0.5", "+trainer.overfit_batches=10.0"], None
    jobs = []
    for (budget, fraction, epochs), (batch_size, devices, accumulate) in STEP_BUDGETS:
        args = [*FAST, f"budget={budget}", f"fraction={fraction}", f"batch_size={batch_size}"]
        args += [f"trainer.max_epochs={epochs}", f"trainer.devices={devices}"]
        args += [f"+trainer.accumulate_grad_batches={accumulate}", *limited]
        jobs.append([f"paths.output_dir={tmp_path}", *args])
    composed = compose_jobs("train", jobs, STEP_BUDGET_COMPOSITIONS)
    for (_, (batch_size, devices, accumulate)), args, cfg in zip(
        STEP_BUDGETS, jobs, composed, strict=True
    ):
        schedule = schedule_of(validate(cfg), POOL, POOL)
        assert schedule.steps is not None
        taken = lightning_fit(
            POOL, batch_size, devices, accumulate, limit, schedule.epochs, schedule.steps
        )
        assert taken == (schedule.steps, schedule.epochs), (args, schedule, taken)


def test_a_limited_step_budget_anneals_its_schedule_to_the_end(tmp_path):
    # 500 images in batches of 32 are 16 batches, 8 under the limit, 4 steps of 2: 25% of 10
    # such epochs is 10 steps over 3 epochs, and the cosine's T_max is those 10.
    args = [*FAST, "budget=full_schedule", "fraction=0.25", "trainer.max_epochs=10"]
    args += ["+trainer.limit_train_batches=0.5", "+trainer.accumulate_grad_batches=2"]
    summary = train_stage.run(validate(compose_train(tmp_path, args)))
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    cosine = checkpoint["lr_schedulers"][0]
    assert checkpoint["global_step"] == cosine["T_max"] == cosine["last_epoch"] == 10
    assert checkpoint["epoch"] == 2 and summary["stages"]["train"]["samples"] == 10 * 2 * 32


# --- a checkpoint taken mid-epoch ---------------------------------------------------------------


def test_a_fit_resumed_mid_epoch_trains_the_epochs_plan_it_was_stopped_in(tmp_path):
    """A user's ModelCheckpoint(every_n_train_steps=...) saves in mid-epoch, after the epoch's
    first batches rewrote their rows' scores: the resumed fit drew that epoch's plan again from
    those scores, another pruned set (719 rows where the run had trained 732). The checkpoint
    keeps the epoch's plan: the resumed epoch trains the set it was stopped in."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch import nn
    from torch.utils.data import TensorDataset

    import lipt

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (1_100,), generator=g)
    x = torch.randn(4, 16, generator=g)[y] * 0.5 + torch.randn(1_100, 16, generator=g)

    class StopError(RuntimeError):
        pass

    class StopInEpoch2(L.Callback):
        def on_train_batch_end(self, trainer, *_args) -> None:
            if trainer.current_epoch == 2 and trainer.global_step % 20 == 4:
                raise StopError  # after a checkpoint in epoch 2

    def fit(out: Path, stop: bool, resume: Path | None = None) -> dict[int, list[int]]:
        """The rows each epoch's training loader was built on (the last loader of each)."""
        data = lipt.PoolDataModule(TensorDataset(x, y), val_size=0.1, batch_size=50)
        pruning = lipt.DynamicPruning(lipt.InfoBatch(delta=1.0), data, seed=2)
        built: dict[int, list[int]] = {}
        planned = pruning.epoch_subset

        def recorded(trainer: L.Trainer, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
            rows, weights = planned(trainer, epoch)
            built[epoch] = sorted(rows.tolist())
            return rows, weights

        pruning.epoch_subset = recorded  # type: ignore[method-assign]
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        module = Classifier(net, 4, loss_norm="batch", schedule_over="epochs")
        saves = ModelCheckpoint(out, "mid", every_n_train_steps=2, save_last=False)
        trainer = L.Trainer(
            max_epochs=4,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            callbacks=[pruning, saves, *([StopInEpoch2()] if stop else [])],
        )
        try:
            trainer.fit(module, datamodule=data, ckpt_path=resume)
        except StopError:
            assert stop
        return built

    whole = fit(tmp_path / "whole", stop=False)
    stopped = fit(tmp_path / "stopped", stop=True)
    checkpoint = tmp_path / "stopped" / "mid.ckpt"
    assert torch.load(checkpoint, weights_only=True)["epoch"] == 2
    resumed = fit(tmp_path / "resumed", stop=False, resume=checkpoint)
    assert 0 < len(whole[2]) < 990 and stopped[2] == whole[2]
    assert resumed[2] == whole[2]  # the pruned set the stopped run was training
