"""The tests' parse cache (tests/parsed_configs.py) composes what Hydra composes without it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.helpers import CONFIGS
from tests.parsed_configs import keep_parsed_configs, parse_every_time


@pytest.fixture
def parsing_every_time() -> Iterator[None]:
    parse_every_time()
    try:
        yield
    finally:
        keep_parsed_configs()


def _composed(config_dir: Path, overrides: list[str], name: str = "train") -> str:
    """The job's config and Hydra's, as the sweeper composes them."""
    with initialize_config_dir(str(config_dir), version_base="1.3"):
        cfg = compose(name, overrides=overrides, return_hydra_config=True)
    return OmegaConf.to_yaml(cfg)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["+experiment=frontier_cpu", "+approach=lipt_dynamic", "fraction=0.3"],
        ["selector=glister", "pretrain=jigsaw", "trainer=ddp", "hydra/launcher=submitit_slurm"],
    ],
)
def test_cached_parses_compose_the_configs_fresh_parses_do(
    overrides: list[str], parsing_every_time: None
) -> None:
    fresh = _composed(CONFIGS, overrides)
    keep_parsed_configs()
    assert _composed(CONFIGS, overrides) == fresh  # parsed now
    assert _composed(CONFIGS, overrides) == fresh  # from the parses kept


def test_a_changed_file_is_parsed_again_and_a_broken_one_fails_naming_it(tmp_path: Path) -> None:
    keep_parsed_configs()
    config = tmp_path / "c.yaml"
    for value in (1, 2, 1):  # same size, rewritten at once: its text, not its time, is the key
        config.write_text(f"x: {value}\n")
        assert _composed(tmp_path, [], name="c").endswith(f"\nx: {value}\n")
    config.write_text("x: [1\n")
    with pytest.raises(Exception, match=r"c\.yaml"):
        _composed(tmp_path, [], name="c")
