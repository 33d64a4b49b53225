"""lipt's Python API on a researcher's own data that is not images: tabular features, class
names mapped to indices, numpy seeds and labels, loaders of the data set's own items. What it
accepts gives what the plain spelling gives; what it refuses is a ValueError naming the argument
and the fix, raised before the model runs or a learner trains."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import lipt
from lipt.selection.types import LearnerHeads

N, DIM, CLASSES = 600, 20, 4
NAMES = ["cat", "dog", "eel", "fox"]


def tabular(n: int = N) -> tuple[Tensor, Tensor]:
    """20 float columns, 4 classes."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(CLASSES, DIM, generator=g) * 1.5
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return centres[y] + torch.randn(n, DIM, generator=g), y


def make_net() -> nn.Module:
    """An MLP whose head has no bias."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 16), nn.ReLU(), nn.Linear(16, CLASSES, bias=False))


class Exploding(nn.Module):
    """A model that must not run: the refusal comes first."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        raise AssertionError("the model ran before the refusal")


class Named(Dataset):
    """Labels kept as class names in `.targets`, mapped to indices by __getitem__."""

    def __init__(self) -> None:
        self.x, y = tabular()
        self.targets = [NAMES[int(i)] for i in y]
        self.class_to_idx = {name: i for i, name in enumerate(NAMES)}

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return self.x[i], self.class_to_idx[self.targets[i]]


def data(**kwargs: object) -> lipt.PoolDataModule:
    return lipt.PoolDataModule(TensorDataset(*tabular()), val_size=0.1, **kwargs)  # type: ignore[arg-type]


# --- select --------------------------------------------------------------------------------


def test_select_takes_a_numpy_seed_as_its_int() -> None:
    dm, net = data(), make_net()
    assert torch.equal(
        lipt.select(net, dm, 30, seed=np.int64(2)).indices, lipt.select(net, dm, 30, seed=2).indices
    )


@pytest.mark.parametrize("seed", [None, 1.5, "0"])
def test_select_refuses_a_seed_before_the_pass(seed: object) -> None:
    with pytest.raises(ValueError, match="seed must be an integer"):
        lipt.select(Exploding(), data(), 30, seed=seed)  # type: ignore[arg-type]


def test_select_names_a_nan_budget() -> None:
    with pytest.raises(ValueError, match=r"a budget share must be in \(0, 1\], got nan"):
        lipt.select(Exploding(), data(), float("nan"))


@pytest.mark.parametrize("selector", ["coverage", "random"])
def test_select_refuses_batches_without_positions(selector: str) -> None:
    loader = DataLoader(TensorDataset(*tabular()), batch_size=50)  # (x, y): no idx
    with pytest.raises(ValueError, match=r"batches must be \(x, y, idx\).*PoolDataModule"):
        lipt.select(Exploding(), loader, 30, selector)


def test_select_refuses_learner_heads_before_the_pass() -> None:
    with pytest.raises(ValueError, match="learner_heads must be the jigsaw learners' heads"):
        lipt.select(Exploding(), data(), 30, learner_heads=torch.zeros(3, CLASSES, DIM))  # type: ignore[arg-type]


def test_select_refuses_another_models_learner_heads_before_the_pass() -> None:
    heads = LearnerHeads(torch.zeros(3, CLASSES, 16), torch.zeros(3, CLASSES))  # a 16-wide head
    with pytest.raises(ValueError, match=r"learner_heads are \[classes, features\] \(4, 16\)"):
        lipt.select(Exploding(), data(), 30, learner_heads=heads)


class Float64Embeddings(Dataset):
    """Pre-computed embeddings as numpy keeps them: float64."""

    def __init__(self) -> None:
        x, y = tabular()
        self.x, self.y = x.double().numpy(), y.numpy()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        return self.x[i], self.y[i]


def test_select_names_inputs_the_model_cannot_take() -> None:
    dm = lipt.PoolDataModule(Float64Embeddings(), val_size=0.1)
    net = make_net()
    net[0].eval()  # a frozen part stays frozen, the rest in training mode
    with pytest.raises(ValueError, match=r"fails on the data's inputs .*torch\.float64.*float32"):
        lipt.select(net, dm, 30)
    assert [m.training for m in net] == [False, True, True]


def test_random_refuses_a_negative_label() -> None:
    x, y = tabular()
    y[-1] = -1  # "unlabelled" in some data sets; held labels are refused at construction
    items = [(x[i : i + 50], y[i : i + 50], torch.arange(i, i + 50)) for i in range(0, N, 50)]
    with pytest.raises(ValueError, match=r"1 negative label\(s\) \(dataset index 599"):
        lipt.select(None, items, 30, "random", balance=True)


# --- PoolDataModule -------------------------------------------------------------------------


def test_class_names_in_targets_are_read_from_the_items() -> None:
    named = Named()
    dm = lipt.PoolDataModule(named, val_size=0.1)
    assert torch.equal(dm.labels(), tabular()[1])


def test_targets_that_are_not_the_items_labels_are_refused() -> None:
    class Shifted(Named):
        def __init__(self) -> None:
            super().__init__()
            self.targets = [int(t) + 1 for t in tabular()[1]]  # raw codes, mapped by items

        def __getitem__(self, i: int) -> tuple[Tensor, int]:
            return self.x[i], self.targets[i] - 1

    with pytest.raises(ValueError, match=r"targets\[0\] is \d+ but train\[0\]'s label is \d+"):
        lipt.PoolDataModule(Shifted())


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("batch_size", 2.5, "batch_size must be an integer >= 1, got 2.5"),
        ("batch_size", None, "batch_size must be an integer >= 1, got None"),
        ("batch_size", "64", "batch_size must be an integer >= 1, got '64'"),
        ("eval_batch_size", 0, "eval_batch_size must be an integer >= 1, got 0"),
        ("num_workers", 1.5, "num_workers must be an integer >= 0, got 1.5"),
        ("split_seed", None, "split_seed must be an integer, got None"),
        ("seed", 0.5, "seed must be an integer, got 0.5"),
        ("device", "gpu", 'device=\'gpu\' is no torch device: give "cpu" or "cuda"'),
    ],
)
def test_counts_and_seeds_must_be_integers(key: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        data(**{key: value})


def test_numpy_seeds_split_and_shuffle_as_their_ints() -> None:
    numpy_made = data(split_seed=np.int64(3), seed=np.int64(4), resident=True)
    made = data(split_seed=3, seed=4, resident=True)
    assert torch.equal(numpy_made.val_indices, made.val_indices)
    first = [next(iter(dm.train_dataloader()))[2] for dm in (numpy_made, made)]
    assert torch.equal(*first)


def test_set_subset_refuses_an_empty_subset() -> None:
    with pytest.raises(ValueError, match="set_subset: no indices; give at least one, or None"):
        data(resident=True).set_subset(torch.tensor([], dtype=torch.long))


def test_set_subset_takes_numpy_and_lists() -> None:
    dm = data()
    rows = dm.pool_indices[:5].numpy()
    dm.set_subset(rows, np.full(5, 2.0))
    assert dm.subset_weights is not None and dm.subset_weights.tolist() == [2.0] * 5
    dm.set_subset(rows.tolist(), [1.0] * 5)
    assert dm.subset_indices is not None and dm.subset_indices.tolist() == rows.tolist()


@pytest.mark.parametrize(
    ("where", "weight", "message"),
    [
        ("outside", 1.0, r"outside the data set's 600 items \(first: 600\)"),
        ("val", 1.0, "in the validation split"),
        ("pool", float("nan"), "NaN, infinite or negative"),
        ("pool", -1.0, "NaN, infinite or negative"),
    ],
)
def test_set_subset_refuses_what_training_cannot_use(
    where: str, weight: float, message: str
) -> None:
    dm = data()
    row = {"outside": N, "val": int(dm.val_indices[0]), "pool": int(dm.pool_indices[0])}[where]
    with pytest.raises(ValueError, match=message):
        dm.set_subset(torch.tensor([int(dm.pool_indices[1]), row]), torch.tensor([1.0, weight]))


# --- jigsaw_pretrain and find_label_issues --------------------------------------------------


class Counted:
    """A factory that counts its calls: a refusal before any learner makes no model."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> nn.Module:
        self.calls += 1
        return make_net()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"optim": {"momentum": 0.5}}, r"^optim\.momentum is not a setting here"),
        ({"optim": {"lr": -1.0}}, r"^optim\.lr=-1\.0 is invalid"),
        ({"optim": 0.1}, r"^optim must be a dict"),
        ({"head": nn.Linear(16, CLASSES)}, r"^head must be the name"),
        ({"seed": None}, r"^seed must be an integer"),
    ],
)
def test_jigsaw_refuses_before_any_model(kwargs: dict, message: str) -> None:
    factory = Counted()
    with pytest.raises(ValueError, match=message):
        lipt.jigsaw_pretrain(factory, data(batch_size=16), num_learners=2, **kwargs)
    assert factory.calls == ("head" in kwargs)  # the head is read from the init; no learner


def test_jigsaw_refuses_a_bare_data_set() -> None:
    with pytest.raises(ValueError, match=r"wrap your data set in lipt.PoolDataModule"):
        lipt.jigsaw_pretrain(Counted(), TensorDataset(*tabular()))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": None}, r"^seed must be an integer"),
        ({"head": nn.Linear(16, CLASSES)}, r"^head must be the name"),
        ({"jigsaw": {"optim": {"nesterov": True}}}, r"^jigsaw\['optim'\]\.nesterov is not"),
        ({"jigsaw": [("local_epochs", 1)]}, r"^jigsaw must be a dict of lipt.jigsaw_pretrain's"),
    ],
)
def test_label_issues_refuses_before_training(kwargs: dict, message: str) -> None:
    factory = Counted()
    with pytest.raises(ValueError, match=message):
        lipt.find_label_issues(factory, data(batch_size=16), **kwargs)
    assert factory.calls <= 1  # the head is read from one model; no learner trains


def test_label_issues_takes_numpy_seed_and_folds() -> None:
    """A seed and folds drawn with numpy flag what Python's ints flag (the seed was refused by
    the probe, after the jigsaw stage had trained)."""
    jigsaw = {"num_learners": 2, "local_epochs": 1}
    dm = data(batch_size=16)
    found = lipt.find_label_issues(make_net, dm, seed=np.int64(1), folds=np.int64(3), jigsaw=jigsaw)
    again = lipt.find_label_issues(make_net, dm, seed=1, folds=3, jigsaw=jigsaw)
    assert torch.equal(found.indices, again.indices) and torch.equal(found.probs, again.probs)
