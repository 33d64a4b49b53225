"""Parts of one's own through the config: a package outside lipt on sys.path and a config
folder of its own on Hydra's search path, as docs/METHODS.md and docs/USAGE.md promise. Each
test writes its own package (a fresh name: lipt.run.groups.locate caches what it found)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from lipt.core.errors import UserError
from lipt.run.config import validate
from lipt.run.groups import check_node
from lipt.stages.build import build_datamodule
from tests.helpers import CONFIGS, FAST

READER = """
import torch
from lipt.data import DataModule, Splits, TensorImages


def load_blobs(num_train: int = 300, classes: int = 3, size: int = 10, seed: int = 0) -> Splits:
    g = torch.Generator().manual_seed(seed)

    def part(n: int) -> TensorImages:
        y = torch.randint(0, classes, (n,), generator=g)
        x = (torch.rand(n, 1, size, size, generator=g) * 80).to(torch.uint8)
        x[:, :, : size // 2] += (y * 50).to(torch.uint8).view(-1, 1, 1, 1)
        return TensorImages(x, y)

    return Splits(part(num_train), part(100), f"blobs_{seed}", None)


class BlobsModule(DataModule):
    # lipt's data module with its reader built in, and a key of its own
    def __init__(self, load=None, seed: int = 0, **kwargs) -> None:
        super().__init__(load=lambda: load_blobs(seed=seed), **kwargs)


class HalfPrune:
    # a budget of one's own: the whole pool, pruned by lipt's InfoBatch at its own ratio
    trains_subset = False
    prunes = True
    needs_ensemble = False
    counts_steps = False

    def __init__(self, name: str = "halfprune", ratio: float = 0.3) -> None:
        self.name, self.ratio = name, ratio

    def schedule(self, sizes):
        from lipt.core.budget import Schedule

        return Schedule(sizes.max_epochs)

    def pruning(self, fraction: float):
        from lipt.dynamic import InfoBatch

        return InfoBatch(self.ratio, name=self.name)


class Foreign:
    # not lipt's data module
    def __init__(self, **kwargs) -> None:
        pass
"""

# A data set of one's own: the keys lipt's data module takes, less those it has defaults for.
BLOBS = """
_target_: lipt.data.DataModule
name: blobs
num_classes: 3
channels: 1
image_size: 10
mean: [0.4]
std: [0.3]
val_size: 50
split_seed: 0
crop_padding: 1
flip: false
load:
  _target_: {package}.data.load_blobs
  _partial_: true
  classes: ${{dataset.num_classes}}
  size: ${{dataset.image_size}}
"""

LIPT_KEYS = "data_dir: null\nnum_workers: 0\nresident: true\neval_batch_size: 64\n"


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A package of one's own (its name, on sys.path) and its config folder."""
    package = f"extpkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "data.py").write_text(READER)
    monkeypatch.syspath_prepend(str(tmp_path))
    conf = tmp_path / "conf"
    (conf / "dataset").mkdir(parents=True)
    (conf / "dataset" / "blobs.yaml").write_text(BLOBS.format(package=package))
    module = f"defaults:\n  - blobs\n  - _self_\n{LIPT_KEYS}"
    (conf / "dataset" / "blobs_own.yaml").write_text(
        f"{module}_target_: {package}.data.BlobsModule\n"
    )
    (conf / "budget").mkdir()
    (conf / "budget" / "halfprune.yaml").write_text(
        f"_target_: {package}.data.HalfPrune\nname: halfprune\nratio: 0.3\n"
    )
    (conf / "dataset" / "foreign.yaml").write_text(f"{module}_target_: {package}.data.Foreign\n")
    return package, conf


@pytest.fixture
def user_cfg(user: tuple[str, Path], tmp_path: Path) -> Callable[..., DictConfig]:
    def _make(overrides: Sequence[str]) -> DictConfig:
        searchpath = f"hydra.searchpath=[file://{user[1]}]"
        fast = [o for o in FAST if not o.startswith("dataset=")]
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            return compose(
                "train", [searchpath, f"paths.output_dir={tmp_path / 'run'}", *fast, *overrides]
            )

    return _make


def test_a_targets_module_that_fails_to_import_is_named_with_its_own_error(
    user: tuple[str, Path], tmp_path: Path
) -> None:
    """A user module whose own import fails (a dependency missing) is named with that error,
    not as an attribute its package lacks."""
    package = user[0]
    (tmp_path / package / "broken.py").write_text(
        "import extend_missing_dependency\n\ndef select_x(inputs, budget, *, generator): ...\n"
    )
    node = {"_target_": f"{package}.broken.select_x", "_partial_": True, "name": "x"}
    with pytest.raises(UserError, match="No module named 'extend_missing_dependency'"):
        check_node("selector", node)
    node["_target_"] = f"{package}.nosuch.select_x"  # the module itself not there: named
    with pytest.raises(UserError, match=f"module '{package}' has no attribute 'nosuch'"):
        check_node("selector", node)


def test_keys_a_config_file_lacks_are_named_together_with_a_fix_that_works(
    user_cfg: Callable[..., DictConfig],
) -> None:
    """Every key a data set of one's own lacks is named in one line, and the fix it gives is
    `+key=...` (Hydra refuses `key=...` for a key the config does not have): with it, the
    config passes. The keys lipt's DataModule has defaults for (where the data is read from
    and how fast) may be left out."""
    validate(user_cfg(["dataset=blobs"]), build=False)  # without data_dir, num_workers, ...
    lacking = ["dataset=blobs", "~dataset.flip", "~dataset.crop_padding"]
    with pytest.raises(UserError) as refused:
        validate(user_cfg(lacking), deep=False)
    message = str(refused.value)
    assert "\n" not in message
    for key in ("flip", "crop_padding"):
        assert f"+dataset.{key}=..." in message, message
    validate(user_cfg([*lacking, "+dataset.flip=false", "+dataset.crop_padding=1"]), build=False)


def test_a_data_module_of_ones_own_takes_keys_of_its_own(
    user_cfg: Callable[..., DictConfig],
) -> None:
    """A subclass of lipt's data module (`dataset._target_`, USAGE.md) with a parameter of its
    own: the key is taken and reaches it; a misspelt one is refused in one line."""
    run = validate(user_cfg(["dataset=blobs_own", "+dataset.seed=3"]), build=False)
    dm = build_datamodule(run)
    assert dm.splits is not None and dm.splits.name == "blobs_3"
    with pytest.raises(UserError, match=r"dataset\.sed is not a setting here"):
        validate(user_cfg(["dataset=blobs_own", "+dataset.sed=3"]), build=False)
    with pytest.raises(UserError, match=r"dataset\.batch_size is not a setting here"):
        validate(user_cfg(["dataset=blobs_own", "+dataset.batch_size=3"]), build=False)


def test_a_data_module_not_lipts_is_refused_in_one_line(
    user_cfg: Callable[..., DictConfig],
) -> None:
    with pytest.raises(UserError, match=r"dataset\._target_=.*Foreign is not a lipt\.data\."):
        validate(user_cfg(["dataset=foreign"]), build=False)


def test_an_approach_file_without_its_name_is_refused_naming_the_key_to_add(
    user: tuple[str, Path], user_cfg: Callable[..., DictConfig]
) -> None:
    """The frontier's experiments read ${approach}, which each approach file sets (METHODS.md):
    one of one's own that leaves it out is told to, not shown an interpolation error."""
    approach = user[1] / "approach"
    approach.mkdir()
    (approach / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /selector: random\n"
    )
    with pytest.raises(UserError, match=r"`approach: <name>`"):
        validate(user_cfg(["+experiment=frontier_small", "+approach=mine"]), deep=False)


def test_a_pruning_budget_of_ones_own_is_checked_with_its_pruning_method(
    user_cfg: Callable[..., DictConfig],
) -> None:
    """A budget that hands lipt's pruning method a value out of its range is refused with the
    config's checks (so by dry_run=true), not when main training is being built."""
    run = validate(user_cfg(["budget=halfprune"]), build=False)
    assert run.budget.pruning(0.1).ratio == 0.3
    with pytest.raises(UserError, match=r"budget=halfprune: budget\.ratio=1\.5 is invalid"):
        validate(user_cfg(["budget=halfprune", "budget.ratio=1.5"]), build=False)


@pytest.mark.parametrize(
    "overrides",
    [
        ["selector=random", "budget=subset", "~selector._partial_"],  # a file of one's own
        ["optimizer._partial_=false"],
        ["scheduler._partial_=false"],
        ["dataset.load._partial_=false"],
    ],
)
def test_a_target_lipt_calls_itself_without_partial_is_told_to_add_it(
    overrides: list[str], user_cfg: Callable[..., DictConfig]
) -> None:
    """Hydra calls a target without `_partial_: true` on its keys alone: the refusal says to
    add it, not that the target's settings are invalid (a positional argument missing)."""
    with pytest.raises(UserError, match=r"needs `_partial_: true` beside its _target_"):
        validate(user_cfg(["dataset=synthetic", *overrides]), build=False)
