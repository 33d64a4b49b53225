"""Every run of every experiment, composed as Hydra's sweeper composes it, follows the paper's
protocol; every sweep command that docs/RESULTS.md says made its tables still composes."""

from __future__ import annotations

import math
import re
import shlex

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from lipt.run.config import run_of, validate
from lipt.run.precheck import precheck
from lipt.stages.build import build_part
from tests.helpers import CONFIGS, ROOT

# The paper's experiments; the frontier's (frontier_*) are tests/test_frontier.py's.
EXPERIMENTS = sorted(
    p.stem for p in (CONFIGS / "experiment").glob("*.yaml") if not p.stem.startswith("frontier")
)
RESULTS = ROOT / "docs" / "RESULTS.md"


def without_sweeps(overrides: list[str]) -> list[str]:
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [str(o.input_line) for o in parsed if not o.is_sweep_override()]


def sweep_jobs(arguments: list[str]) -> list[list[str]]:
    """The override list of every job of `python train.py -m <arguments>`, exactly as Hydra's
    BasicSweeper builds them: the sweeper's params (of the config the command line composes)
    FIRST, then the command line, a repeated key keeping its first place with the last value.
    So `+approach=...` comes before `+experiment=...`, and the experiment's keys override the
    approach preset's."""
    base = compose("train", overrides=without_sweeps(arguments), return_hydra_config=True)
    params = OmegaConf.to_container(base.hydra.sweeper.params)
    assert isinstance(params, dict) and params
    parsed = OverridesParser.create().parse_overrides(
        [*(f"{k}={v}" for k, v in params.items()), *arguments]
    )
    (jobs,) = BasicSweeper.split_arguments(parsed, None)
    return jobs


def folded(jobs: list[list[str]], keys: tuple[str, ...]) -> dict[tuple[str, ...], list[str]]:
    """Each setting of a sweep (a job without its `keys`) -> the overrides of those keys it runs
    with (one list a job). Seeds and fractions are plain leaves that neither the defaults list
    nor a group choice reads, so a setting is composed once for all of them and each job is the
    composed setting with its own values set (every composition costs ~0.3 s of CPU;
    `test_a_folded_setting_with_its_fraction_set_is_the_job_composed` holds the premise)."""
    settings: dict[tuple[str, ...], list[str]] = {}
    for job in jobs:
        rest = tuple(o for o in job if not o.startswith(tuple(f"{k}=" for k in keys)))
        varied = [o for o in job if o not in rest]
        settings.setdefault(rest, []).append(" ".join(varied))
    return settings


def seeds_folded(jobs: list[list[str]]) -> dict[tuple[str, ...], set[str]]:
    """Each setting of a sweep (a job without its seed) -> the seeds it runs for."""
    return {rest: set(seeds) for rest, seeds in folded(jobs, ("seed",)).items()}


def fractions_of(varied: list[str]) -> list[float]:
    """The distinct fractions of a folded setting's jobs, in order ("fraction=0.1 seed=0", ...)."""
    found = [
        float(o.split("=", 1)[1]) for v in varied for o in v.split() if o.startswith("fraction=")
    ]
    return sorted(set(found))


def test_every_paper_experiment_has_a_gpu_and_a_cpu_version():
    names = set(EXPERIMENTS)
    for base in ("table1", "table2", "table3", "figure3", "appendix_b", "appendix_c", "appendix_d"):
        assert {base, f"{base}_cpu"} <= names


def test_the_sweeper_applies_the_approach_before_the_experiment():
    """The order this file relies on: a key the experiment sets globally beats the preset, so
    per-approach settings go through `protocol`, which the preset or the experiment reads."""
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        (job, *_) = sweep_jobs(["+experiment=table2", "+approach=random_online"])
        assert job.index("+approach=random_online") < job.index("+experiment=table2")
        cfg = compose("train", overrides=job)
        assert (
            cfg.reselect_every == 20
        )  # the experiment's protocol (200 epochs), not the preset's 2
        for approach, epochs in (("glister_full", 2), ("grand_full", 1)):
            (job, *_) = sweep_jobs(["+experiment=table2_cpu", f"+approach={approach}"])
            assert compose("train", overrides=job).pretrain.epochs == epochs, approach
        (job, *_) = sweep_jobs(["+experiment=table2_cpu", "+approach=lipt"])
        assert "epochs" not in compose("train", overrides=job).pretrain  # jigsaw takes none


# The paper's protocol (appendix A; tables 1-3, appendices B-D, figure 3). Main training:
# 200 epochs; re-selection every 20 (table 1 only, and the random-online baseline);
# GraNd: 10 models x 1 epoch of warm-up; GLISTER: 10 epochs; GradMatch: kappa = 0.5, i.e.
# ceil(0.5 x epochs x fraction). The _cpu versions: 15 epochs (table 1: 20, to keep its
# 20-of-200 re-selection ratio at 2 of 20), random online every 2, GLISTER warm-up 2 epochs.
ALL_5_TO_50 = {0.05, 0.1, 0.2, 0.3, 0.4, 0.5}
PAPER: dict[str, dict] = {
    "table1": {"epochs": 200, "fractions": {0.1}, "grand_full": {0.2}, "every": 20},
    "table2": {"epochs": 200, "fractions": {0.01, 0.05, 0.1, 0.2}},
    "table3": {"epochs": 200, "fractions": {0.1, 0.7}},
    "appendix_b": {"epochs": 200, "fractions": ALL_5_TO_50},
    "appendix_c": {"epochs": 200, "fractions": ALL_5_TO_50 - {0.05}},
    "appendix_d": {"epochs": 200, "fractions": ALL_5_TO_50 - {0.05}},
    "figure3": {"epochs": 200, "fractions": {0.1}},
    "table1_cpu": {"epochs": 20, "fractions": {0.1}, "grand_full": {0.2}, "every": 2},
    "table2_cpu": {"epochs": 15, "fractions": {0.01, 0.05, 0.1, 0.2}, "glister_warmup": 2},
    "table3_cpu": {"epochs": 15, "fractions": {0.1}},
    "appendix_b_cpu": {"epochs": 15, "fractions": {0.1}},
    "appendix_c_cpu": {"epochs": 15, "fractions": {0.1}},
    "appendix_d_cpu": {"epochs": 15, "fractions": {0.1}},
    "figure3_cpu": {"epochs": 15, "fractions": {0.1}},
}
BASELINES = {"random", "random_online", "random_balanced", "full_steps"}
RESELECTING = {"table1": {"grand_full", "grand_lipt"}, "table1_cpu": {"grand_full", "grand_lipt"}}


def expected_warmup(name: str, approach: str, epochs: int, fraction: float) -> int | None:
    """Epochs of the warm-up on the whole pool, None for approaches without one."""
    if approach == "grand_full":
        return 1
    if approach == "glister_full":
        return PAPER[name].get("glister_warmup", 10)
    if approach == "gradmatch_full":
        return math.ceil(0.5 * epochs * fraction)
    return None


def test_the_protocol_table_covers_every_experiment():
    assert set(PAPER) == set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_run_of_an_experiment_follows_the_paper(
    name, tmp_path, cifar10_dir, cifar100_dir, imagefolder_dir
):
    """Every job, composed in the sweeper's order, validates and has the paper's main-training
    epochs, fraction, re-selection period, warm-up epochs and GraNd repeats, for 3 seeds."""
    paper = PAPER[name]
    cpu = name.endswith("_cpu")
    period = paper.get("every", 2 if cpu else 20)
    seen: dict[str, set[float]] = {}
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        jobs = sweep_jobs([f"+experiment={name}"])
        assert len(jobs) == len(set(map(tuple, jobs)))
        assert all(seeds == {"seed=0", "seed=1", "seed=2"} for seeds in seeds_folded(jobs).values())
        # validate opens the data files the reader will read: give each data set its small copy
        data_dirs = {"cifar10": cifar10_dir, "cifar100": cifar100_dir, "imagenet": imagefolder_dir}
        checked: set[str] = set()
        for job, varied in folded(jobs, ("seed", "fraction")).items():
            cfg = compose("train", overrides=[*job, f"paths.output_dir={tmp_path}"])
            if cfg.dataset.name in data_dirs:  # as `dataset.data_dir=...` sets it
                cfg.dataset.data_dir = str(data_dirs[cfg.dataset.name])
            approach = str(cfg.approach)
            assert f"+approach={approach}" in job
            if cpu:
                assert cfg.dataset.name == "fashion_mnist" and "ConvNet" in cfg.model._target_
            epochs = int(cfg.trainer.max_epochs)
            assert epochs == paper["epochs"], (approach, epochs)
            reselects = approach == "random_online" or approach in RESELECTING.get(name, ())
            assert cfg.reselect_every == (period if reselects else 0), (approach, job)
            assert cfg.reselect_every < epochs, (approach, job)  # else never re-selected
            assert cfg.selector.get("repeats", 1) == (10 if approach == "grand_full" else 1)
            if approach == "full_steps":
                assert cfg.selector.name == "none" and cfg.budget.steps == "subset"
            for fraction in fractions_of(varied) or [float(cfg.fraction)]:
                cfg.fraction = fraction
                # The Trainer, selector and data-file checks once per approach (fractions do
                # not change them), the cheap checks for every job.
                validate(cfg, deep=approach not in checked)
                checked.add(approach)
                seen.setdefault(approach, set()).add(fraction)
                warmup = expected_warmup(name, approach, epochs, fraction)
                assert (cfg.pretrain.name == "full") == (warmup is not None), approach
                if warmup is not None:
                    strategy = build_part(run_of(cfg).node("pretrain"))
                    assert strategy.warmup_epochs(epochs, fraction) == warmup, (approach, fraction)
    for approach, fractions in seen.items():
        if approach != "full_data":  # the whole pool: fraction is not used
            assert fractions == paper.get(approach, paper["fractions"]), (approach, fractions)
    if not name.startswith("figure"):  # a figure of lipt alone: the sensitivity sweep
        assert set(seen) >= BASELINES, set(seen)


def results_commands() -> list[list[str]]:
    """The override lists of every `python train.py -m ...` line in docs/RESULTS.md."""
    lines = RESULTS.read_text().splitlines()
    return [shlex.split(line)[3:] for line in lines if line.startswith("python train.py -m ")]


def test_results_doc_names_a_command_for_every_cpu_experiment_it_reports():
    commands = results_commands()
    assert commands, "docs/RESULTS.md has no sweep command"
    named = {o.split("=", 1)[1] for c in commands for o in c if o.startswith("+experiment=")}
    assert named and all(n.endswith("_cpu") and n in EXPERIMENTS for n in named), named


@pytest.mark.parametrize("command", results_commands(), ids=lambda c: " ".join(c[:1]))
def test_results_doc_sweep_command_composes_every_run(command, tmp_path):
    """Every job of the command is a job of its experiment's own sweep (each of which
    test_every_run_of_an_experiment_follows_the_paper composes and checks) with the command's
    own settings added, plain values and Hydra's; a job composed with them validates."""
    (experiment,) = [o for o in command if o.startswith("+experiment=")]
    added = {o.split("=", 1)[0] for o in command if o != experiment}  # their keys
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        own = {tuple(job) for job in sweep_jobs([experiment])}
        jobs = sweep_jobs(command)
        for job in jobs:
            assert tuple(o for o in job if o.split("=", 1)[0] not in added) in own, job
        cfg = compose("train", overrides=[*jobs[0], f"paths.output_dir={tmp_path}"])
    assert cfg.dataset.name == "fashion_mnist"
    validate(cfg)


def test_a_folded_setting_with_its_fraction_set_is_the_job_composed(tmp_path):
    """The premise of `folded`: a job composed with its fraction is its setting composed with
    another fraction and this one set, key for key (the interpolations that read it, unresolved:
    they resolve alike), for an approach whose budget and warm-up read fraction."""
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        jobs = sweep_jobs(["+experiment=appendix_b", "+approach=gradmatch_full"])
        ((job, varied),) = folded(jobs, ("seed", "fraction")).items()
        first, last = fractions_of(varied)[0], fractions_of(varied)[-1]
        out = f"paths.output_dir={tmp_path}"
        set_after = compose("train", overrides=[*job, out, f"fraction={first}"])
        set_after.fraction = last
        composed = compose("train", overrides=[*job, out, f"fraction={last}"])
    assert first != last and float(composed.fraction) == last
    assert OmegaConf.to_container(set_after) == OmegaConf.to_container(composed)


def test_results_doc_links_and_report_outputs_exist():
    text = RESULTS.read_text()
    links = re.findall(r"\]\(([^)#\s]+)\)", text)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert local, "docs/RESULTS.md links no table or figure"
    for link in local:
        assert (RESULTS.parent / link).exists(), link
    for out in re.findall(r'--out (\S+?)"', text):  # make report ... ARGS="--out docs/results/x"
        assert (ROOT / out / "results.md").is_file(), out
        assert (ROOT / out / "results.csv").is_file(), out


# Every job of every experiment is composed and checked above; the precheck composes the same
# jobs (tests/test_dry_run.py): here it runs on two whole sweeps, one whose fractions differ
# by approach (table1_cpu: GraNd's warm-up at 20%) and one with four fractions and GLISTER's
# warm-up (table2_cpu).
CPU_SWEEPS = [["+experiment=table1_cpu"], ["+experiment=table2_cpu"]]


@pytest.mark.parametrize("command", CPU_SWEEPS, ids=lambda c: " ".join(c[:1]))
def test_the_cli_precheck_passes_each_sweep_with_the_experiments_own_params(command):
    """`python train.py -m +experiment=X` checks every job's config before the first starts; the
    approaches, fractions and seeds come from the experiment's `hydra.sweeper.params`, not the
    command line, and `${approach}` in its protocol only resolves with them (exit 2 before)."""
    precheck("train", command, multirun=True)  # exits 2 on the first problem


def test_a_bad_value_in_an_experiments_own_sweep_fails_before_any_job(capsys):
    with pytest.raises(SystemExit) as exit_:
        precheck(
            "train",
            ["+experiment=appendix_b_cpu", "hydra.sweeper.params.fraction='0.1,1.5'"],
            multirun=True,
        )
    assert exit_.value.code == 2
    assert "fraction" in capsys.readouterr().err
