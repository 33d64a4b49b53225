"""The frontier as a Hydra sweep: the sweeper's reference jobs, the approach group's methods
composed as the sweeper composes them (each turns `fraction` into its budget), the pinning
callback, the report's numbers on hand-made summaries, and a frontier_small sweep end to end on
joblib with a method defined in this module."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from lipt.core.host import cpu_model, other_cores_busy
from lipt.report.frontier import (
    aggregate,
    best_whole_pool,
    highest_on_validation,
    lossless_speedups,
    paired_with_whole_pool,
    timing_caveats,
)
from lipt.report.frontier_render import table_rows, validation_rows
from lipt.report.frontier_runs import CURVE, REFERENCE, costs, method_of, records
from lipt.run.frontier_sweep import PinToCore, with_reference
from lipt.selection import Selection, SelectionInputs
from tests.helpers import FAST, ROOT, run_entry


# --- a method of a user's own: this selector, and one config file naming it ----------------
def select_hardest(
    inputs: SelectionInputs, budget: int, *, generator: torch.Generator
) -> Selection:
    """The `budget` rows the ranking model finds hardest (highest cross-entropy)."""
    losses = F.cross_entropy(inputs.pool.logits, inputs.pool.targets, reduction="none")  # [N]
    rows = losses.topk(budget).indices.sort().values  # [budget]
    return Selection(rows, torch.ones(budget))


HARDEST_APPROACH = """\
# @package _global_
defaults:
  - override /pretrain: jigsaw
  - override /selector: random
selector:
  _target_: tests.test_frontier.select_hardest
  name: hardest
  needs_model: true
approach: hardest
# a few small jigsaw learners: the sweep's control flow, not the soup's quality, is under test
pretrain:
  num_learners: 3
  local_epochs: 2
"""


# --- the sweeper -----------------------------------------------------------------------------


def test_the_reference_is_one_more_job_per_seed_and_comes_first() -> None:
    product = [
        ["+approach=random", "fraction=0.1", "seed=0"],
        ["+approach=random", "fraction=0.1", "seed=1"],
        ["+approach=coverage", "fraction=0.3", "seed=0"],
        ["+approach=coverage", "fraction=0.3", "seed=1"],
    ]
    jobs = with_reference(product, ["+approach=full_data"], ["approach", "fraction"])
    assert jobs[:2] == [["+approach=full_data", "seed=0"], ["+approach=full_data", "seed=1"]]
    assert jobs[2:] == product
    # A job the product already has runs once; other fixed overrides reach the reference too.
    again = with_reference(
        [["+approach=full_data", "trainer.max_epochs=16", "seed=0"]],
        ["+approach=full_data"],
        ["approach", "fraction"],
    )
    assert again == [["+approach=full_data", "trainer.max_epochs=16", "seed=0"]]


def test_every_frontier_job_passes_the_precheck_and_a_bad_budget_fails_it(capsys: Any) -> None:
    from lipt.run.precheck import precheck

    assert precheck("train", ["+experiment=frontier_small", "dry_run=true"], multirun=True) == 11
    with pytest.raises(SystemExit) as exit_:
        precheck("train", ["+experiment=frontier_cpu", "fraction=0.5,1.5"], multirun=True)
    assert exit_.value.code == 2 and "fraction=1.5" in capsys.readouterr().err
    # the sweeper's and the pinning callback's own settings, before Hydra builds them
    for bad, words in (
        ("hydra.sweeper.reference=[]", "hydra.sweeper.reference is empty"),
        ("hydra.sweeper.point_keys=[]", "hydra.sweeper.point_keys is empty"),
        ("hydra.callbacks.pin.threads=0", "hydra.callbacks.pin.threads=0 is invalid"),
    ):
        with pytest.raises(SystemExit) as exit_:
            precheck("train", ["+experiment=frontier_small", bad], multirun=True)
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and words in err and "\n" not in err, err


# --- the methods, composed as the sweeper composes them ----------------------------------------


def test_each_approach_turns_fraction_into_its_budget(make_cfg: Any) -> None:
    from lipt.budget import infobatch_epochs, schedule_steps
    from lipt.run.config import validate

    def job(approach: str, fraction: float) -> Any:
        # the order Hydra's sweeper gives: the approach, the budget, then the experiment
        return make_cfg(
            [f"+approach={approach}", f"fraction={fraction}", "+experiment=frontier_cpu"]
        )

    for fraction in (0.1, 0.5):
        full = validate(job("full_schedule", fraction), deep=False)
        assert full.selector is None and full.node("budget")["steps"] == "schedule"
        info = validate(job("infobatch", fraction), deep=False)
        assert info.pretrain_name == "none" and info.prunes
        assert info.node("budget")["_target_"] == "lipt.budget.InfoBatchEpochs"
        assert info.node("budget")["epochs"] == "fraction"
        lipt = validate(job("lipt_dynamic", fraction), deep=False)
        assert lipt.node("budget")["_target_"] == "lipt.budget.LiptDynamic" and lipt.prunes
        assert lipt.pretrain_name == "jigsaw" and lipt.settings.init_from == "init"
        warm = validate(job("lipt_warm", fraction), deep=False)
        assert warm.settings.init_from == "pretrained" and warm.node("budget")["name"] == "lipt"
        for subset in ("random", "coverage", "paper"):
            run = validate(job(subset, fraction), deep=False)
            assert run.settings.fraction == fraction and run.main_epochs == 12
    # The frontier's budgets on Fashion-MNIST's pool (55,000 rows, batch 256: 215 steps an
    # epoch): 10% of 12 epochs is 258 steps; InfoBatch's 2 epochs keep ~70% of each.
    assert schedule_steps(0.1, 12, 215) == 258 and infobatch_epochs(0.1, 12) == 2
    assert validate(job("paper", 0.1), deep=False).settings.reselect_every == 1
    reference = validate(make_cfg(["+approach=full_data", "+experiment=frontier_cpu"]), deep=False)
    assert reference.selector is None and reference.node("budget")["steps"] == "all"
    assert not reference.prunes and not reference.trains_subset


def test_the_whole_pools_shorter_schedule_anneals_over_its_steps(make_cfg: Any) -> None:
    """Lightning's estimated_stepping_batches honours max_steps: the cosine reaches ~0 at the
    last of the shorter run's steps, not at the end of max_epochs whole epochs."""
    import lightning as L

    from lipt.budget import schedule_steps
    from lipt.run.config import run_of
    from lipt.stages.build import build_classifier, build_datamodule, build_model, build_trainer

    fast = [o for o in FAST if not o.startswith("budget=")]  # the preset's budget: full_schedule
    run = run_of(
        make_cfg([*fast, "+approach=full_schedule", "fraction=0.3", "trainer.max_epochs=2"])
    )
    assert run.node("budget")["steps"] == "schedule"
    dm = build_datamodule(run)
    dm.set_subset(None)
    per_epoch = math.ceil(len(dm.pool_indices) / run.settings.batch_size)
    assert per_epoch == 16  # synthetic: 500 rows, batch 32
    steps = schedule_steps(run.settings.fraction, run.main_epochs, per_epoch)
    assert steps == 10

    class Lrs(L.Callback):
        def __init__(self) -> None:
            self.seen: list[float] = []

        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            self.seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    lrs = Lrs()
    module = build_classifier(run, build_model(run, 0))
    trainer = build_trainer(
        run, logger=False, enable_checkpointing=False, callbacks=[lrs], max_steps=steps,
        max_epochs=math.ceil(steps / per_epoch),
    )  # fmt: skip
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 10
    schedule = trainer.lr_scheduler_configs[0].scheduler
    assert isinstance(schedule, torch.optim.lr_scheduler.CosineAnnealingLR)
    assert schedule.T_max == 10
    assert lrs.seen[-1] == pytest.approx(0.1 * (1 + math.cos(math.pi * 9 / 10)) / 2)  # step 9 of 10


def test_the_main_job_runs_lipts_pipeline_on_fraction(make_cfg: Any) -> None:
    """`python train.py`: jigsaw pre-training, the soup scoring the pool, lipt's dynamic pruning
    of main training on `fraction` of the cost; infobatch stays one override away."""
    from lipt.run.config import validate

    default = validate(make_cfg([]), deep=False)
    assert default.pretrain_name == "jigsaw" and default.prunes and default.selector is None
    assert default.node("budget")["_target_"] == "lipt.budget.LiptDynamic"
    method = default.budget.pruning(default.settings.fraction)
    assert method.needs_ensemble and method.budget == default.settings.fraction == 0.1
    infobatch = validate(make_cfg(["budget=infobatch"]), deep=False)
    assert infobatch.prunes and type(infobatch.budget.pruning(0.1)).__name__ == "InfoBatch"


# --- pinning -------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_pinning_gives_each_job_its_own_core_and_undoes_itself(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    first, second = PinToCore(lock_dir=str(tmp_path)), PinToCore(lock_dir=str(tmp_path))
    config = OmegaConf.create({"hydra": {"job": {"num": 0}}})
    first.on_job_start(config)
    try:
        mine = os.sched_getaffinity(0)
        assert len(mine) == 1 and mine <= before and torch.get_num_threads() == 1
        if len(before) > 1:  # a second job in another process would get another core
            os.sched_setaffinity(0, before)
            second.on_job_start(config)
            assert os.sched_getaffinity(0) != mine
            second.on_job_end(config, None)
            os.sched_setaffinity(0, mine)
    finally:
        first.on_job_end(config, None)
    assert os.sched_getaffinity(0) == before and torch.get_num_threads() == threads


# --- the report's numbers ------------------------------------------------------------------


def summary(
    approach: str, fraction: float, seed: int, test: float, seconds: float, **extra: Any
) -> tuple[str, dict]:
    """A job's summary.json with what the frontier reads."""
    epochs = extra.pop("epochs", 12)
    config = {"approach": approach, "fraction": fraction, "seed": seed,
              "trainer": {"max_epochs": epochs}, "selector": {"name": "x"}}  # fmt: skip
    stages = {"train": {"seconds": seconds, "samples": int(1000 * seconds)}}
    name = f"{approach}_{fraction}_{seed}_{epochs}"
    return name, {"test_accuracy": test, "val_accuracy": extra.pop("val", None),
                  "stages": stages, "config": config, **extra}  # fmt: skip


def with_reference_runs(*jobs: tuple[str, dict], seconds: float = 100.0) -> list[tuple[str, dict]]:
    refs = [summary("full_data", 0.1, s, a, seconds) for s, a in enumerate((0.885, 0.887, 0.889))]
    return [*refs, *jobs]


def test_costs_add_every_stage_and_samples_of_pretrain_and_train() -> None:
    stages = {
        "pretrain": {"seconds": 2.5, "samples": 320},
        "select": {"seconds": 0.5},
        "score": {"seconds": 1.0, "samples": 500},  # a forward pass: not a trained sample
        "train": {"seconds": 10.0, "samples": 2000},
    }
    assert costs({"stages": stages}) == (14.0, 2320)


def test_reference_curve_speedups_and_the_lossless_point() -> None:
    runs, epochs_ref = records(
        with_reference_runs(
            summary("full_schedule", 0.5, 0, 0.884, 50.0),
            summary("full_schedule", 0.5, 1, 0.886, 50.0),
            summary("infobatch", 0.3, 0, 0.880, 25.0),
            summary("full_data", 0.1, 0, 0.90, 200.0, epochs=24),
        ),
        "full_data",
    )
    assert epochs_ref == 12
    points = {(p.method, p.budget): p for p in aggregate(runs)}
    ref = points[REFERENCE, 1.0]
    assert ref.accuracy == pytest.approx(88.7) and ref.seeds == (0, 1, 2)
    assert points[CURVE, 2.0].speedup == pytest.approx(0.5)
    assert points["full_schedule", 0.5].speedup == pytest.approx(2.0)
    best = lossless_speedups(list(points.values()))
    assert best["full_schedule"] is not None and best["full_schedule"].budget == 0.5  # 0.2 short
    assert best["infobatch"] is None  # 0.7 points short
    rows = table_rows(list(points.values()), epochs_ref)
    assert rows[2].startswith("| reference (whole pool, 12 epochs) | 1 | 3 | 88.70 ± 0.20 |")
    assert rows[-1].startswith("| whole pool, 24 epochs | 2.00 | 1 | 90.00 |")


def test_choices_are_made_on_validation_and_pairs_by_seed() -> None:
    runs, _ = records(
        with_reference_runs(
            summary("infobatch", 0.1, 0, 0.80, 10.0, val=0.85),  # highest on validation,
            summary("infobatch", 0.1, 1, 0.80, 10.0, val=0.87),  # lowest on test
            summary("coverage", 0.1, 0, 0.90, 10.0, val=0.84),
            summary("coverage", 0.1, 1, 0.90, 10.0, val=0.84),
            summary("full_schedule", 0.1, 0, 0.86, 5.0, val=0.80),
            summary("full_schedule", 0.1, 1, 0.88, 5.0, val=0.80),
        ),
        "full_data",
    )
    points = aggregate(runs)
    ranked = highest_on_validation(points)[0.1]
    assert [p.method for p in ranked] == ["infobatch", "coverage", "full_schedule"]
    assert "| 0.1 | infobatch 86.00 | coverage 84.00 | 80.00 ± 0.00 | 10.0 |" in validation_rows(
        points
    )
    paired = {p.method: p for p in paired_with_whole_pool(runs)}
    assert paired["coverage"].difference == pytest.approx(3.0)  # +4 and +2
    assert paired["coverage"].difference_std == pytest.approx(math.sqrt(2))
    assert paired["infobatch"].difference == pytest.approx(-7.0)
    assert paired["infobatch"].samples_ratio == pytest.approx(2.0)  # 10,000 samples to 5,000
    assert paired["coverage"].samples_ratio == pytest.approx(2.0)


def test_methods_pair_with_the_whole_pools_schedule_chosen_on_validation_not_test() -> None:
    """At 0.1 linear decay is higher on validation (and lower on test): every method, the
    cosine included, is paired with it. At 0.3 the cosine is higher on validation."""
    runs, _ = records(
        with_reference_runs(
            summary("full_schedule", 0.1, 0, 0.86, 5.0, val=0.80),
            summary("full_schedule_linear", 0.1, 0, 0.84, 5.0, val=0.82),
            summary("infobatch", 0.1, 0, 0.85, 6.0, val=0.83),
            summary("full_schedule", 0.3, 0, 0.88, 9.0, val=0.86),
            summary("full_schedule_linear", 0.3, 0, 0.89, 9.0, val=0.85),
            summary("infobatch", 0.3, 0, 0.87, 9.0, val=0.84),
        ),
        "full_data",
    )
    assert best_whole_pool(runs) == {0.1: "full_schedule_linear", 0.3: "full_schedule"}
    paired = {(p.method, p.budget): p for p in paired_with_whole_pool(runs)}
    assert set(paired) == {
        ("full_schedule", 0.1), ("infobatch", 0.1),
        ("full_schedule_linear", 0.3), ("infobatch", 0.3),
    }  # fmt: skip
    assert paired["infobatch", 0.1].baseline == "full_schedule_linear"
    assert paired["infobatch", 0.1].difference == pytest.approx(1.0)
    assert paired["full_schedule", 0.1].difference == pytest.approx(2.0)
    assert paired["infobatch", 0.3].difference == pytest.approx(-1.0)


def test_the_timing_caveats_name_busy_pinned_runs_and_loaded_unpinned_ones() -> None:
    pinned = {"cores": 2, "torch_threads": 1, "cores_allowed": 1}
    both = {"cores": 2, "torch_threads": 2, "cores_allowed": 2}
    runs, _ = records(
        [
            summary("full_data", 0.1, 0, 0.88, 100.0, host=pinned, other_cores_busy=0.02),
            summary("random", 0.1, 0, 0.82, 60.0, host=pinned, other_cores_busy=0.9),
            summary("random", 0.2, 0, 0.85, 130.0, host=both, load_average=[3.1, 2.9]),
            summary("random", 0.3, 0, 0.87, 190.0, host=both, load_average=[1.0, 1.2]),
        ],
        "full_data",
    )
    caveats = timing_caveats(runs)
    assert caveats[0].startswith("2 of 4 runs ran pinned")
    assert caveats[1].endswith("by up to ~40% measured here): random_0.1_0_12.")
    assert caveats[2].endswith("inflated): random_0.2_0_12.")
    # the share: busy ticks over all ticks of the cores outside the allowed set
    before, after = {c: (0, 0) for c in range(4)}, {c: (50, 100) for c in range(4)}
    assert other_cores_busy(before, after, allowed={0}) == 0.5
    assert other_cores_busy(before, after, allowed={0, 1, 2, 3}) is None


def test_runs_timed_on_two_machines_are_named_and_pinning_is_no_machine() -> None:
    pinned = {"cpu": "AMD EPYC", "cores": 2, "torch_threads": 1, "cores_allowed": 1}
    both = {**pinned, "torch_threads": 2, "cores_allowed": 2}  # the same machine, used otherwise
    newer = {**pinned, "cpu": "AMD EPYC (family 26, model 2)"}
    jobs = [
        summary("full_data", 0.1, 0, 0.88, 100.0, host=pinned),
        summary("random", 0.1, 0, 0.82, 60.0, host=both),
    ]
    runs, _ = records(jobs, "full_data")
    assert not any("machines" in line for line in timing_caveats(runs))
    runs, _ = records([*jobs, summary("random", 0.2, 0, 0.85, 40.0, host=newer)], "full_data")
    assert timing_caveats(runs)[-1] == (
        "Timing caveat: the runs were timed on 2 machines, so their seconds, and the speed-ups "
        "in seconds, compare only within one machine: 1 on AMD EPYC (family 26, model 2), 2, "
        "?; 2 on AMD EPYC, 2, ?."
    )


def test_the_cpu_is_named_with_its_family_and_model(tmp_path: Path) -> None:
    """/proc/cpuinfo as Linux writes it: a block per CPU. A VM's model name may be generic, so
    the family and model numbers tell two generations apart; the first CPU's block is read."""
    block = "processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: {f}\nmodel\t\t: 2\n"
    block += "model name\t: AMD EPYC\nstepping\t: 1\ncpu MHz\t\t: 2596.122\n\n"
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(block.format(n=0, f=26) + block.format(n=1, f=25))
    assert cpu_model(cpuinfo) == "AMD EPYC (family 26, model 2)"
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n\n"
    cpuinfo.write_text(arm)
    platform_name = platform.processor() or platform.machine()
    assert cpu_model(cpuinfo) == platform_name  # no model name, no family: the platform's name
    assert cpu_model(tmp_path / "none") == platform_name


# --- a frontier_small sweep end to end -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.first
def test_frontier_small_on_joblib_with_a_users_method_resumes_and_reports(tmp_path: Path) -> None:
    """Two jobs at a time on joblib, each pinned; a method from outside the package joins
    through one config file on Hydra's search path; label cleaning runs cleanlab inside a
    joblib worker; a second invocation (on Hydra's basic launcher: what skips a job is the
    job's own) skips every job; the report writes frontier.md and frontier.png into the sweep
    folder."""
    configs = tmp_path / "my_configs"
    (configs / "approach").mkdir(parents=True)
    (configs / "approach" / "hardest.yaml").write_text(HARDEST_APPROACH)
    sweep = tmp_path / "sweep"
    args = [
        "train.py", "-m", "+experiment=frontier_small", "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2", f"hydra.searchpath=[file://{configs}]",
        "+approach=full_schedule,hardest,clean_cleanlab", "fraction=0.5",
        f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip

    def sweep_once(launcher: str = "joblib") -> subprocess.CompletedProcess:
        # joblib: a new Python, not the preloaded one's fork (loky's workers have hung at its
        # exit); the basic launcher runs its jobs in the fork
        swept = [a.replace("=joblib", f"={launcher}") for a in args[1:] if "n_jobs" not in a]
        done = run_entry(
            args[0],
            args[1:] if launcher == "joblib" else swept,
            env={"PYTHONPATH": str(ROOT)},
            timeout=600,
            preloaded=launcher != "joblib",
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    sweep_once()
    jobs = sorted(p.parent.name for p in sweep.glob("*/summary.json"))
    assert jobs == [
        "+approach=clean_cleanlab,fraction=0.5,seed=0",
        "+approach=full_data,seed=0",
        "+approach=full_schedule,fraction=0.5,seed=0",
        "+approach=hardest,fraction=0.5,seed=0",
    ]
    summaries = {name: json.loads((sweep / name / "summary.json").read_text()) for name in jobs}
    assert all(s["host"]["cores_allowed"] == 1 and s["host"]["torch_threads"] == 1
               for s in summaries.values())  # fmt: skip
    hardest = summaries["+approach=hardest,fraction=0.5,seed=0"]
    assert hardest["config"]["selector"]["_target_"] == "tests.test_frontier.select_hardest"
    assert hardest["subset_size"] == 250 and "pretrain" in hardest["stages"]
    cleaned = summaries["+approach=clean_cleanlab,fraction=0.5,seed=0"]["stages"]["clean"]
    assert cleaned["method"] == "cleanlab" and cleaned["samples"] > 0  # 5 folds trained
    assert (sweep / "+approach=clean_cleanlab,fraction=0.5,seed=0" / "label_issues.csv").is_file()
    stamps = {name: (sweep / name / "summary.json").stat().st_mtime_ns for name in jobs}
    sweep_once("basic")  # resumes: every job finished already, its summary.json left as it was
    assert stamps == {name: (sweep / name / "summary.json").stat().st_mtime_ns for name in jobs}
    report = run_entry("-m", ["lipt.report.sweep", str(sweep)], env={"PYTHONPATH": str(ROOT)})
    assert report.returncode == 0, report.stderr[-3000:]
    text = (sweep / "frontier.md").read_text()
    assert "| reference (whole pool, 2 epochs) | 1 | 1 |" in text
    assert "| hardest | 0.5 | 1 |" in text and "| full_schedule | 0.5 | 1 |" in text
    assert "| clean_cleanlab | 0.5 | 1 |" in text
    assert (sweep / "frontier.png").stat().st_size > 10_000
    assert json.loads((sweep / "frontier.json").read_text())["ref_epochs"] == 2


# --- the frontier on wrong labels ------------------------------------------------------------


def test_the_noisy_frontier_composes_its_cleaning_jobs_as_the_sweeper_does(
    make_cfg: Any, capsys: Any
) -> None:
    from lipt.run.config import validate
    from lipt.run.precheck import precheck

    # 2 noise kinds x 7 methods x 2 budgets, and a reference per kind (for one seed: the seeds
    # are leaves that no job's composition reads)
    one_seed = ["+experiment=frontier_noisy", "hydra.sweeper.params.seed=0", "dry_run=true"]
    assert precheck("train", one_seed, multirun=True) == 30
    for approach, target, action in (
        ("clean_lipt", "lipt.cleaning.JigsawCleaning", "drop"),
        ("clean_lipt_relabel", "lipt.cleaning.JigsawCleaning", "relabel"),
        ("clean_cleanlab", "lipt.cleaning.KFoldCleaning", "drop"),
        ("clean_cleanlab_relabel", "lipt.cleaning.KFoldCleaning", "relabel"),
    ):
        cfg = make_cfg(
            [
                f"+approach={approach}",
                "dataset.label_noise.kind=pairs",
                "fraction=0.3",
                "+experiment=frontier_noisy",
            ]
        )
        run = validate(cfg, deep=False)
        clean = run.node("clean")
        assert (clean["_target_"], clean["action"]) == (target, action)
        assert run.dataset.label_noise == {
            "rate": 0.4,
            "kind": "pairs",
            "seed": 0,
            "pairs": [6, 3, 4, 1, 2, 7, 0, 5, 9, 8],
        }
        assert run.node("budget")["name"] == "full_schedule"  # as full_schedule trains
        assert run.pretrain_name == ("jigsaw" if "lipt" in approach else "none")
        assert run.main_epochs == 12 and run.settings.ckpt_path == "last"


def noisy(job: tuple[str, dict], kind: str, clean: dict | None = None) -> tuple[str, dict]:
    name, payload = job
    payload["config"]["dataset"] = {"label_noise": {"rate": 0.4, "kind": kind}}
    if clean is not None:
        payload["stages"]["clean"] = clean
    return f"{name}_{kind}", payload


def test_the_report_draws_a_frontier_per_noise_kind_and_a_detection_table(
    tmp_path: Path,
) -> None:
    from lipt.report.frontier_render import write_frontier

    def found(precision: float, seconds: float) -> dict:
        return {"flagged": 100, "precision": precision, "recall": 0.9,
                "detection_seconds": seconds, "seconds": seconds, "samples": 50}  # fmt: skip

    jobs = []
    for kind in ("symmetric", "pairs"):
        jobs += [noisy(job, kind) for job in with_reference_runs()]
        jobs += [
            noisy(summary("clean_lipt", 0.3, 0, 0.85, 40.0), kind, found(0.8, 10.0)),
            noisy(summary("clean_lipt", 0.3, 1, 0.86, 40.0), kind, found(0.9, 12.0)),
        ]
    path = write_frontier(tmp_path, jobs, "full_data")
    text = path.read_text()
    assert "## 40% symmetric label noise" in text and "## 40% pairs label noise" in text
    assert (
        text.count("| clean_lipt | 0.3 | 2 | 100 | 0.850 ± 0.071 | 0.900 ± 0.000 | 11.0 ± 1.4 |")
        == 2
    )
    # each figure: the frontier, and beside it the cleaners' precision and recall (wider)
    import matplotlib.image

    for kind in ("pairs", "symmetric"):
        figure = matplotlib.image.imread(tmp_path / f"frontier_40pct_{kind}_label_noise.png")
        assert figure.shape[1] == 13 * 120  # inches x dpi: two panels
    alone = write_frontier(tmp_path / "clean", with_reference_runs(), "full_data").parent
    assert matplotlib.image.imread(alone / "frontier.png").shape[1] == 8 * 120  # no cleaner
    # K-fold cleaning's models are trained samples: part of the run's cost
    assert costs({"stages": {"clean": {"seconds": 3.0, "samples": 40}, "train": {
        "seconds": 1.0, "samples": 10}}}) == (4.0, 50)  # fmt: skip


@pytest.mark.parametrize(
    ("approach", "learners"),
    [("lipt_dynamic", 10), ("coverage", 10), ("full_schedule", 0), ("infobatch", 0), ("random", 0)],
)
def test_the_slurm_launcher_trains_learners_as_an_array_only_for_runs_that_pre_train(
    make_cfg, approach, learners
):
    """hydra/launcher=slurm's learner array: the jigsaw's learners of a run that ranks, prunes
    with lipt's scores or cleans with the soup; none for the whole pool, InfoBatch or random."""
    from omegaconf import OmegaConf

    from lipt.run.slurm_learners import uses_jigsaw_learners

    config = OmegaConf.to_container(
        make_cfg([f"+approach={approach}", "+experiment=frontier_cpu"]), resolve=True
    )
    assert uses_jigsaw_learners(config) == learners


def test_the_learner_array_writes_where_the_run_reads_its_learners(make_cfg, tmp_path):
    """With pretrain.learner_dir set, the array's tasks write their learners there and count
    what is missing there: the folder the run's in-process stage reads (else every learner
    would be trained twice, by the array and again in-process)."""
    from omegaconf import OmegaConf

    from lipt.jigsaw.checkpoints import learner_file
    from lipt.run.slurm_learners import LearnerGroup, learners_folder, missing_learners

    shared = tmp_path / "shared_learners"
    overrides = ["+approach=coverage", "+experiment=frontier_cpu", f"pretrain.learner_dir={shared}"]
    config = OmegaConf.to_container(make_cfg(overrides), resolve=True)
    assert isinstance(config, dict)
    run_dir = tmp_path / "run"
    assert LearnerGroup(run_dir, [0, 1], config).folder == shared
    shared.mkdir()
    (shared / learner_file(1)).write_bytes(b"")
    assert missing_learners(learners_folder(run_dir, config), 3) == [0, 2]
    del config["pretrain"]["learner_dir"]
    assert learners_folder(run_dir, config) == run_dir / "learners"


def test_a_learner_task_at_its_time_limit_is_submitted_again_for_its_group(tmp_path, monkeypatch):
    """submitit requeues a task at its time limit only where its function has a `checkpoint`
    (else: "timed-out and not checkpointable", the learner in training lost and a retry spent):
    the array's function gives its own group again, through a pickle as submitit keeps it."""
    import pickle

    from submitit.helpers import DelayedSubmission

    from lipt.jigsaw.checkpoints import learner_file
    from lipt.run import slurm_learners
    from lipt.run.slurm_learners import LearnerGroup, LearnerTask

    group = LearnerGroup(tmp_path / "run", [3, 4], {"pretrain": {"name": "jigsaw"}})
    task = pickle.loads(pickle.dumps(LearnerTask()))

    def writes_one(g: LearnerGroup) -> dict:
        g.folder.mkdir(parents=True, exist_ok=True)
        (g.folder / learner_file(3)).write_bytes(b"")  # then the time limit, in learner 4
        return {}

    monkeypatch.setattr(slurm_learners, "train_learner_group", writes_one)
    task(group)
    again = task.checkpoint(group)
    assert isinstance(again, DelayedSubmission) and isinstance(again.function, LearnerTask)
    assert again.args == (group,) and not again.kwargs
    # an attempt that wrote none of its learners (one longer than the time limit) is not
    # requeued max_num_timeout times: it fails, and learner_retries decide
    monkeypatch.setattr(slurm_learners, "train_learner_group", lambda g: {})
    task(group)
    assert task.checkpoint(group) is None


def test_a_job_on_a_saved_subset_is_not_taken_for_its_budget():
    """train.py subset_path=... keeps the default budget=lipt in its config, but trains the
    saved subset unpruned: it is no lipt job."""
    config = {"selector": {"name": "none"}, "budget": {"name": "lipt"}}
    assert method_of(config) == "lipt"
    assert method_of({**config, "subset_path": "/runs/a/subset.npz"}) == "subset_path"
    assert method_of({**config, "selector": {"name": "coverage"}}) == "coverage"


def test_two_frontier_sweeps_of_other_epochs_read_as_one_folder_make_two_frontiers(
    tmp_path: Path,
) -> None:
    """`make report SWEEP=multirun` over the 12- and the 36-epoch frontier: a budget is a share
    of the reference's cost at its epochs, so each frontier has its own reference and points
    (a method's runs at 12 and 36 epochs once made one point, lossless against the 12-epoch
    reference on the 36-epoch runs' accuracy)."""
    import json

    from lipt.report.frontier_render import write_frontier

    jobs = [
        *(summary("full_data", 0.1, s, a, 100.0) for s, a in enumerate((0.885, 0.887))),
        *(summary("full_data", 0.1, s, a, 300.0, epochs=36) for s, a in enumerate((0.91, 0.92))),
        summary("infobatch", 0.5, 0, 0.870, 50.0),  # 1.6 points short of its reference
        summary("infobatch", 0.5, 1, 0.872, 50.0),
        summary("infobatch", 0.5, 0, 0.913, 150.0, epochs=36),  # 0.2 short of its own
        summary("infobatch", 0.5, 1, 0.913, 150.0, epochs=36),
    ]
    text = write_frontier(tmp_path, jobs, "full_data").read_text()
    assert "8 finished runs" in text and "at each frontier's epochs (12, 36)" in text
    short, long = text.split("## 12 epochs")[1].split("## 36 epochs")
    assert "| reference (whole pool, 12 epochs) | 1 | 2 | 88.60 ± 0.14 |" in short
    assert "| infobatch | 0.5 | 2 | 87.10 ± 0.14 |" in short
    assert "| whole pool, 36 epochs | 3.00 | 2 | 91.50 ± 0.71 |" in short  # the curve
    assert "| infobatch | none | - | - |" in short
    assert "| reference (whole pool, 36 epochs) | 1 | 2 | 91.50 ± 0.71 |" in long
    assert "| infobatch | 0.5 | 2 | 91.30 ± 0.00 | - | 150.0 |" in long
    assert "| infobatch | 2.00x | 0.5 | 91.30 ± 0.00 |" in long
    frontiers = json.loads((tmp_path / "frontier.json").read_text())
    assert [f["ref_epochs"] for f in frontiers.values()] == [12, 36]
    assert (tmp_path / "frontier_12_epochs.png").is_file()
    assert (tmp_path / "frontier_36_epochs.png").is_file()


def on(job: tuple[str, dict], dataset: str, model: str = "lipt.models.ConvNet") -> tuple[str, dict]:
    """A job of a frontier sweep over data sets (`dataset=fashion_mnist,cifar10`): its config
    names its data set and model, as summary.json's resolved config does."""
    name, payload = job
    payload["config"]["dataset"] = {"name": dataset, "label_noise": {"rate": 0.0}}
    payload["config"]["model"] = {"_target_": model}
    return f"{name}_{dataset}", payload


def test_a_sweep_over_data_sets_draws_a_frontier_per_data_set(tmp_path: Path) -> None:
    """`+experiment=frontier_cpu dataset=fashion_mnist,cifar10`: the sweeper runs a reference
    per data set, and each method's runs on one data set are measured against that one's. Mixed
    into one frontier, the reference was 75.00 ± 17.32 (the two data sets' runs averaged) and
    InfoBatch, 0.1 points short of the whole pool on Fashion-MNIST at half its cost, was not
    lossless."""
    from lipt.report.frontier_render import write_frontier

    jobs = [on(job, "fashion_mnist") for job in with_reference_runs()]  # 88.70 ± 0.20 in 100 s
    jobs += [on(summary("full_data", 0.1, s, 0.60 + s / 100, 400.0), "cifar10") for s in (0, 1)]
    jobs += [on(summary("infobatch", 0.5, s, 0.886, 50.0), "fashion_mnist") for s in (0, 1)]
    jobs += [on(summary("infobatch", 0.5, s, 0.55, 200.0), "cifar10") for s in (0, 1)]
    text = write_frontier(tmp_path, jobs, "full_data").read_text()
    fashion, cifar = text.split("## fashion_mnist")[1].split("## cifar10")
    assert "| reference (whole pool, 12 epochs) | 1 | 3 | 88.70 ± 0.20 | - | 100.0 |" in fashion
    assert "| infobatch | 2.00x | 0.5 | 88.60 ± 0.00 |" in fashion  # lossless: 0.1 short
    assert "| reference (whole pool, 12 epochs) | 1 | 2 | 60.50 ± 0.71 | - | 400.0 |" in cifar
    assert "| infobatch | 0.5 | 2 | 55.00 ± 0.00 | - | 200.0 |" in cifar
    assert "| infobatch | none | - | - |" in cifar
    assert {p.name for p in tmp_path.glob("*.png")} == {
        "frontier_fashion_mnist.png",
        "frontier_cifar10.png",
    }
    # a model swept beside a data set: a frontier per pair; one data set, one model: no title
    jobs += [on(summary("full_data", 0.1, 0, 0.7, 900.0), "cifar10", "lipt.models.ResNet18")]
    text = write_frontier(tmp_path, jobs, "full_data").read_text()
    assert "## cifar10, ConvNet" in text and "## cifar10, ResNet18" in text
    alone = [on(job, "fashion_mnist") for job in with_reference_runs()]
    assert "\n## " not in write_frontier(tmp_path / "alone", alone, "full_data").read_text()
    # an older summary without dataset.name beside ones with it splits nothing off
    older = with_reference_runs()
    mixed = [older[0], *(on(job, "fashion_mnist") for job in older[1:])]
    assert "\n## " not in write_frontier(tmp_path / "mixed", mixed, "full_data").read_text()


def test_a_seed_run_twice_pairs_by_its_mean_as_the_points_average_it() -> None:
    """A folder holding one sweep twice: the points average every run; the pairs took the last
    run of each seed only (here -5.00 points against the whole pool, where the points are level),
    and the table says the seeds column counts runs."""
    from lipt.report.frontier_render import section

    runs, epochs_ref = records(
        with_reference_runs(
            summary("full_schedule", 0.5, 0, 0.80, 50.0, val=0.8),
            summary("full_schedule", 0.5, 0, 0.90, 50.0, val=0.8),
            summary("full_schedule", 0.5, 1, 0.84, 50.0, val=0.8),
            summary("infobatch", 0.5, 0, 0.85, 60.0),
            summary("infobatch", 0.5, 0, 0.85, 40.0),
            summary("infobatch", 0.5, 1, 0.86, 50.0),
        ),
        "full_data",
    )
    points = {(p.method, p.budget): p for p in aggregate(runs)}
    assert points["infobatch", 0.5].accuracy == pytest.approx(85.333, abs=1e-3)
    (paired,) = paired_with_whole_pool(runs)
    assert paired.method == "infobatch" and paired.seeds == (0, 1)
    assert paired.difference == pytest.approx(1.0)  # seed 0: 85 - 85, seed 1: 86 - 84
    assert paired.difference_std == pytest.approx(math.sqrt(2))
    assert paired.samples_ratio == pytest.approx(1.0)  # seed 0: 50,000 a run on each side
    text = "\n".join(section(list(points.values()), runs, epochs_ref))
    assert "Caveat: 2 of 3 points ran a seed more than once" in text
    assert "full_schedule at 0.5, infobatch at 0.5." in text


def test_a_run_whose_test_accuracy_is_not_a_number_is_no_point() -> None:
    """A NaN accuracy stopped the report with a traceback (statistics.stdev); an infinite one
    made a point of infinite accuracy. Such a run is left out, as a failed one is; a NaN
    validation accuracy is no validation accuracy."""
    runs, _ = records(
        with_reference_runs(
            summary("infobatch", 0.5, 0, math.nan, 50.0),
            summary("infobatch", 0.5, 1, 0.80, 50.0, val=math.nan),
            summary("infobatch", 0.5, 2, math.inf, 50.0),
        ),
        "full_data",
    )
    points = {(p.method, p.budget): p for p in aggregate(runs)}
    infobatch = points["infobatch", 0.5]
    assert infobatch.seeds == (1,) and infobatch.accuracy == pytest.approx(80.0)
    assert infobatch.val_accuracy is None
    assert lossless_speedups(list(points.values())) == {"infobatch": None}


def test_the_reference_is_at_the_methods_epochs_however_many_curve_runs() -> None:
    """E_ref was the epochs most finished runs had: a narrowed sweep (one method, seed 0) beside
    the whole pool's curve at 16 epochs for three seeds took the 16-epoch runs for the reference
    and the 12-epoch reference for the curve."""
    jobs = [
        summary("full_data", 0.1, 0, 0.90, 100.0),
        summary("infobatch", 0.5, 0, 0.89, 50.0),
        *(summary("full_data", 0.1, s, 0.91, 140.0, epochs=16) for s in (0, 1, 2)),
    ]
    from lipt.report.frontier_runs import by_epochs

    ((epochs, group),) = by_epochs(jobs, "full_data").items()
    runs, epochs_ref = records(group, "full_data", epochs)
    assert epochs_ref == 12
    points = {(p.method, p.budget): p for p in aggregate(runs)}
    assert points[REFERENCE, 1.0].seeds == (0,)
    assert points[CURVE, 16 / 12].seeds == (0, 1, 2)
    assert points["infobatch", 0.5].speedup == pytest.approx(2.0)
