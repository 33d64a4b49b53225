"""Refusals a dry run must see, and files of an earlier attempt that a run must not take for
its own: `pretrain.merge_from` beside `selector.repeats` (the other seeds' learners), a kept
subset selected from a pool that other label cleaning made, an earlier run's label issues
read back by a resume or by srun's extra tasks."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch

from lipt.core.artifacts import save_subset
from lipt.core.errors import UserError
from lipt.core.seeding import repeat_seed
from lipt.run.config import run_of, validate
from lipt.run.precheck import precheck
from lipt.stages import clean as clean_stage
from lipt.stages.build import build_datamodule, build_parts
from lipt.stages.resume import kept_subset
from lipt.stages.select import SUBSET_FILE, subset_meta
from tests.helpers import FAST, acting_on_first_refusal, compose_train

# --------------------------------------------------------------- merge_from beside repeats

JIGSAW = ["pretrain=jigsaw", "pretrain.num_learners=2", "pretrain.batches_per_learner=1"]
REPEATS = [*FAST, *JIGSAW, "selector=grand", "selector.repeats=2"]


def _learner_folder(root: Path, *seeds: int) -> Path:
    """A learner folder as a run with selector.repeats writes it: the run's own seed's
    learners in it, another seed's in seed_<seed> (the check only looks for their files)."""
    root.mkdir()
    (root / "learner_0.ckpt").write_bytes(b"")
    for seed in seeds:
        (root / f"seed_{seed}").mkdir()
        (root / f"seed_{seed}" / "learner_0.ckpt").write_bytes(b"")
    return root


@pytest.mark.parametrize("stage", ["select", "train"])
def test_a_dry_run_refuses_merge_from_without_the_other_seeds_learners(stage, tmp_path, capsys):
    """The run refused it before its first merge, but a dry run passed it (exit 0)."""
    folder = _learner_folder(tmp_path / "learners")
    budget = ["budget=subset"] if stage == "train" else []
    args = [*REPEATS, *budget, f"pretrain.merge_from={folder}", "dry_run=true"]
    with pytest.raises(SystemExit) as exit_:
        precheck(stage, [*args, f"hydra.run.dir={tmp_path / 'run'}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"holds no learners of seed {repeat_seed(0, 1)}" in err and "seed_" in err


def test_merge_from_with_every_seeds_learners_passes_the_dry_run(tmp_path):
    folder = _learner_folder(tmp_path / "learners", repeat_seed(0, 1))
    args = [*REPEATS, f"pretrain.merge_from={folder}", "dry_run=true"]
    assert precheck("select", [*args, f"hydra.run.dir={tmp_path / 'run'}"]) == 1


def test_merge_from_of_one_seed_passes_where_no_other_seed_is_merged(make_cfg, tmp_path):
    """selector.repeats=1, and pretrain.py (it merges the run's own seed alone)."""
    folder = _learner_folder(tmp_path / "learners")
    one = [*FAST, *JIGSAW, "selector=grand", "budget=subset", f"pretrain.merge_from={folder}"]
    validate(make_cfg(one, "select"), build=False)
    validate(make_cfg([*one, "selector.repeats=2"], "pretrain"), build=False)


# ------------------------------------------------------------ a kept subset and cleaning

SUBSET = [*FAST, "selector=random", "budget=subset", "ckpt_path=last"]


def _kept(make_cfg, out: Path, selected_with: list[str], resumed_with: list[str]):
    """subset.npz as an attempt with `selected_with` left it, kept by one with `resumed_with`
    (killed after selection, before main training saved an epoch)."""
    earlier = run_of(make_cfg([*SUBSET, *selected_with]))
    dm = build_datamodule(earlier)
    save_subset(out / SUBSET_FILE, dm.pool_indices[:50], torch.ones(50), subset_meta(earlier, dm))
    run = run_of(make_cfg([*SUBSET, *resumed_with]))
    return kept_subset(run, build_datamodule(run), out, None)


@pytest.mark.parametrize(
    ("selected_with", "resumed_with", "named"),
    [
        (["clean=lipt"], ["clean=none"], "clean=lipt, this run has clean=none"),
        (["clean=none"], ["clean=cleanlab"], "clean=none, this run has clean=cleanlab"),
        (["clean=cleanlab"], ["clean=warmup"], "clean=cleanlab, clean.epochs=1.0"),
        (["clean=lipt"], ["clean=lipt", "clean.action=relabel"], "clean.action=drop"),
        (["clean=cleanlab"], ["clean=cleanlab", "clean.folds=3"], "clean.folds=5"),
    ],
)
def test_a_kept_subset_of_another_cleaning_is_refused(
    make_cfg, tmp_path, selected_with, resumed_with, named
):
    """It was kept silently: selected from the pool clean=lipt left (334 of 500 rows), it
    trained as 100 of the whole 500 under clean=none; selected without cleaning, 55 of its
    rows were ones clean=lipt had just dropped from the pool."""
    with pytest.raises(UserError, match=f"subset.npz was selected with {named}"):
        _kept(make_cfg, tmp_path, selected_with, resumed_with)


@pytest.mark.parametrize("clean", [["clean=none"], ["clean=lipt", "clean.datalab=true"]])
def test_a_kept_subset_of_the_same_cleaning_is_kept(make_cfg, tmp_path, clean):
    subset, _ = _kept(make_cfg, tmp_path, clean, clean)
    assert subset is not None and len(subset[0]) == 50


def test_a_subset_without_cleaning_records_none(make_cfg):
    """subset.npz of a run without cleaning holds what it held (its bytes compared by
    scripts/same_bits.sh); a kept one is read as clean=none."""
    run = run_of(make_cfg(SUBSET))
    assert not [key for key in subset_meta(run, build_datamodule(run)) if "clean" in key]


def test_an_older_lipts_subset_beside_its_cleaning_is_passed_over(make_cfg, tmp_path):
    """A subset file and a clean.json that record no cleaning settings (an older lipt's): the
    cleaning they had is unknown, so it is not taken for clean=none."""
    earlier = run_of(make_cfg(SUBSET))
    dm = build_datamodule(earlier)
    meta = subset_meta(earlier, dm)
    save_subset(tmp_path / SUBSET_FILE, dm.pool_indices[:50], torch.ones(50), meta)
    (tmp_path / clean_stage.CLEAN_FILE).write_text(json.dumps({"clean": {"flagged": 3}}))
    run = run_of(make_cfg([*SUBSET, "clean=cleanlab"]))
    subset, _ = kept_subset(run, build_datamodule(run), tmp_path, None)
    assert subset is not None


# ------------------------------------------------------- label issues of an earlier run

NOISY = [*FAST, "dataset.label_noise.rate=0.3", "clean=cleanlab", "clean.folds=2"]


def _issues(make_cfg, folder: Path, noise_seed: int):
    """K-fold cleaning's files in `folder` and the issues, for a noise seed."""
    run = validate(make_cfg([*NOISY, f"dataset.label_noise.seed={noise_seed}"]))
    folder.mkdir()
    cleaned = clean_stage.clean_pool(run, build_parts(run), folder, resume=False)
    assert cleaned is not None
    return run, cleaned


@pytest.fixture(scope="module")
def cleanings(tmp_path_factory):
    """The two K-fold cleanings two_runs starts from, run once for the module: this run's
    (noise seed 4) and an earlier run's of other labels (5), in `root`/mine and /theirs."""
    root = tmp_path_factory.mktemp("cleanings")
    make_cfg = functools.partial(compose_train, root)
    _, mine = _issues(make_cfg, root / "mine", 4)
    _, theirs = _issues(make_cfg, root / "theirs", 5)
    assert not torch.equal(mine.issues.rows, theirs.issues.rows)
    return mine, root


@pytest.fixture
def two_runs(cleanings, make_cfg, tmp_path):
    """This run's cleaning, and an earlier run's of other labels left in the folder `out`:
    copies of `cleanings`' folders, which a test may change."""
    mine, root = cleanings
    run = validate(make_cfg([*NOISY, "dataset.label_noise.seed=4"]))
    shutil.copytree(root / "mine", tmp_path / "mine")
    out = tmp_path / "out"
    shutil.copytree(root / "theirs", out)
    return run, mine, tmp_path / "mine", out


def test_an_extra_task_waits_for_this_runs_issues_not_an_earlier_runs(two_runs, monkeypatch):
    """srun starts every task at once: the extra task read the issues an earlier run of other
    labels had left in the folder, and trained on another pool than rank 0."""
    run, mine, folder, out = two_runs

    def rank_0_writes() -> None:  # label_issues.csv first, clean.json last, as rank 0 does
        for name in (clean_stage.ISSUES_FILE, clean_stage.CLEAN_FILE):
            shutil.copy(folder / name, out / f"{name}.tmp")
            (out / f"{name}.tmp").rename(out / name)

    refused: list[Path] = []  # the extra task's check sees the earlier run's files first
    checked = acting_on_first_refusal(clean_stage.cleaned_with, rank_0_writes, refused)
    monkeypatch.setattr(clean_stage, "cleaned_with", checked)
    monkeypatch.setenv("SLURM_PROCID", "1")
    again = clean_stage.clean_pool(run, build_parts(run), out, resume=False)
    assert refused == [out / clean_stage.CLEAN_FILE]  # it waited past the earlier run's
    assert again is not None and torch.equal(again.issues.rows, mine.issues.rows)
    assert again.stats == mine.stats


def test_a_resume_finds_the_issues_again_beside_an_earlier_runs(two_runs):
    """A resumed K-fold cleaning read back whatever label_issues.csv the folder held, and
    reported its costs, an earlier run's of other labels included."""
    run, mine, _, out = two_runs
    again = clean_stage.clean_pool(run, build_parts(run), out, resume=True)
    assert again is not None and torch.equal(again.issues.rows, mine.issues.rows)
    saved = json.loads((out / clean_stage.CLEAN_FILE).read_text())
    assert saved["clean"]["flagged"] == len(mine.issues)


def test_a_resume_reads_the_issues_back_whatever_main_training_it_changes(make_cfg):
    """Cleaning comes before selection and main training: a resume with another
    trainer.max_epochs found every issue again (all K folds trained anew)."""
    run = validate(make_cfg([*NOISY, "dataset.label_noise.seed=4"]))
    other = validate(make_cfg([*NOISY, "dataset.label_noise.seed=4", "trainer.max_epochs=3"]))
    assert clean_stage.cleaning_settings(other, build_parts(other).dm) == (
        clean_stage.cleaning_settings(run, build_parts(run).dm)
    )
    folds = validate(make_cfg([*NOISY, "dataset.label_noise.seed=4", "clean.folds=3"]))
    assert clean_stage.cleaning_settings(folds, build_parts(folds).dm) != (
        clean_stage.cleaning_settings(run, build_parts(run).dm)
    )


def test_an_older_lipts_cleaning_is_read_back_on_every_resume(two_runs, monkeypatch):
    """Its clean.json records no settings: the first resume found the issues again and wrote a
    clean.json with settings beside a subset that records no cleaning, and the second resume
    refused that subset as one of clean=none."""
    run, mine, folder, _ = two_runs
    costs = folder / clean_stage.CLEAN_FILE
    older = json.loads(costs.read_text())
    del older[clean_stage.SETTINGS_KEY]
    costs.write_text(json.dumps(older))
    monkeypatch.setattr(clean_stage, "find_scored_issues", _never)
    for _ in range(2):
        again = clean_stage.clean_pool(run, build_parts(run), folder, resume=True)
        assert again is not None and torch.equal(again.issues.rows, mine.issues.rows)
        assert json.loads(costs.read_text()) == older  # left as the older lipt wrote it


def _never(*args, **kwargs):
    raise AssertionError("the issues were found again")
