"""A selector of one's own whose output is not what lipt trains on (lipt.selection.contract):
refused in one line naming it, through the Python API and the command line, per class too;
and its misspelt bound settings refused before the pass over the pool."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import lipt
from lipt.core.errors import UserError
from lipt.selection import Selection, SelectionInputs
from lipt.selection.contract import check_selection, selector_name
from tests.helpers import FAST, ROOT, run_entry, selector_config


def ones(rows: torch.Tensor) -> Selection:
    return Selection(rows.to(torch.int64), torch.ones(len(rows)))


def select_first(inputs: SelectionInputs, budget: int, *, generator: torch.Generator) -> Selection:
    return ones(torch.arange(budget))


def select_repeated(inputs: SelectionInputs, budget: int, *, generator: torch.Generator):
    return ones(torch.zeros(budget))


def select_outside(inputs: SelectionInputs, budget: int, *, generator: torch.Generator):
    n = len(inputs.pool.targets)
    return ones(torch.arange(n - budget + 1, n + 1))


def select_nan(inputs: SelectionInputs, budget: int, *, generator: torch.Generator):
    return Selection(torch.arange(budget), torch.full((budget,), float("nan")))


def select_tensor(inputs: SelectionInputs, budget: int, *, generator: torch.Generator):
    return torch.arange(budget)


def select_short(inputs: SelectionInputs, budget: int, *, generator: torch.Generator):
    return ones(torch.arange(budget - 1))


def select_tempered(
    inputs: SelectionInputs, budget: int, *, generator: torch.Generator, temperature: float = 1.0
) -> Selection:
    return ones(torch.arange(budget))


def data(n: int = 200, classes: int = 4) -> lipt.PoolDataModule:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = torch.arange(n) % classes
    return lipt.PoolDataModule(TensorDataset(x, y), batch_size=32, val_size=0)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4))


WRONG = [
    (select_repeated, "more than once"),
    (select_outside, "outside the"),
    (select_nan, "NaN, infinite or negative"),
    (select_tensor, "not a Selection"),
    (select_short, "for a budget of"),
]


@pytest.mark.parametrize("balance", [False, True], ids=["pool", "per-class"])
@pytest.mark.parametrize(("selector", "said"), WRONG, ids=lambda v: getattr(v, "__name__", ""))
def test_a_wrong_output_is_refused_naming_the_selector(selector, said, balance):
    dm = data()
    dm.setup("fit")
    with pytest.raises(UserError) as caught:
        lipt.select(model(), dm, 40, selector, balance=balance)
    message = str(caught.value)
    assert said in message and selector.__name__ in message and "\n" not in message, message


def test_a_right_output_passes_and_the_name_is_found_behind_wrappers():
    dm = data()
    dm.setup("fit")
    subset = lipt.select(model(), dm, 40, functools.partial(select_first), balance=True)
    assert len(subset.indices) == 40
    wrapped = functools.wraps(select_first)(lambda *a, **k: None)
    assert selector_name(functools.partial(wrapped)) == "select_first"
    assert check_selection(ones(torch.arange(3)), 3, 3, "x").rows.tolist() == [0, 1, 2]
    with pytest.raises(UserError, match="selector x returned row 3"):
        check_selection(ones(torch.tensor([0, 3])), 2, 3, "x")


def test_a_misspelt_bound_setting_is_refused_before_the_pool_is_read():
    class Unread:
        def pool_dataloader(self):
            raise AssertionError("the pool was read")

    with pytest.raises(ValueError, match="temprature"):
        lipt.select(model(), Unread(), 4, functools.partial(select_tempered, temprature=2.0))


MINE = selector_config("tests.test_extend_selector_output.select_nan")


@pytest.mark.slow
def test_a_wrong_output_on_the_command_line_is_one_line(tmp_path):
    (tmp_path / "selector").mkdir()
    (tmp_path / "selector" / "mine.yaml").write_text(MINE)
    args = [*FAST, "selector=mine", "budget=subset", f"hydra.searchpath=[file://{tmp_path}]"]
    done = run_entry(
        "train.py", [*args, f"hydra.run.dir={tmp_path / 'run'}"], env={"PYTHONPATH": str(ROOT)}
    )
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "select_nan" in last and "NaN" in last, done.stderr[-2000:]
    assert not (tmp_path / "run" / "summary.json").exists()
