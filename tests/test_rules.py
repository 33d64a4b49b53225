"""The rules across keys (lipt.run.rules) and the options that take no settings
(lipt.run.groups.check_no_settings), each branch on a composed config: a setting nothing would
read is refused in one line naming it and the fix, the shipped ways to set it pass."""

from __future__ import annotations

import pytest
import yaml
from hydra import compose, initialize_config_dir

from lipt.core.errors import UserError
from lipt.run.config import validate
from lipt.run.groups import check_no_settings
from tests.helpers import CONFIGS

# Every budget that trains the whole pool, with what it needs beside it.
WHOLE_POOL = [
    ["budget=lipt"],
    ["budget=infobatch", "pretrain=none"],
    ["budget=infobatch_soup"],
    ["budget=full", "pretrain=none"],
    ["budget=full", "selector=none", "pretrain=none"],
    ["budget=full_steps", "pretrain=none"],
    ["budget=full_schedule", "pretrain=none"],
    ["+approach=lipt_dynamic"],
    ["+approach=infobatch"],
]


def refusal(make_cfg, overrides: list[str], config_name: str = "train", deep: bool = False) -> str:
    with pytest.raises(UserError) as caught:
        validate(make_cfg(overrides, config_name=config_name), deep=deep, build=False)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("overrides", WHOLE_POOL, ids=lambda o: " ".join(o))
def test_reselect_every_on_the_whole_pool_is_refused(make_cfg, overrides):
    budget = validate(make_cfg(overrides), deep=False).budget.name  # fine without it
    message = refusal(make_cfg, [*overrides, "reselect_every=3"])
    for word in (f"budget={budget}", "whole pool", "reselect_every=3", "reselect_every=0"):
        assert word in message, message


@pytest.mark.parametrize(
    "overrides",
    [["selector=random", "pretrain=none"], ["budget=full", "pretrain=none"], []],
    ids=["subset", "whole-pool", "default"],
)
def test_reselect_every_on_a_saved_subset_is_refused(make_cfg, tmp_path, overrides):
    saved = tmp_path / "subset.npz"
    saved.write_bytes(b"")  # only its existence is checked before the rule
    args = [*overrides, f"subset_path={saved}"]
    validate(make_cfg(args), deep=False)  # fine without reselect_every
    message = refusal(make_cfg, [*args, "reselect_every=2"])
    assert "reselect_every=2" in message and "subset_path" in message, message


@pytest.mark.parametrize("stage", ["select", "pretrain"])
def test_reselect_every_outside_main_training_is_refused(make_cfg, stage):
    validate(make_cfg([], config_name=stage), deep=False)
    message = refusal(make_cfg, ["reselect_every=2"], config_name=stage)
    assert f"which {stage}.py does not run" in message and "reselect_every" in message, message


@pytest.mark.parametrize(
    "overrides",
    [
        ["selector=random", "pretrain=none", "reselect_every=2"],
        ["selector=coverage", "reselect_every=1"],
        ["+approach=random_online"],  # its own reselect_every=20
        ["+approach=paper", "reselect_every=5"],
        ["budget=lipt", "reselect_every=0"],
    ],
    ids=lambda o: " ".join(o),
)
def test_reselect_every_on_a_subset_this_run_selects_passes(make_cfg, overrides):
    validate(make_cfg(overrides), deep=False)


def targetless_options() -> list[tuple[str, str]]:
    """The options under configs/ that name no `_target_` once composed: nothing is called,
    so only their `name` label is read."""
    found = []
    for path in sorted(CONFIGS.glob("*/*.yaml")):
        group, text = path.parent.name, path.read_text()
        if "@package _global_" in text or group in ("hydra", "logger", "callbacks"):
            continue
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            cfg = compose("train", overrides=[f"{group}={path.stem}"])
        if group in cfg and "_target_" not in cfg[group]:
            found.append((group, path.stem))
    return found


def test_the_targetless_options_are_the_none_ones():
    assert targetless_options() == [("clean", "none"), ("selector", "none")]
    for group in ("clean", "selector"):
        assert yaml.safe_load((CONFIGS / group / "none.yaml").read_text()) == {"name": "none"}


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("+clean.action=drop", ["clean.action=drop", "clean=none", "takes no settings"]),
        ("+clean.folds=3", ["clean.folds=3", "clean=none", "or drop it"]),
        ("+selector.balance=true", ["selector.balance=true", "selector=none"]),
        ("+selector.repeats=3", ["selector.repeats=3", "selector=none"]),
        ("+selector.bogus=1", ["selector.bogus=1", "selector=none"]),
    ],
)
def test_a_key_on_a_none_option_is_refused(make_cfg, override, words):
    message = refusal(make_cfg, [override], deep=True)
    for word in words:
        assert word in message, message


def test_a_none_option_keeps_its_name_and_the_other_options_their_keys(make_cfg):
    validate(make_cfg(["clean=none", "selector=none"]), build=False)
    validate(make_cfg(["clean=cleanlab", "clean.action=relabel"]), build=False)
    validate(make_cfg(["selector=random", "selector.balance=true"]), build=False)


def test_check_no_settings_names_the_option_or_the_group():
    check_no_settings("clean", {"name": "none"})
    check_no_settings("clean", {})
    with pytest.raises(UserError, match=r"^clean\.x=1 is ignored: clean=none takes"):
        check_no_settings("clean", {"name": "none", "x": 1})
    with pytest.raises(UserError, match=r"^clean\.x=\[1, 2\] is ignored: this clean takes"):
        check_no_settings("clean", {"x": [1, 2]})
