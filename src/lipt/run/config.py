"""The entry layer's reader of the config: a composed config becomes the run's typed settings
(lipt.stages.run.Run), checked before anything is computed or written. Below the entry layer,
nothing reads the composed config: lipt.stages.build instantiates the parts from the Run."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    InterpolationKeyError,
    InterpolationResolutionError,
    MissingMandatoryValue,
)

from lipt.core.budget import Budget
from lipt.core.errors import UserError
from lipt.core.schema import HYDRA_KEYS, check_mapping
from lipt.core.settings import DatasetSettings, RunSettings, SelectorSettings
from lipt.run.groups import check_node, locate
from lipt.run.rules import check_groups_together, check_settings
from lipt.stages.run import Run

DATA_MODULE = "lipt.data.DataModule"  # the `dataset` group's _target_ (or a subclass of it)
BUDGETS = "subset, full, full_steps, full_schedule, infobatch or lipt"


def _built_budget(cfg: Mapping[str, Any]) -> Budget:
    """The `budget` group's option, built from its node once each key is checked against the
    fields of its `_target_` (lipt.budget, plain Python: no torch)."""
    node = dict(cfg.get("budget") or {})
    if "_target_" not in node:
        raise UserError(f"budget has no _target_; choose budget={BUDGETS}")
    check_node("budget", node)
    option = locate(str(node.pop("_target_")))
    try:
        return cast(Budget, option(**node))
    except (UserError, ValueError, TypeError) as e:
        raise UserError(f"budget={node.get('name')}: {e}") from e


def _check_pruning(run: Run) -> None:
    """A pruning budget's method, made as main training will make it (lipt.dynamic's, whose
    settings are checked when made): a budget of one's own handing it a value out of range is
    refused with the other checks, dry_run=true included."""
    if not run.budget.prunes:
        return
    try:
        run.budget.pruning(run.settings.fraction)
    except (UserError, ValueError, TypeError) as e:
        raise UserError(f"budget={run.budget.name}: {e}") from e


def _readable_path(key: str, path: Path, what: str, want_dir: bool) -> None:
    exists = path.is_dir() if want_dir else path.is_file()
    if not exists and path.exists():
        kind = "a file, not a folder" if want_dir else "a folder, not a file"
        raise UserError(f"{key}={path} is {kind}; {what}")
    if not exists:
        raise UserError(f"{key}={path} does not exist; {what}")
    if not os.access(path, os.R_OK | (os.X_OK if want_dir else 0)):
        raise UserError(f"{key}={path} is not readable; fix its permissions")


def _check_data_dir(path: Path, dataset: DatasetSettings) -> None:
    """dataset.data_dir: a readable folder. One to download into (a reader that downloads) must
    be there too: a misspelt folder is refused, not filled with a download."""
    fix = f"point it at the {dataset.name} data"
    if not path.exists() and "download" in dataset.load:
        then = "" if dataset.load["download"] is True else " and set dataset.download=true"
        fix = f"{fix}, or create it (mkdir -p {path}){then} to download the data into it"
    _readable_path("dataset.data_dir", path, fix, want_dir=True)


def check_train_labels(path_text: str, num_classes: int) -> None:
    """dataset.train_labels: a readable .npy of integer labels [N] in the classes' range (its
    length is checked against the training split when the data is read)."""
    from lipt.data.noise import read_train_labels  # numpy and torch: not for --help

    path = Path(path_text).expanduser()
    _readable_path("dataset.train_labels", path, "give a .npy of integer labels", want_dir=False)
    try:
        read_train_labels(path, num_classes)
    except ValueError as e:
        raise UserError(f"dataset.train_labels: {e}") from e


# The config groups: each node is checked against its option's declaration (lipt.run.groups);
# every other top-level key is a field of lipt.core.settings.RunSettings.
GROUPS = (
    "dataset",
    "model",
    "pretrain",
    "augment",
    "prune",
    "merge",
    "selector",
    "budget",
    "clean",
    "optimizer",
    "scheduler",
    "logger",
    "trainer",
    "callbacks",
    "hydra",
)


def plain(cfg: DictConfig) -> dict[str, Any]:
    """The config resolved to plain Python; a key left at ??? is named."""
    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        key = e.full_key or "a key"
        raise UserError(f"{key} must be set; pass {key}=...") from e
    except InterpolationKeyError as e:
        if "approach" in cfg or "'approach'" not in str(e):
            raise
        # The frontier's experiments read ${approach}, which each approach file sets itself.
        raise UserError(
            f"{e.full_key} reads ${{approach}}, which is unset: choose +approach=<option>, and "
            "name an approach file of your own in it, `approach: <name>` (docs/METHODS.md)"
        ) from e
    except InterpolationResolutionError as e:
        if "HydraConfig was not set" not in str(e):
            raise
        # hydra.compose (a notebook, a script) sets no Hydra node: paths.output_dir's
        # ${hydra:runtime.output_dir} has no run folder to read
        raise UserError(
            f"{e.full_key} reads Hydra's run folder (${{hydra:...}}), which only a run Hydra "
            "started has; in a config from hydra.compose, set it: paths.output_dir=<folder>"
        ) from e
    assert isinstance(container, dict)
    return {str(k): v for k, v in container.items()}


def run_settings(values: dict[str, Any]) -> RunSettings:
    """The top level of the resolved config (`plain`) as typed settings: every key declared,
    every value of its type and range."""
    top = {k: v for k, v in values.items() if k not in GROUPS}
    check_mapping("", top, RunSettings.keys(), open_keys=False)
    return RunSettings(**top)


def dataset_settings(values: dict[str, Any]) -> DatasetSettings:
    if "_target_" not in values["dataset"]:
        raise UserError(
            "dataset has no _target_; add `_target_: lipt.data.DataModule` to the dataset's "
            "config (configs/dataset/*.yaml show the keys it takes)"
        )
    node = {k: v for k, v in values["dataset"].items() if k not in HYDRA_KEYS}
    declared = DatasetSettings.keys()
    # A data module of one's own (a subclass of lipt's) may take keys of its own: they are
    # checked against its parameters with the other groups' (lipt.run.groups.check_groups).
    own_module = values["dataset"]["_target_"] != DATA_MODULE
    check_mapping("dataset", node, declared, open_keys=own_module)
    return DatasetSettings(**{k: v for k, v in node.items() if k in declared})


def run_of(cfg: DictConfig) -> Run:
    """The typed settings of a composed config: its top level, `dataset.*`, the selector's and
    the budget's, each value checked against its declared type and range, and the whole config
    resolved. The checks across keys and against the libraries are `validate`'s."""
    values = plain(cfg)
    top, dataset = run_settings(values), dataset_settings(values)
    return Run(
        top, dataset, SelectorSettings.of(values.get("selector")), _built_budget(values), values
    )


def _check_chdir_paths(run: Run) -> None:
    """With hydra.job.chdir=True the job runs in its run folder, so a relative input path is
    read there, not where the command was typed: the command line's check (in the launch
    folder) passed it, and the job refused it, or read other files, after Hydra started."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or not HydraConfig.get().job.chdir:
        return
    top, pretrain = run.settings, run.config.get("pretrain") or {}
    ckpt = None if top.ckpt_path == "last" else top.ckpt_path  # last: the run's own
    paths = {
        "dataset.data_dir": run.dataset.data_dir,
        "dataset.train_labels": run.dataset.train_labels,
        "subset_path": top.subset_path,
        "ckpt_path": ckpt,
        "pretrain.merge_from": pretrain.get("merge_from"),
    }
    cwd = HydraConfig.get().runtime.cwd or os.getcwd()
    for key, value in paths.items():
        if value is not None and not Path(str(value)).expanduser().is_absolute():
            raise UserError(
                f"{key}={value} is relative, and hydra.job.chdir=True runs the job in its run "
                f"folder, where it would be read; give an absolute path "
                f"({key}={Path(cwd) / str(value)}) or leave hydra.job.chdir false"
            )


def validate(cfg: DictConfig, deep: bool = True, build: bool = True) -> Run:
    """The run's typed settings (`run_of`), once every check passes. Raise UserError naming the
    key and the fix for the first problem found: the declared type and range of every
    top-level and `dataset.*` key here (no torch), then (`deep`) every group option's keys
    against its `_target_`'s parameters and the checks across group keys, then (`build`) those
    that build the Trainer, the loggers and the selector and look at the data files
    (lipt.run.preflight)."""
    run = run_of(cfg)
    _check_chdir_paths(run)
    values, top, dataset = run.config, run.settings, run.dataset
    if dataset.data_dir is not None:
        _check_data_dir(Path(dataset.data_dir).expanduser(), dataset)
    if dataset.train_labels is not None:
        check_train_labels(dataset.train_labels, dataset.num_classes)
    if top.subset_path is not None:
        path = Path(top.subset_path).expanduser()
        _readable_path("subset_path", path, "give a subset.npz path", want_dir=False)
    resume_last = top.stage == "train" and top.ckpt_path == "last"
    # pretrain.py reads no checkpoint: lipt.run.rules refuses one, whether or not it exists
    if top.ckpt_path is not None and not resume_last and top.stage != "pretrain":
        what = "a pretrain.ckpt" if top.stage == "select" else "a checkpoint or last"
        path = Path(top.ckpt_path).expanduser()
        _readable_path("ckpt_path", path, f"give {what}", want_dir=False)
        if top.stage == "train":  # opened now, not after pre-training and selection
            from lipt.core.artifacts import check_lightning_checkpoint  # torch

            check_lightning_checkpoint(path, f"ckpt_path={top.ckpt_path}")
    check_settings(run)
    if not deep:
        return run
    # Imports the targets (torch); then the checks that build objects (Lightning).
    from lipt.run.groups import check_groups
    from lipt.run.preflight import preflight

    check_groups(cfg, values)
    _check_pruning(run)
    check_groups_together(run)
    if build:
        preflight(cfg)
    return run
