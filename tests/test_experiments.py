"""Every experiment config composes, and so does every run of its sweep; so does every sweep
command that docs/RESULTS.md says made its tables."""

from __future__ import annotations

import itertools
import re
import shlex

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from lipt.config import validate
from tests.conftest import CONFIGS, ROOT

EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
RESULTS = ROOT / "docs" / "RESULTS.md"


def without_sweeps(overrides: list[str]) -> list[str]:
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [str(o.input_line) for o in parsed if not o.is_sweep_override()]


def sweep_runs(overrides: list[str]) -> tuple[dict[str, str], list[list[str]]]:
    """(the sweeper's params, the swept overrides of each job) for `python train.py -m
    <overrides>`, expanded as Hydra's basic sweeper does: the experiment's
    `hydra.sweeper.params`, then the command line's own sweeps and values, which replace a
    swept key's values."""
    base = compose("train", overrides=without_sweeps(overrides), return_hydra_config=True)
    params = OmegaConf.to_container(base.hydra.sweeper.params)
    assert isinstance(params, dict) and params
    own = [o for o in overrides if not o.startswith(("hydra.", "hydra/"))]
    parsed = OverridesParser.create().parse_overrides(
        [*(f"{k}={v}" for k, v in params.items()), *own]
    )
    choices: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        if key not in params and not o.is_sweep_override():
            continue  # a fixed override: the same in every job, composed by the caller
        if o.is_sweep_override():
            values = list(o.sweep_string_iterator())
        else:
            values = [o.get_value_element_as_str()]
        choices[key] = [f"{key}={v}" for v in values]
    return params, [list(run) for run in itertools.product(*choices.values())]


def test_every_paper_experiment_has_a_gpu_and_a_cpu_version():
    names = set(EXPERIMENTS)
    for base in ("table1", "table2", "table3", "figure3", "appendix_b", "appendix_c", "appendix_d"):
        assert {base, f"{base}_cpu"} <= names


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_sweep_composes(name, tmp_path, cifar10_dir, cifar100_dir, imagefolder_dir):
    # validate opens the data files the reader will read: give each data set its small copy
    data_dirs = {"cifar10": cifar10_dir, "cifar100": cifar100_dir, "imagenet": imagefolder_dir}
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        params, runs = sweep_runs([f"+experiment={name}"])
        # every table has its random row, except the lipt-only sensitivity/ablation sweeps
        approaches = str(params.get("+approach", "")).split(",")
        if not name.startswith("figure"):  # a figure of lipt alone: the sensitivity sweep
            assert "random" in approaches or "full_data" in approaches, approaches
        assert len(runs) == len(
            list(itertools.product(*(str(v).split(",") for v in params.values())))
        )
        checked: set[str | None] = set()
        for run in runs:
            overrides = [f"+experiment={name}", f"paths.output_dir={tmp_path}", *run]
            cfg = compose("train", overrides=overrides)
            if cfg.dataset.name in data_dirs:  # CIFAR needs its folder (validate checks it)
                overrides.append(f"dataset.data_dir={data_dirs[cfg.dataset.name]}")
                cfg = compose("train", overrides=overrides)
            approach = next((o.split("=", 1)[1] for o in run if o.startswith("+approach=")), None)
            # The Trainer, selector and data-file checks once per approach (seeds and
            # fractions do not change them), the cheap checks for every run.
            validate(cfg, deep=approach not in checked)
            checked.add(approach)
            if approach is not None:
                assert cfg.approach == approach
            if "cpu" in name:
                assert cfg.dataset.name == "fashion_mnist" and "ConvNet" in cfg.model._target_


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
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        _, runs = sweep_runs(command)
        for run in runs:
            fixed = without_sweeps(command)
            cfg = compose("train", overrides=[*fixed, f"paths.output_dir={tmp_path}", *run])
            validate(cfg)
            assert cfg.dataset.name == "fashion_mnist"


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
