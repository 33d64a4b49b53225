"""pyproject.toml's lower bounds are releases lipt runs on, not wishes. CI installs the newest
releases, so a floor below a feature lipt reads goes unnoticed there; these floors were found by
running the tests on the lowest allowed versions (`uv pip install --resolution lowest-direct`),
and each is listed here with what broke below it, so lowering one again fails here."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# The first release that runs lipt, and what broke on the one before it.
FIRST_WORKING = {
    # validate_json raised NotImplementedError on a union holding a class (the Trainer's
    # `accelerator: str | Accelerator`), so every config check crashed
    "pydantic": ("2.10", "a union with a class, checked from JSON"),
    # SGD's `nesterov` had no annotation (before 2.4 neither had lr, momentum, weight_decay):
    # optimizer.nesterov=maybe passed the config check unrefused
    "torch": ("2.6", "SGD's settings annotated"),
    "torchvision": ("0.21", "torch 2.6's"),
    # the Trainer took `plugins` as a list only; Hydra passes lipt's as a ListConfig, so every
    # Trainer lipt built was refused
    "lightning": ("2.5", "plugins as any iterable"),
    # pyarrow 26 (datasets', for cleanlab's Datalab) refuses numpy 1 at import, undeclared: under
    # numpy 1 importing scikit-learn, so cleanlab, failed; numpy 2.0.0's np.unique(axis=0) gave
    # an inverse of the wrong shape, and Datalab's outlier and near-duplicate checks failed
    "numpy": ("2.0.1", "pyarrow 26's numpy, np.unique's inverse"),
    "matplotlib": ("3.8.4", "a build for numpy 2"),
    "wandb": ("0.17.2", "no np.float_, gone in numpy 2"),
    "tensorboard": ("2.17.1", "no np.string_, gone in numpy 2"),
    # before 2.6.5 importing cleanlab failed on scikit-learn 1.8 (multi_class); before 2.8 Datalab
    # refused the label Column of datasets 4
    "cleanlab": ("2.8", "datasets 4's Column"),
}


def dependencies() -> list[Requirement]:
    """[project] dependencies, read as text: tomllib is Python 3.11's, lipt runs on 3.10."""
    block = re.search(r"^dependencies = \[(.*?)^\]", PYPROJECT.read_text(), re.M | re.S)
    assert block, "pyproject.toml has no dependencies list"
    return [Requirement(s) for s in re.findall(r'^\s*"([^"]+)",', block.group(1), re.M)]


def declared_floors() -> dict[str, Version]:
    """Each dependency's lower bound (>=) in pyproject.toml, by its normalised name."""
    floors: dict[str, Version] = {}
    for requirement in dependencies():
        lows = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        if lows:
            floors[requirement.name.lower().replace("_", "-")] = max(lows)
    return floors


def test_no_floor_is_below_the_first_release_lipt_runs_on() -> None:
    floors = declared_floors()
    for name, (first, what) in FIRST_WORKING.items():
        assert name in floors, f"pyproject.toml declares no lower bound for {name}"
        assert floors[name] >= Version(first), f"{name}>={floors[name]} lacks {what} ({first})"


def test_every_dependency_has_a_floor() -> None:
    # A dependency without one lets a resolver keep any old release already installed.
    requirements = dependencies()
    assert len(requirements) > 10, "the dependencies list was not read"
    names = {r.name.lower().replace("_", "-") for r in requirements}
    assert names == set(declared_floors()), names - set(declared_floors())
