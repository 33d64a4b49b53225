"""Every experiment config composes, and so does every run of its sweep."""

from __future__ import annotations

import itertools

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lipt.config import validate
from tests.conftest import CONFIGS

EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))


def test_every_paper_experiment_has_a_gpu_and_a_cpu_version():
    names = set(EXPERIMENTS)
    for base in ("table1", "table2", "table3", "figure3", "appendix_b", "appendix_c", "appendix_d"):
        assert {base, f"{base}_cpu"} <= names


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_sweep_composes(name, tmp_path):
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        base = compose("train", overrides=[f"+experiment={name}"], return_hydra_config=True)
        params = OmegaConf.to_container(base.hydra.sweeper.params)
        assert isinstance(params, dict) and params
        # every table has its random row, except the lipt-only sensitivity/ablation sweeps
        approaches = str(params.get("+approach", "")).split(",")
        if not name.startswith("figure"):  # a figure of lipt alone: the sensitivity sweep
            assert "random" in approaches or "full_data" in approaches, approaches
        swept = {k: str(v).split(",") for k, v in params.items() if k != "seed"}
        runs = [
            dict(zip(swept, values, strict=True)) for values in itertools.product(*swept.values())
        ]
        for run in runs:
            overrides = [f"+experiment={name}", f"paths.output_dir={tmp_path}"]
            overrides += [f"{k}={v}" for k, v in run.items()]
            if "cpu" not in name:  # CIFAR needs its folder (validate checks that it exists)
                overrides.append(f"dataset.data_dir={tmp_path}")
            cfg = compose("train", overrides=overrides)
            validate(cfg)
            if "+approach" in run:
                assert cfg.approach == run["+approach"]
            if "cpu" in name:
                assert cfg.dataset.name == "fashion_mnist" and "ConvNet" in cfg.model._target_
