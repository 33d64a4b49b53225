"""The configs a run's jobs are made of, composed as Hydra composes them, before Hydra starts:
where they are (`config_dir`), Hydra's node as a job sees it (`set_hydra_config`), and each
job's config (`compose_jobs`). lipt.run.precheck checks them; lipt.run.approach_pins composes
a sweep's other jobs to tell one job's refusal from an override's own."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lipt.core.errors import UserError, fail


def config_dir() -> Path:
    """configs/ of the repository (lipt is installed editable), or $LIPT_CONFIG_DIR."""
    env = os.environ.get("LIPT_CONFIG_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[3] / "configs"
    if not (path / "train.yaml").is_file():
        fail(f"no lipt configs at {path}; set LIPT_CONFIG_DIR to the repository's configs/")
    return path


def set_hydra_config(composed: DictConfig, multirun: bool) -> None:
    """Hydra's node as a run's job sees it (hydra.core.utils.run_job: the mode, the job's
    folder; a multirun's first job), so that `${hydra:...}` in an override resolves here as it
    will in the run. Unset at the end of precheck."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict, read_write
    from omegaconf.errors import OmegaConfBaseException

    cfg = copy.deepcopy(composed)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.MULTIRUN if multirun else RunMode.RUN
        if multirun:
            cfg.hydra.job.id = 0
            cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)  # what ${hydra:...} in the folder reads, as in run_job
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        folder = str(OmegaConf.select(cfg, key))
    except (OmegaConfBaseException, ValueError) as e:
        reason = " ".join(str(e).splitlines()[0].split())
        raise UserError(f"{key} does not resolve ({reason}); give a folder that does") from e
    if multirun:
        # A subdir of the job's own keys (${approach}) does not resolve: the sweep folder
        # stands for it.
        with contextlib.suppress(OmegaConfBaseException, ValueError):
            folder = os.path.join(folder, str(OmegaConf.select(cfg, "hydra.sweep.subdir")))
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = os.path.abspath(folder)
    HydraConfig.instance().set_config(cfg)


def compose_jobs(
    config_name: str,
    jobs: list[list[str]],
    composed: dict[tuple[str, ...], DictConfig] | None = None,
) -> Generator[DictConfig, None, None]:
    """Each job's config as `hydra.compose` makes it, without Hydra's node. Jobs that differ
    only in plain values, not in a config group's choice, share one composition: Hydra sets
    those values after composing the defaults, and so does this, with Hydra's own function
    (a sweep's seeds and fractions cost a copy, not a composition of ~30 files). `composed`:
    the compositions by their group choices, kept across calls (filled here)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    composed = {} if composed is None else composed
    parser = OverridesParser.create()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        loader = hydra.config_loader
        assert isinstance(loader, ConfigLoaderImpl)
        # Hydra's repository of config files depends on the job's hydra.searchpath alone: made
        # once (it reads the primary config: most of a job's cost in a sweep of values)
        repos: dict[tuple[str, ...], Any] = {}
        for job in jobs:
            # as Hydra's defaults list tells them apart (hydra._internal.defaults_list.Overrides)
            parsed = parser.parse_overrides(job)
            own = tuple(str(o.input_line) for o in parsed if o.is_hydra_override())
            if own not in repos:
                repos[own] = loader._parse_overrides_and_create_caching_repo(config_name, job)[1]
            repo = repos[own]
            is_value = [
                not o.is_hydra_override()
                and (isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group))
                for o in parsed
            ]
            groups = tuple(line for line, value in zip(job, is_value, strict=True) if not value)
            if groups not in composed:
                composed[groups] = compose(config_name, list(groups), return_hydra_config=False)
            cfg = copy.deepcopy(composed[groups])
            values = [o for o, value in zip(parsed, is_value, strict=True) if value]
            ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
            yield cfg
