"""`dry_run=true` on the entry scripts, and explicit settings honoured or refused: a folder the
user names is used or the run stops before any stage, naming it; never a silent fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from lipt.core.errors import UserError
from lipt.run.config import validate
from lipt.run.preflight import unwritable
from tests.helpers import FAST, ROOT, run_entry


def test_a_dry_run_checks_and_builds_then_exits_0_writing_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = run_entry(
        str(ROOT / "train.py"),
        [*FAST, "dry_run=true", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "dry run: 1 job composed, checked and built" in out.stdout
    assert not run_dir.exists() and list(tmp_path.iterdir()) == []


def test_a_dry_run_of_a_sweep_composes_every_job_and_refuses_a_bad_combination(
    tmp_path: Path,
) -> None:
    args = [*FAST, "dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    out = run_entry(
        str(ROOT / "train.py"),
        ["-m", *args, "seed=0,1,2", "fraction=0.1,0.2"],
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "dry run: 6 jobs composed" in out.stdout
    # Each value is fine alone; one pairing is not (InfoBatch prunes the whole pool).
    bad = ["-m", *args, "selector=random,none", "budget=infobatch"]
    out = run_entry(str(ROOT / "train.py"), bad, cwd=tmp_path)
    assert out.returncode == 2 and "selector=random cannot choose a subset" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_every_job_of_a_sweep_meets_the_rules_across_keys_before_the_first_starts(
    tmp_path: Path,
) -> None:
    """Each value passes alone and one pairing is refused, in one line before any work: one of
    groups (clean=lipt's soup needs pre-training) in a dry run, one of top-level keys (GLISTER
    needs a validation split) in a sweep that would train."""
    sweep = tmp_path / "sweep"
    args = ["-m", *FAST, f"hydra.sweep.dir={sweep}"]
    groups = ["dry_run=true", "clean=none,lipt", "pretrain=jigsaw,none", "budget=full_schedule"]
    keys = ["budget=subset", "selector=random,glister", "dataset.val_size=100,0"]
    for sweep_args, words in ((groups, "clean=lipt"), (keys, "selector=glister")):
        out = run_entry(str(ROOT / "train.py"), [*args, *sweep_args], cwd=tmp_path)
        assert out.returncode == 2, out.stderr[-2000:]
        assert len(out.stderr.strip().splitlines()) == 1 and words in out.stderr
        assert not sweep.exists()


@pytest.mark.parametrize("script", ["pretrain.py", "select.py"])
def test_every_entry_script_has_a_dry_run(script: str, tmp_path: Path) -> None:
    args = [*FAST, "dry_run=true", "selector=random", "budget=subset"]
    out = run_entry(str(ROOT / script), args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "dry run: 1 job" in out.stdout and list(tmp_path.iterdir()) == []


def test_a_named_data_folder_without_the_data_is_refused_not_replaced(
    make_cfg, tmp_path: Path, fashion_mnist_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The system copy is there (here: a real one), yet a folder the user names is the one
    used: empty, it is refused by name; unset, the system copy serves."""
    monkeypatch.setattr("lipt.data.sources.FASHION_MNIST_SYSTEM_DIR", fashion_mnist_dir)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match=f"dataset.data_dir={empty} holds no Fashion-MNIST"):
        validate(make_cfg([f"dataset.data_dir={empty}", "dataset.download=false"]))
    validate(make_cfg(["dataset.download=false"]))  # left unset: the system copy


@pytest.mark.parametrize(
    "key", ["logger.csv.save_dir", "pretrain.learner_dir", "callbacks.model_checkpoint.dirpath"]
)
def test_a_folder_that_cannot_be_written_is_refused_before_any_stage(
    make_cfg, tmp_path: Path, key: str
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    folder = blocker / "logs"  # below a file: it cannot be made
    overrides = [*FAST[:-1], "logger=csv", "pretrain=jigsaw", f"{key}={folder}"]
    with pytest.raises(UserError) as caught:
        validate(make_cfg(overrides))
    message = str(caught.value)
    assert message.startswith(f"{key}={folder} cannot be written") and "not a folder" in message


def test_a_run_folder_that_cannot_be_written_is_refused_by_the_entry_script(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out = run_entry(str(ROOT / "train.py"), [*FAST, f"hydra.run.dir={blocker}/run"], cwd=tmp_path)
    assert out.returncode == 2 and f"hydra.run.dir={blocker}/run cannot be written" in out.stderr


def test_unwritable_names_why(tmp_path: Path) -> None:
    assert unwritable(tmp_path / "new" / "deeper") is None  # made on first use
    (tmp_path / "f").write_text("")
    assert unwritable(tmp_path / "f" / "x") == f"{tmp_path / 'f'} is not a folder"
    assert unwritable(tmp_path / "f") == f"{tmp_path / 'f'} is not a folder"


def composed_alone(job: list[str]) -> str:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        return OmegaConf.to_yaml(compose("train", job, return_hydra_config=False))


def test_jobs_that_share_their_group_choices_compose_as_each_alone() -> None:
    """The precheck composes a sweep's jobs once per combination of group choices and sets the
    plain values on a copy: key for key what composing each job alone gives, with values added
    (+), forced (++), deleted (~), given as a dict, and set inside a group's node, in order."""
    from omegaconf import OmegaConf

    from lipt.run.composition import compose_jobs

    jobs = [
        ["+experiment=frontier_cpu", "+approach=infobatch", "fraction=0.1", "seed=0"],
        ["+experiment=frontier_cpu", "+approach=infobatch", "fraction=0.3", "seed=2"],
        ["+experiment=frontier_cpu", "+approach=full_schedule", "fraction=0.3", "seed=2"],
        ["selector=glister", "optimizer=adamw", "optimizer.lr=0.003", "+extra.note=a"],
        ["selector=glister", "optimizer=adamw", "++optimizer.lr=0.01", "~trainer.max_epochs"],
        ["selector=glister", "optimizer=adamw", "++dataset={num_train: 500}", "seed=7"],
        ["selector=coverage", "seed=7", "optimizer={lr: 0.5}", "+extra={a: 1}"],
    ]
    shared = [OmegaConf.to_yaml(cfg) for cfg in compose_jobs("train", jobs)]
    alone = [composed_alone(job) for job in jobs]
    assert len(set(alone)) == len(jobs)  # every job differs: the comparison could fail
    assert shared == alone


def test_a_single_runs_check_reuses_the_sweepers_composition_as_composing_it_alone() -> None:
    """Outside a multirun the precheck checks the composition it read the sweeper from, less
    Hydra's node: key for key what composing the run alone gives, with Hydra's own overrides
    (a run folder, a launcher) given beside the run's."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from lipt.run.declared_sweep import declared_sweep

    runs = [
        ["selector=glister", "fraction=0.2", "hydra.run.dir=/tmp/somewhere"],
        ["selector=el2n", "clean=cleanlab", "hydra/launcher=joblib", "hydra.job.chdir=true"],
        ["optimizer=adamw", "++optimizer.lr=0.01", "~trainer.max_epochs", "+extra={a: 1}"],
    ]
    for args in runs:
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
            single = declared_sweep("train", args, multirun=False).single
        assert single is not None and "hydra" not in single
        own = [a for a in args if not a.startswith(("hydra.", "hydra/"))]
        assert OmegaConf.to_yaml(single) == composed_alone(own)
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        assert declared_sweep("train", ["seed=1,2"], multirun=False).single is None
        assert declared_sweep("train", ["seed=1"], multirun=True).single is None
    GlobalHydra.instance().clear()


def test_a_value_a_shared_composition_cannot_set_fails_as_composing_it_alone() -> None:
    from hydra.errors import ConfigCompositionException

    from lipt.run.composition import compose_jobs

    job = ["selector=coverage", "selector.no_such_key=1"]
    with pytest.raises(ConfigCompositionException) as alone:
        composed_alone(job)
    with pytest.raises(ConfigCompositionException) as shared:
        list(compose_jobs("train", [["selector=coverage", "seed=1"], job]))
    assert str(shared.value) == str(alone.value) and "no_such_key" in str(shared.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["pretrain=none", "selector=random", "budget=subset"],  # nothing pre-trains
        ["pretrain=jigsaw", "selector=random", "budget=subset"],  # random ranks without a model
        ["budget=infobatch"],  # InfoBatch scores by the training loss
        # K-fold cleaning trains folds, not a model to start from: refused before the folds train
        ["pretrain=jigsaw", "selector=random", "budget=subset", "clean=cleanlab"],
    ],
)
def test_init_from_pretrained_without_pre_training_is_refused_before_any_stage(
    overrides: list[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = [*FAST, *overrides, "init_from=pretrained", f"hydra.run.dir={run_dir}"]
    out = run_entry(str(ROOT / "train.py"), args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "error: init_from=pretrained needs a model pre-trained in this run: use a pretrain other "
        "than none and budget=lipt or a selector that ranks with a model"
    ]
    assert not run_dir.exists()


def test_init_from_pretrained_passes_where_the_run_pre_trains(make_cfg) -> None:
    cleaned_by_the_soup = ["selector=random", "budget=subset", "clean=lipt"]
    for overrides in (
        ["selector=glister"],
        ["budget=lipt"],
        ["selector=coverage"],
        cleaned_by_the_soup,
    ):
        validate(make_cfg(["init_from=pretrained", *overrides]), deep=False)


@pytest.mark.slow
def test_a_dry_run_checks_the_saved_subset_and_soup_a_run_reads(
    tmp_path: Path, make_cfg, monkeypatch
) -> None:
    """A dry run passed what its real run refuses at once: train.py's subset_path of another
    split or fraction, select.py's ckpt_path of another model width. Each is now read and
    checked as the run checks it, on the one data module the dry run builds; the same files
    with the run's settings pass."""
    soup, chosen = tmp_path / "soup", tmp_path / "chosen"
    args = [o for o in FAST if o != "pretrain=none"]
    jigsaw = ["pretrain.num_learners=3", "pretrain.local_epochs=1", "merge.ratios=3"]
    made = run_entry("pretrain.py", [*args, *jigsaw, f"hydra.run.dir={soup}"], timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    ckpt = f"ckpt_path={soup / 'pretrain.ckpt'}"
    picked = run_entry(
        "select.py", [*args, "selector=coverage", ckpt, f"hydra.run.dir={chosen}"], timeout=300
    )
    assert picked.returncode == 0, picked.stderr[-2000:]
    subset = f"subset_path={chosen / 'subset.npz'}"
    for script, extra, words in (
        ("train.py", [subset, "dataset.split_seed=1"], "has indices in the validation split"),
        ("train.py", [subset, "fraction=0.3"], "is a fraction=0.1 subset"),
        ("select.py", ["selector=coverage", ckpt, "model.width=16"], "(model.width=8, this"),
    ):
        out = run_entry(script, [*args, *extra, "dry_run=true"], timeout=300)
        assert out.returncode == 2 and words in out.stderr, (extra, out.stderr[-2000:])
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    for script, extra in (("train.py", [subset]), ("select.py", ["selector=coverage", ckpt])):
        out = run_entry(script, [*args, *extra, "dry_run=true"], timeout=300)
        assert out.returncode == 0, (extra, out.stderr[-2000:])
    from lipt.run.preflight import build_everything
    from lipt.stages import build

    built: list[str] = []
    read = build.build_datamodule
    monkeypatch.setattr(build, "build_datamodule", lambda run: built.append("dm") or read(run))
    build_everything(validate(make_cfg([*args, subset])), {})
    assert built == ["dm"]  # the data read once, for the data checks and the subset's alike
