"""The `clean` group end to end on the synthetic data set: label_issues.csv/png and stages.clean
written, the action applied to what selection and training see, the soup pre-trained once for
cleaning and selection, and a resumed K-fold cleaning read back instead of trained again."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lipt.core.errors import UserError
from lipt.run.config import validate
from lipt.stages import clean as clean_stage
from lipt.stages import select as select_stage
from lipt.stages import train as train_stage
from lipt.stages.build import build_datamodule, build_parts
from tests.helpers import FAST, compose_train

NOISY = [*FAST, "dataset.label_noise.rate=0.3", "dataset.label_noise.seed=4"]
JIGSAW = ["pretrain=jigsaw", "pretrain.num_learners=4", "pretrain.local_epochs=3"]


def read_csv(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_lipt_cleaning_drops_what_it_flags_and_reports_detection(make_cfg, tmp_path):
    run = validate(make_cfg([*NOISY, *JIGSAW, "clean=lipt"]))
    summary = train_stage.run(run)
    rows = read_csv(tmp_path / "label_issues.csv")
    clean = summary["stages"]["clean"]
    assert list(rows[0]) == ["index", "given", "suggested", "score"]
    assert clean["flagged"] == len(rows) > 0 and clean["method"] == "lipt"
    assert 0 < clean["precision"] <= 1 and 0 < clean["recall"] <= 1
    # the flags are judged against the flips the data module recorded
    dm = build_datamodule(run)
    flagged = torch.tensor([int(r["index"]) for r in rows])
    wrong = dm.label_changes.wrong
    assert clean["precision"] == pytest.approx(float(wrong[flagged].float().mean()))
    assert clean["recall"] == pytest.approx(
        float(wrong[flagged].sum() / wrong[dm.pool_indices].sum())
    )
    assert all(int(r["given"]) == int(dm.train_source.labels[int(r["index"])]) for r in rows)
    assert not set(flagged.tolist()) & set(dm.val_indices.tolist())  # the pool only
    scores = [float(r["score"]) for r in rows]
    assert scores == sorted(scores)  # most likely wrong first
    # drop: training saw the pool without them; the soup was pre-trained for the cleaning
    assert summary["train_size"] == len(dm.pool_indices) - len(rows)
    wrong_in_pool = int(wrong[dm.pool_indices].sum())
    hits = int(wrong[flagged].sum())
    assert summary["wrong_labels"] == {"given": int(wrong.sum()), "pool": wrong_in_pool - hits}
    assert summary["stages"]["pretrain"]["samples"] == 4 * 32 * 3
    assert clean["detection_seconds"] >= clean["seconds"]
    assert (tmp_path / "label_issues.png").stat().st_size > 10_000


def test_cleaning_and_selection_share_one_soup(make_cfg, tmp_path):
    # budget=lipt scores the pool with the soup that clean=lipt pre-trained: trained once
    summary = train_stage.run(validate(make_cfg([*NOISY, *JIGSAW, "budget=lipt", "clean=lipt"])))
    assert summary["stages"]["pretrain"]["samples"] == 4 * 32 * 3
    learners = sorted(p.name for p in (tmp_path / "learners").iterdir())
    assert learners == [f"learner_{i}.ckpt" for i in range(4)]
    assert "score" in summary["stages"] and "clean" in summary["stages"]


@pytest.mark.parametrize("action", ["drop", "relabel"])
def test_kfold_cleaning_applies_its_action_to_the_data_module(make_cfg, tmp_path, action):
    overrides = [*NOISY, "clean=cleanlab", "clean.folds=3", f"clean.action={action}"]
    run = validate(make_cfg(overrides))
    dm = build_datamodule(run)
    pool, labels = dm.pool_indices.clone(), dm.train_source.labels.clone()
    cleaned = clean_stage.clean_pool(run, build_parts(run, dm), tmp_path, resume=False)
    assert cleaned is not None
    issues = cleaned.issues
    assert len(issues) > 0 and cleaned.stats["samples"] > 0  # three fold models trained
    assert bool(torch.isin(issues.rows, pool).all())
    if action == "drop":
        assert torch.equal(dm.pool_indices, pool[~torch.isin(pool, issues.rows)])
        assert torch.equal(dm.train_source.labels, labels)
    else:
        assert torch.equal(dm.pool_indices, pool)
        assert torch.equal(dm.train_source.labels[issues.rows], issues.suggested)
        untouched = ~torch.isin(torch.arange(len(labels)), issues.rows)
        assert torch.equal(dm.train_source.labels[untouched], labels[untouched])
        # both data paths serve the new labels: the resident copy is made again
        served = {}
        for _, y, idx in dm.pool_dataloader():
            served.update(zip(idx.tolist(), y.tolist(), strict=True))
        assert all(
            served[int(i)] == int(s) for i, s in zip(issues.rows, issues.suggested, strict=True)
        )


KFOLD = [*NOISY, "clean=cleanlab", "clean.folds=2"]


@pytest.fixture(scope="module")
def first_kfold(tmp_path_factory):
    """A first attempt's K-fold cleaning (KFOLD) and the folder it wrote, run once for the
    tests that read it back: each copies the folder into its own (_first_in)."""
    root = tmp_path_factory.mktemp("first_kfold")
    run = validate(compose_train(root, KFOLD))
    first = clean_stage.clean_pool(run, build_parts(run), root, resume=False)
    assert first is not None
    return first, root


def _first_in(first_kfold, out: Path):
    first, root = first_kfold
    shutil.copytree(root, out, dirs_exist_ok=True)
    return first


def test_a_resumed_kfold_cleaning_reads_its_issues_back(
    make_cfg, first_kfold, tmp_path, monkeypatch
):
    run = validate(make_cfg(KFOLD))
    first = _first_in(first_kfold, tmp_path)

    def no_training(*args, **kwargs):
        raise AssertionError("a resumed run trained the folds again")

    monkeypatch.setattr(clean_stage, "train_fold", no_training)
    dm = build_datamodule(run)
    again = clean_stage.clean_pool(run, build_parts(run, dm), tmp_path, resume=True)
    assert again is not None
    assert torch.equal(again.issues.rows, first.issues.rows)
    assert torch.equal(again.issues.suggested, first.issues.suggested)
    assert again.stats == first.stats  # the costs of the attempt that found them
    assert len(dm.pool_indices) == len(build_datamodule(run).pool_indices) - len(first.issues)


def test_an_extra_rank_reads_rank_0s_issues_and_finds_none_itself(
    make_cfg, first_kfold, tmp_path, monkeypatch
):
    """Under srun every task starts at once: an extra task found the pool's issues itself,
    pre-training and all, where rank 0 had not written them yet. It waits for rank 0's."""
    run = validate(make_cfg(KFOLD))
    first = _first_in(first_kfold, tmp_path)
    costs = tmp_path / clean_stage.CLEAN_FILE
    costs.rename(tmp_path / "aside.json")  # as rank 0 is still at it
    waited: list[Path] = []

    def rank_0_writes(path: Path, *args: object, **kwargs: object) -> None:
        waited.append(path)
        (tmp_path / "aside.json").rename(costs)

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("an extra rank trained the folds itself")

    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setattr(clean_stage, "wait_for_file", rank_0_writes)
    monkeypatch.setattr(clean_stage, "train_fold", no_training)
    again = clean_stage.clean_pool(run, build_parts(run), tmp_path, resume=False)
    assert waited == [costs] and again is not None
    assert torch.equal(again.issues.rows, first.issues.rows) and again.stats == first.stats


def test_select_py_lists_the_label_issues(make_cfg, tmp_path):
    summary = select_stage.run(
        validate(make_cfg([*NOISY, *JIGSAW, "clean=lipt", "selector=random"], "select"))
    )
    assert (tmp_path / "label_issues.csv").is_file() and (tmp_path / "subset.npz").is_file()
    saved = json.loads((tmp_path / "clean.json").read_text())
    assert saved["clean"] == summary["stages"]["clean"]
    assert "pretrain" in summary["stages"]


def test_datalab_runs_on_a_pool_without_some_class_of_the_data_set(make_cfg, tmp_path):
    """Labels of your own (dataset.train_labels) without class 3: Datalab took the pool's 3
    label values for its classes beside 4 columns of probabilities, failed its label check
    after the jigsaw stage ("No columns found for issue type 'label'", cleanlab's many lines)
    and the run ended with no label_issues.csv."""
    dm = build_datamodule(validate(make_cfg(FAST)))
    labels = dm.train_source.labels.clone()
    assert int(labels.max()) == 3 and int((labels == 3).sum()) > 50
    labels[labels == 3] = 0
    path = tmp_path / "labels.npy"
    np.save(path, labels.numpy())
    overrides = [*FAST, *JIGSAW, "selector=random", "clean=lipt", "clean.datalab=true"]
    run = validate(make_cfg([*overrides, f"dataset.train_labels={path}"], "select"))
    summary = select_stage.run(run)
    flagged = [int(r["index"]) for r in read_csv(tmp_path / "label_issues.csv")]
    rows = read_csv(tmp_path / "datalab_issues.csv")
    label_rows = [int(r["index"]) for r in rows if r["issue_type"] == "label"]
    assert flagged and sorted(label_rows) == sorted(flagged)  # the finder's own label issues
    assert all(int(r["given"]) in (0, 1, 2) for r in rows)
    datalab = summary["stages"]["clean"]["datalab"]
    assert datalab["label"] == len(flagged) and set(datalab) >= {"outlier", "near_duplicate"}


def test_a_datalab_that_fails_leaves_the_flags_it_came_after(make_cfg, tmp_path, monkeypatch):
    """Datalab ran before label_issues.csv was written: when it failed, the flags the jigsaw
    stage and the probe had found were lost with it. clean.json, which marks the cleaning done
    for a resume, is still written last."""

    def failing_datalab(*args, **kwargs):
        raise RuntimeError("Datalab failed")

    monkeypatch.setattr(clean_stage, "datalab_issues", failing_datalab)
    run = validate(make_cfg([*NOISY, *JIGSAW, "clean=lipt", "clean.datalab=true"]))
    with pytest.raises(RuntimeError, match="Datalab failed"):
        clean_stage.clean_pool(run, build_parts(run), tmp_path, resume=False)
    rows = read_csv(tmp_path / "label_issues.csv")
    assert len(rows) > 20 and list(rows[0]) == ["index", "given", "suggested", "score"]
    assert not (tmp_path / "clean.json").exists()


def test_a_cleaned_pool_trains_the_steps_of_the_whole_pools_budget(make_cfg, tmp_path):
    # budget=full_schedule on a pool that cleaning shrank: the steps the whole noisy pool takes
    # at this budget (the same spend), over more of its epochs
    schedule = [*NOISY, "budget=full_schedule", "fraction=0.5"]
    schedule += ["trainer.max_epochs=4"]
    whole = train_stage.run(
        validate(make_cfg([*schedule, f"paths.output_dir={tmp_path / 'whole'}"]))
    )
    cleaned = train_stage.run(
        validate(
            make_cfg(
                [*schedule, "clean=cleanlab", "clean.folds=2", f"paths.output_dir={tmp_path / 'c'}"]
            )
        )
    )
    dropped = cleaned["stages"]["clean"]["flagged"]
    assert dropped > 0.15 * whole["train_size"]  # enough that a shorter schedule would show
    assert cleaned["train_size"] == whole["train_size"] - dropped
    # the same optimiser steps of 32: equal but for each epoch's last, partial batch
    trained, budget = cleaned["stages"]["train"]["samples"], whole["stages"]["train"]["samples"]
    assert budget - 32 * 4 <= trained <= budget
    # and the cosine spans those steps, not the cleaned pool's epochs
    steps = round(0.5 * 4 * -(-whole["train_size"] // 32))
    for run in ("whole", "c"):
        ckpt = torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True)
        assert ckpt["global_step"] == steps
        assert ckpt["lr_schedulers"][0]["T_max"] == steps


@pytest.mark.parametrize("members", ["probe", "soup"])
def test_a_class_rarer_than_the_probes_folds_is_refused_before_pre_training(
    make_cfg, tmp_path, monkeypatch, members
):
    """The probe cannot suggest a class missing from a fold's training rows, so each of its
    items would be flagged (and dropped): refused, as lipt.find_label_issues refuses it, before
    the jigsaw stage trains; the soup's own predictions need no folds."""
    dm = build_datamodule(validate(make_cfg(FAST)))
    labels = dm.train_source.labels.clone()
    kept = dm.pool_indices[labels[dm.pool_indices] == 3][:2]  # class 3: two items of the pool
    labels[(labels == 3) & ~torch.isin(torch.arange(len(labels)), kept)] = 0
    path = tmp_path / "labels.npy"
    np.save(path, labels.numpy())
    overrides = [*FAST, *JIGSAW, "clean=lipt", f"clean.members={members}"]
    run = validate(make_cfg([*overrides, f"dataset.train_labels={path}"]))
    parts = build_parts(run)

    def no_pretraining(*args, **kwargs):
        raise AssertionError("pre-trained before the labels were checked")

    monkeypatch.setattr(clean_stage, "pretrain_model", no_pretraining)
    if members == "soup":
        with pytest.raises(AssertionError, match="pre-trained before"):  # checked, and passed
            clean_stage.clean_pool(run, parts, tmp_path, resume=False)
        return
    with pytest.raises(UserError) as refused:
        clean_stage.clean_pool(run, parts, tmp_path, resume=False)
    assert str(refused.value) == (
        "clean.probe_folds=5: class 3 has 2 item(s) in the pool, fewer than the folds, and the "
        "probe's cross-validation needs one per fold; use clean.probe_folds=2, or give the "
        "class at least 5 items"
    )


@pytest.mark.parametrize(("setting", "bar"), [("false", False), ("null", True)])
def test_a_cleaning_fold_draws_a_bar_unless_bars_are_turned_off(
    make_cfg, monkeypatch, setting, bar
):
    """On a terminal: trainer.enable_progress_bar=false is kept, where each fold drew one."""
    from lipt.core import console
    from lipt.run.config import run_of

    monkeypatch.setitem(console._state, "bars", True)  # a terminal
    run = run_of(make_cfg([*FAST, "clean=cleanlab", f"trainer.enable_progress_bar={setting}"]))
    parts = build_parts(run)
    asked: list[object] = []
    quiet = parts.quiet_trainer

    def trainer(**overrides: object):
        asked.append(overrides.get("enable_progress_bar"))
        return quiet(**overrides)

    import dataclasses

    parts = dataclasses.replace(parts, quiet_trainer=trainer)
    clean_stage.train_fold(run, parts, parts.dm.pool_indices[:64], 0.5, seed=0)
    assert asked == [bar]


def test_select_py_ranks_with_a_checkpoint_of_the_pool_before_cleaning(make_cfg, tmp_path):
    """select.py clean=cleanlab ckpt_path=...: the checkpoint was compared with the pool after
    cleaning had dropped rows of it, and refused ("a pool of 500 rows, this run 3xx") after the
    cleaning's work, with a fix (dataset.pool_size) that could not help."""
    from lipt.stages import pretrain as pretrain_stage

    noisy = ["dataset.label_noise.rate=0.3"]
    warm = tmp_path / "warm"
    pretrain = [*FAST, *noisy, "pretrain=full", "pretrain.epochs=1", f"paths.output_dir={warm}"]
    pretrain_stage.run(validate(make_cfg(pretrain, config_name="pretrain")))
    picks = [*FAST, *noisy, "selector=el2n", "fraction=0.2", "clean=cleanlab", "clean.folds=2"]
    picks += ["clean.epochs=1", f"ckpt_path={warm / 'pretrain.ckpt'}"]
    summary = select_stage.run(validate(make_cfg(picks, config_name="select")))
    clean = summary["stages"]["clean"]
    assert clean["flagged"] > 0 and summary["train_size"] == clean["pool"] - clean["flagged"]
    assert summary["subset_size"] == round(0.2 * summary["train_size"])
