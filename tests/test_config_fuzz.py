"""Config fuzz: every scalar key of every option of every group set to ill-typed and out-of-range
values, each case run through what `dry_run=true` runs (every check, then the builds).

A case ends refused (a one-line UserError: exit 2) or accepted (exit 0), never with another
exception (a traceback). A word where a number, a flag or a choice belongs, or a number where a
flag belongs, is always refused, by a message that names the key. The keys come from the option
files themselves, so a key added to a config is fuzzed without touching this test; what type a
key holds is read from its composed default, not from lipt's declarations.
"""

from __future__ import annotations

import copy
import math
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from lipt.core.errors import UserError
from lipt.core.schema import fields_of
from lipt.core.settings import RunSettings
from lipt.run.config import GROUPS as GROUPS_OF_CONFIG
from lipt.run.config import run_of, validate
from lipt.run.groups import declared_keys
from lipt.run.preflight import build_everything
from tests.helpers import CONFIGS

# Quick settings under every option (an option's own override comes after and wins).
BASE = [
    "dataset=synthetic",
    "model.width=8",
    "trainer.accelerator=cpu",
    "logger=none",
    "budget=infobatch",  # the whole pool without pre-training (the default, lipt, needs one)
    "pretrain=none",
]
ADDED_BASE = ["trainer.accelerator=cpu", "logger=none"]
# What an option needs beside BASE to pass every check unfuzzed ({name}: a data folder).
NEEDS = {
    ("dataset", "fashion_mnist"): ["dataset.data_dir={fashion_mnist}"],
    ("dataset", "cifar10"): ["dataset.data_dir={cifar10}"],
    ("dataset", "cifar100"): ["dataset.data_dir={cifar100}"],
    ("dataset", "imagenet"): ["dataset.data_dir={imagenet}", "dataset.num_classes=3"],
    ("budget", "lipt"): ["pretrain=jigsaw"],
    ("budget", "infobatch_soup"): ["pretrain=jigsaw"],
    ("budget", "subset"): ["selector=random"],
    ("clean", "lipt"): ["pretrain=jigsaw"],
}
# Groups added to the config with `+` (no default option in train.yaml).
ADDED = ("approach", "experiment", "scale")
SKIPPED_KEYS = ("defaults", "hydra")


def options() -> list[tuple[str, str]]:
    found = [("", "train")]  # the primary config's own keys
    for folder in sorted(p for p in CONFIGS.iterdir() if p.is_dir() and p.name != "hydra"):
        found += [(folder.name, f.stem) for f in sorted(folder.glob("*.yaml"))]
    return found


def scalar_keys(node: Any, prefix: str = "") -> Iterator[str]:
    """Dotted keys of the scalars and lists an option file sets itself."""
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in SKIPPED_KEYS or str(key).startswith("_"):
            continue
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            yield from scalar_keys(value, path)
        else:
            yield path


def option_keys(group: str, option: str) -> list[str]:
    """The keys `group=option` sets, as the composed config spells them."""
    path = CONFIGS / (f"{group}/{option}.yaml" if group else f"{option}.yaml")
    text = path.read_text()
    keys = list(scalar_keys(yaml.safe_load(text) or {}))
    if group in ADDED or not group or "@package _global_" in text:
        return keys  # global keys (an experiment's trainer.*, protocol.*)
    return [f"{group}.{k}" for k in keys]


def values_for(default: Any) -> tuple[list[str], list[str]]:
    """(ill-typed, out-of-range) override values for a key whose default is `default`."""
    if isinstance(default, bool):
        return ["maybe", "flase", "1"], []
    if isinstance(default, int):
        return ["many", "2.5", "true"], ["-1", "0", "1000000000000"]
    if isinstance(default, float):
        return ["abc", "true"], ["-1", "0", "1e12", "nan", "inf"]
    if isinstance(default, list):
        return ["abc"], ["[]", "[-1]"]
    if isinstance(default, str):
        return [], ["nonsense_value", "''"]
    return [], ["maybe", "-1", "2.5"]  # null: a path, a count, a mode; any may be fine


def is_choice(cfg: DictConfig, key: str) -> bool:
    """Whether lipt declares `key` a choice among words (a word outside them is ill-typed)."""
    first, *rest = key.split(".")
    node = cfg.get(first)
    if OmegaConf.is_dict(node) and first in GROUPS_OF_CONFIG:
        values = OmegaConf.to_container(node, resolve=True)
        assert isinstance(values, dict)
        declared, _ = declared_keys(first, values)
    else:
        declared, rest = RunSettings.keys(), [first, *rest]
    annotation: Any = None
    for part in rest:
        annotation = (declared or {}).get(part)
        declared = fields_of(strip(annotation)) or {}
    return typing.get_origin(strip(annotation)) is typing.Literal


def strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) in (typing.Annotated, typing.Required):
        annotation = typing.get_args(annotation)[0]
    return annotation


def raw_value(cfg: DictConfig, key: str) -> Any:
    """The value `key` holds before resolution (an interpolation stays one)."""
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    assert OmegaConf.is_dict(node)
    container = OmegaConf.to_container(node, resolve=False)
    assert isinstance(container, dict)
    return copy.deepcopy(container[last])


def parsed(key: str, value: str) -> Any:
    """The value Hydra gives `key=value` on a command line."""
    return OverridesParser.create().parse_overrides([f"{key}={value}"])[0].value()


def dry_run(cfg: DictConfig, loaded: dict[str, Any]) -> str | None:
    """What `dry_run=true` runs on one composed job: None when accepted, the one-line message
    when refused. Any other exception propagates: that is a traceback."""
    try:
        validate(cfg)
        build_everything(run_of(cfg), loaded)
    except UserError as e:
        return str(e)
    return None


def compose_option(group: str, option: str, data: dict[str, Path], out: Path) -> DictConfig:
    choice = [] if not group else [f"{'+' if group in ADDED else ''}{group}={option}"]
    needs = [o.format(**data) for o in NEEDS.get((group, option), [])]
    if group == "selector" and option != "none":
        needs.append("budget=subset")  # BASE's budget, given on the command line, would win
    if group == "experiment":
        needs.append(f"+approach={first_approach(option)}")
    # An added group (an approach, an experiment) chooses groups itself: only what keeps the
    # run on the CPU, and its data set's files; the model's width where the model has one.
    base = (
        ADDED_BASE if group in ADDED else [o for o in BASE if group != "model" or "model" not in o]
    )
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"paths.output_dir={out}", *base, *choice, *needs])
    if group in ADDED and cfg.dataset.name in data:
        # as `dataset.data_dir=...` on the command line sets it (the fuzz's own premise)
        OmegaConf.update(cfg, "dataset.data_dir", str(data[cfg.dataset.name]), merge=False)
    if cfg.dataset.val_size >= FIXTURE_ITEMS:  # the real data set's count: no pool left here
        OmegaConf.update(cfg, "dataset.val_size", 10, merge=False)
    return cfg


# The fewest training items a data fixture holds (tests/conftest.py: 200 to 600).
FIXTURE_ITEMS = 200


def first_approach(experiment: str) -> str:
    """The first approach an experiment's sweep runs (its pretrain.* keys are for it)."""
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", [f"+experiment={experiment}"], return_hydra_config=True)
    return str(cfg.hydra.sweeper.params["+approach"]).split(",")[0]


@pytest.fixture
def data_dirs(fashion_mnist_dir, cifar10_dir, cifar100_dir, imagefolder_dir) -> dict[str, Path]:
    return {
        "fashion_mnist": fashion_mnist_dir,
        "cifar10": cifar10_dir,
        "cifar100": cifar100_dir,
        "imagenet": imagefolder_dir,
    }


GROUPS = sorted({group for group, _ in options()})


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g or "train.yaml")
def test_every_key_of_every_option_is_refused_or_accepted_never_a_traceback(
    group: str, data_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A relative folder a fuzzed key names (dataset.load.data_dir=nonsense_value) lands here,
    # not in the repository.
    monkeypatch.chdir(tmp_path)
    loaded: dict[str, Any] = {}
    mishandled, cases = [], 0
    for grp, option in options():
        if grp != group:
            continue
        base = compose_option(group, option, data_dirs, tmp_path)
        where = f"{group}={option}" if group else option
        assert dry_run(base, loaded) is None, f"{where} fails unfuzzed: {dry_run(base, loaded)}"
        for key in option_keys(group, option):
            default = OmegaConf.select(base, key)
            ill, out_of_range = values_for(default)
            if isinstance(default, str) and is_choice(base, key):
                ill = ["nonsense_value"]
            raw = raw_value(base, key)
            for text in [*ill, *out_of_range]:
                OmegaConf.update(base, key, parsed(key, text), merge=False)
                cases += 1
                message = dry_run(base, loaded)
                OmegaConf.update(base, key, raw, merge=False)  # back to the option's own
                if text in ill and (message is None or key.rsplit(".", 1)[-1] not in message):
                    mishandled.append(f"{where}: {key}={text} -> {message or 'accepted'}")
                if message is not None and "\n" in message:
                    mishandled.append(f"{where}: {key}={text} -> a message of several lines")
    assert cases > 0
    assert not mishandled, "\n".join(mishandled)


def test_an_override_lands_as_the_fuzz_sets_it(tmp_path: Path) -> None:
    """The fuzz sets a parsed override on a composed config; Hydra's compose with the same
    override gives the same config (so the fuzz tests what a command line gives)."""
    cases = (
        ("selector.eta", "abc"),
        ("seed", "2.5"),
        ("dataset.flip", "maybe"),
        ("dataset.data_dir", "/d"),
    )
    for key, text in cases:
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            base = compose("train", overrides=["selector=glister"])
            composed = compose("train", overrides=["selector=glister", f"{key}={text}"])
        OmegaConf.update(base, key, parsed(key, text), merge=False)
        assert OmegaConf.to_yaml(base) == OmegaConf.to_yaml(composed)


def test_values_cover_the_types_of_defaults() -> None:
    for default in (True, 3, 0.5, [0.1], "x", None):
        ill, out_of_range = values_for(default)
        assert ill or out_of_range
    assert math.isnan(parsed("x", "nan")) and parsed("x", "flase") == "flase"


def test_every_lipt_target_declares_the_type_of_every_setting() -> None:
    """The schema is the annotations: a lipt function or class a config names must annotate
    every parameter a config can set (a Lightning class's are Lightning's)."""
    import inspect

    from hydra.utils import get_object

    from lipt.run.groups import CALL_ARGUMENTS

    def unannotated(target: Any, skip: tuple[str, ...]) -> list[str]:
        """The parameters of `target` a config may set that declare no type."""
        call = target.__init__ if isinstance(target, type) else target
        return [
            p.name
            for p in inspect.signature(call).parameters.values()
            if p.name != "self"
            and p.name not in skip
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and p.annotation is inspect.Parameter.empty
        ]

    def targets(node: Any, group: str) -> Iterator[tuple[str, str]]:
        if isinstance(node, dict):
            if isinstance(node.get("_target_"), str):
                yield group, node["_target_"]
            for value in node.values():
                yield from targets(value, group)

    seen = set()
    for group, option in options():
        path = CONFIGS / (f"{group}/{option}.yaml" if group else f"{option}.yaml")
        seen |= set(targets(yaml.safe_load(path.read_text()) or {}, group))
    lipt_targets = sorted((g, t) for g, t in seen if t.startswith("lipt."))
    assert len(lipt_targets) >= 25, lipt_targets
    missing = {
        t: unannotated(get_object(t), CALL_ARGUMENTS.get(g, ()))
        for g, t in lipt_targets
        if unannotated(get_object(t), CALL_ARGUMENTS.get(g, ()))
    }
    assert not missing, missing
