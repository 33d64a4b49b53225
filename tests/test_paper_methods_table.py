"""docs/METHODS.md's table of the paper's experiments says what each experiment's sweep runs:
its data set and model, its approaches, their fractions, and its `_cpu` version's."""

from __future__ import annotations

import re

import pytest
from hydra import compose, initialize_config_dir

from tests.helpers import CONFIGS, ROOT
from tests.test_experiments import folded, fractions_of, sweep_jobs

METHODS = ROOT / "docs" / "METHODS.md"
BASELINES = {"random", "random_online", "random_balanced", "full_steps"}
DATA = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "fashion_mnist": "Fashion-MNIST"}
MODELS = {"ResNet18": "ResNet-18", "ConvNet": "convnet"}


def table_rows() -> dict[str, list[str]]:
    """The experiment name -> the cells of its row, from the section's table."""
    section = METHODS.read_text().split("## The paper's experiments", 1)[1]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.fullmatch(r"`\w+`", cells[0]):
            rows[cells[0].strip("`")] = cells
    return rows


def percents(text: str) -> set[float]:
    return {round(float(p) / 100, 4) for p in re.findall(r"\d+", text)}


def composed(name: str) -> tuple[dict[str, set[float]], str, str, int]:
    """Each approach of the experiment's sweep -> its fractions; its data set, model, epochs.

    A job's approach is the `+approach=` its sweeper gives it (a composed job's `approach` is
    that option's: tests/test_experiments.py holds it for every job of every experiment); a
    setting is composed where its fraction is not swept (read from the config), and the last
    one for the data set, model and epochs (each composition costs ~0.3 s of CPU)."""
    seen: dict[str, set[float]] = {}
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        settings = folded(sweep_jobs([f"+experiment={name}"]), ("seed", "fraction"))
        for number, (job, varied) in enumerate(settings.items(), 1):
            (approach,) = [o.split("=", 1)[1] for o in job if o.startswith("+approach=")]
            fractions = fractions_of(varied)
            if not fractions or number == len(settings):
                cfg = compose("train", overrides=list(job))
                fractions = fractions or [float(cfg.fraction)]
            seen.setdefault(approach, set()).update(round(f, 4) for f in fractions)
    model = str(cfg.model._target_).rsplit(".", 1)[1]
    return seen, DATA[cfg.dataset.name], MODELS[model], int(cfg.trainer.max_epochs)


def test_the_table_has_every_paper_experiment():
    names = {p.stem for p in (CONFIGS / "experiment").glob("*.yaml")}
    paper = {n for n in names if not n.startswith("frontier") and not n.endswith("_cpu")}
    assert set(table_rows()) == paper


@pytest.mark.parametrize("name", sorted(table_rows()))
def test_a_row_says_what_its_experiment_runs(name):
    _, _, data_model, approaches, fractions, cpu = table_rows()[name]
    seen, data, model, epochs = composed(name)
    assert epochs == 200 and data_model == f"{data}, {model}", (epochs, data, model)
    named = set(re.findall(r"`(\w+)`", approaches))
    baselines = BASELINES if name != "figure3" else set()
    assert set(seen) == named | baselines, set(seen) ^ (named | baselines)
    column = percents(fractions)
    for approach, got in seen.items():
        if approach == "full_data":  # the whole pool: its fraction is not used
            continue
        if got != column:  # told beside the approach: "`grand_full` ... at 20%"
            assert len(got) == 1, (approach, got, column)
            (pct,) = got
            assert re.search(rf"`{approach}`[^;]*? at {round(pct * 100)}%", approaches), approach
    cpu_seen, cpu_data, cpu_model, cpu_epochs = composed(f"{name}_cpu")
    assert set(cpu_seen) == set(seen) and (cpu_data, cpu_model) == ("Fashion-MNIST", "convnet")
    cpu_fractions, _, differs = cpu.partition(";")
    told = re.match(r"\s*(\d+) epochs", differs)  # main training's, first
    assert cpu_epochs == (int(told.group(1)) if told else 15), cpu_epochs
    reference = "random" if baselines else "lipt"
    assert cpu_seen[reference] == percents(cpu_fractions), cpu_seen[reference]
