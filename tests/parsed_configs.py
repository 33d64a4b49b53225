"""Config files parsed once per test process.

Hydra reads every YAML file of a composition again at each compose, with PyYAML's pure-Python
parser, and the suite composes over a thousand times: parsing is about a fifth of a
composition's CPU. `keep_parsed_configs()` has `OmegaConf.load` (what Hydra's config sources
call) keep each file's parsed YAML, keyed by the file's text, and build each config from a deep
copy of it: the config a fresh parse gives, also for a file that changed. Text that is not a
config fails as before, naming its file. The tests' compositions use it, and so does the
preloaded Python (tests/preloaded.py), whose forks inherit what it parsed.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import IO, Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf._utils import get_yaml_loader

_PARSED: dict[str, Any] = {}  # a file's text -> its parsed YAML
_LOAD = OmegaConf.load


def _load(file_: str | Path | IO[Any]) -> DictConfig | ListConfig:
    if isinstance(file_, (str, os.PathLike)):
        with open(os.path.abspath(file_), encoding="utf-8") as f:
            text = f.read()
    elif hasattr(file_, "read"):
        text = file_.read()
    else:
        return _LOAD(file_)  # OmegaConf's own error
    if text not in _PARSED:
        try:
            parsed = yaml.load(text, Loader=get_yaml_loader())
        except yaml.YAMLError:
            return _load_again(file_)
        if parsed is not None and not isinstance(parsed, (list, dict, str)):
            return _load_again(file_)
        _PARSED[text] = parsed
    parsed = _PARSED[text]
    return OmegaConf.create() if parsed is None else OmegaConf.create(copy.deepcopy(parsed))


def _load_again(file_: str | Path | IO[Any]) -> DictConfig | ListConfig:
    """Text that is not a config: OmegaConf's own load, for its own error naming the file."""
    if not isinstance(file_, (str, os.PathLike)):
        file_.seek(0)
    return _LOAD(file_)


def keep_parsed_configs(parse_now: str | Path | None = None) -> None:
    """Parse each config file once from now on; `parse_now`: a folder whose YAML files to parse
    at once (a process that forks parses them for all its children)."""
    OmegaConf.load = staticmethod(_load)  # type: ignore[method-assign,assignment]
    for path in sorted(Path(parse_now).rglob("*.yaml")) if parse_now else ():
        _load(path)


def parse_every_time() -> None:
    """Undo `keep_parsed_configs` (the test that compares both)."""
    OmegaConf.load = staticmethod(_LOAD)  # type: ignore[method-assign,assignment]
