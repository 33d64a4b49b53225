"""Hydra's Compose API (a notebook, a script): train.yaml composed with `hydra.compose`, then the
stage's entry layer (lipt.run.config.validate). No run of Hydra's sets the run folder there, so
`paths.output_dir` (`${hydra:runtime.output_dir}`) cannot resolve: refused in one line that
names the key to set, not OmegaConf's "HydraConfig was not set" traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lipt.core.errors import UserError

OVERRIDES = ["dataset=synthetic", "budget=infobatch", "pretrain=none", "logger=none"]


def composed(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    from lipt.run.composition import config_dir

    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        return compose("train", overrides)


def test_a_composed_config_without_a_run_folder_names_paths_output_dir(
    monkeypatch: Any, tmp_path: Path
) -> None:
    from hydra.core.hydra_config import HydraConfig

    from lipt.run.config import validate

    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # as in a fresh notebook
    with pytest.raises(UserError, match=r"set it: paths\.output_dir=<folder>$") as refused:
        validate(composed(OVERRIDES), deep=False)
    assert "HydraConfig" not in str(refused.value) and "\n" not in str(refused.value)

    run = validate(composed([*OVERRIDES, f"paths.output_dir={tmp_path}"]), deep=False)
    assert run.config["paths"]["output_dir"] == str(tmp_path)
    assert run.node("callbacks")["model_checkpoint"]["dirpath"].startswith(str(tmp_path))
