"""lipt.find_label_issues and lipt.datalab_report on a model and data defined here: the ranked
flags and what the run computed, Datalab's label issues, outliers and near duplicates on them,
what it refuses before any work, and (slow) the same flags as `select.py clean=lipt` on an
IDX data set for the same seed, with clean.datalab's files."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset, TensorDataset

import lipt
from lipt.stages import label_issues as api
from tests.helpers import class_images, write_idx

CLASSES, DIM, N, FLIPS = 6, 24, 1500, 150
COPIES = range(1480, 1490)  # item i is a copy of item i - 1480
FAR = range(1490, 1500)  # far from every class


def noisy_blobs() -> tuple[Tensor, Tensor, Tensor]:
    """Inputs [N, DIM], given labels [N] with FLIPS made wrong, and the true labels; COPIES
    repeat items 0..9 exactly, FAR lie far from every class."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(CLASSES, DIM, generator=g)
    truth = torch.randint(0, CLASSES, (N,), generator=g)
    x = centres[truth] + 0.8 * torch.randn(N, DIM, generator=g)
    labels = truth.clone()
    flipped = torch.randperm(1480, generator=g)[:FLIPS]
    labels[flipped] = (truth[flipped] + torch.randint(1, CLASSES, (FLIPS,), generator=g)) % CLASSES
    for copy in COPIES:
        x[copy], labels[copy], truth[copy] = x[copy - 1480], labels[copy - 1480], truth[copy - 1480]
    x[1490:] = 10 * torch.randn(len(FAR), DIM, generator=g)
    return x, labels, truth


def make_net() -> nn.Module:
    net = nn.Sequential()
    net.add_module("body", nn.Sequential(nn.Linear(DIM, 48), nn.ReLU()))
    net.add_module("head", nn.Linear(48, CLASSES))
    return net


@pytest.fixture(scope="module")
def found() -> tuple[api.FoundIssues, Tensor, Tensor]:
    x, labels, truth = noisy_blobs()
    # a map-style data set as it is: wrapped, a tenth kept to score the soup; the head by
    # default, the net's last nn.Linear (it has no `classifier`)
    result = lipt.find_label_issues(make_net, TensorDataset(x, labels), jigsaw={"local_epochs": 5})
    return result, labels, truth


def test_the_flags_are_ranked_and_say_what_was_given_and_suggested(found):
    result, labels, _ = found
    heads = result.soup.learner_heads  # the default head is the net's last nn.Linear, "head"
    assert heads is not None and heads.weight.shape[1:] == (CLASSES, 48)
    n_pool = round(0.9 * N)
    assert result.pool.shape == (n_pool,) and bool((result.pool.diff() > 0).all())
    assert result.embeddings.shape == (n_pool, 48) and result.probs.shape == (n_pool, CLASSES)
    assert torch.allclose(result.probs.sum(1), torch.ones(n_pool), atol=1e-5)
    assert torch.equal(result.labels, labels[result.pool])
    assert len(result) > 0 and len(torch.unique(result.indices)) == len(result)
    assert bool(torch.isin(result.indices, result.pool).all())  # the pool only
    rows = torch.searchsorted(result.pool, result.indices)
    assert torch.equal(result.given, labels[result.indices])
    assert torch.equal(result.suggested, result.probs[rows].argmax(1))
    assert torch.equal(result.score, result.probs[rows, result.given])
    assert bool((result.score.diff() >= 0).all())  # most likely wrong first
    assert result.seconds["total"] >= result.seconds["jigsaw"] > 0


def test_the_flags_find_the_labels_made_wrong(found):
    result, labels, truth = found
    wrong = labels != truth
    hits = int(wrong[result.indices].sum())
    # 10% of the labels are wrong: flags at random would be right 10% of the time
    assert hits / len(result) > 0.7
    assert hits / int(wrong[result.pool].sum()) > 0.8
    # where a wrong label is flagged, the suggestion is mostly its true class
    caught = result.indices[wrong[result.indices]]
    suggested = result.suggested[wrong[result.indices]]
    assert float((suggested == truth[caught]).float().mean()) > 0.8


def test_datalab_reports_the_copies_the_far_items_and_the_finders_label_issues(found):
    result, _, _ = found
    report = lipt.datalab_report(result)
    assert list(report.issues.columns) == [
        "index",
        "issue_type",
        "score",
        "given",
        "suggested",
        "near_duplicates",
    ]
    # the label issues are the finder's: the same confident-learning decision on the same probs
    assert set(report.flagged("label").tolist()) == set(result.indices.tolist())
    pool = set(result.pool.tolist())
    duplicates = set(report.flagged("near_duplicate").tolist())
    pairs = [(i, i - 1480) for i in COPIES if {i, i - 1480} <= pool]
    assert len(pairs) >= 6 and all({i, j} <= duplicates for i, j in pairs)
    rows = report.issues[report.issues["issue_type"] == "near_duplicate"]
    sets = dict(zip(rows["index"], rows["near_duplicates"], strict=True))
    assert all(str(j) in sets[i].split() for i, j in pairs)  # each names its copy
    outliers = set(report.flagged("outlier").tolist())
    far = [i for i in FAR if i in pool]
    assert len(outliers & set(far)) >= len(far) - 1
    counts = {kind: report.summary[kind]["flagged"] for kind in ("label", "outlier")}
    assert counts == {"label": len(result), "outlier": len(outliers)}
    scores = rows["score"].to_numpy()
    assert bool((np.diff(scores) >= 0).all())  # most severe first


def test_a_report_refuses_an_issue_type_datalab_was_not_asked_for(found):
    """`flagged("near_duplicates")` (the csv's column, not the type) or a type left out of
    `issue_types` gave an empty tensor: no duplicates, whatever the data."""
    result, _, _ = found
    report = lipt.datalab_report(result, issue_types=("label", "near_duplicate"))
    assert set(report.flagged("label").tolist()) == set(result.indices.tolist())
    assert len(report.flagged("near_duplicate")) >= 12  # the copies and their originals
    for kind in ("near_duplicates", "outlier"):
        with pytest.raises(
            ValueError,
            match=rf"^Datalab was not asked for '{kind}', so it flagged none: one of "
            r"\['label', 'near_duplicate'\], or ask for it [^\n]*$",
        ):
            report.flagged(kind)


class Unlabelled(Dataset):
    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> Tensor:
        return torch.zeros(DIM)


class NegativeLabelAt7(Dataset):
    """Labels read item by item: the first is fine, item 7's is not a class."""

    def __len__(self) -> int:
        return 600

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return torch.zeros(DIM), -1 if i == 7 else i % CLASSES


def few_of_class_5() -> TensorDataset:
    y = torch.arange(600) % 5  # classes 0..4, then 2 items of class 5
    y[:2] = 5
    return TensorDataset(torch.randn(600, DIM), y)


def out_of_range() -> TensorDataset:
    y = torch.arange(600) % CLASSES
    y[:50] = 9
    return TensorDataset(torch.randn(600, DIM), y)


def not_finite_at(*positions: int) -> TensorDataset:
    """600 labelled items, those at `positions` with a NaN (the first) or an inf input."""
    x = torch.randn(600, DIM)
    x[positions[0], 3] = float("nan")
    x[list(positions[1:]), 0] = float("inf")
    return TensorDataset(x, torch.arange(600) % CLASSES)


def one_output_net() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 16), nn.ReLU(), nn.Linear(16, 1))


def six_classes() -> TensorDataset:
    return TensorDataset(torch.randn(600, DIM), torch.arange(600) % CLASSES)


def refuse(dataset: Dataset, **kwargs) -> None:
    factory = kwargs.pop("factory", make_net)
    kwargs.setdefault("jigsaw", {"num_learners": 4})  # 4 x 128 items of the pool of 540
    lipt.find_label_issues(factory, dataset, head=kwargs.pop("head", "head"), **kwargs)


@pytest.mark.parametrize(
    ("data", "kwargs", "words"),
    [
        (Unlabelled(), {}, r"data\[0\] is a Tensor, not an \(input, label\) pair"),
        (out_of_range(), {}, r"label 9 is out of range: .*6 classes.* 0\.\.5"),
        (NegativeLabelAt7(), {}, r"label -1 is out of range"),
        (few_of_class_5(), {}, r"class 5 has [12] item\(s\) in the pool, fewer than folds=5"),
        (few_of_class_5(), {"folds": 1}, r"folds must be an integer >= 2"),
        (out_of_range(), {"jigsaw": {"epochs": 3}}, r"unknown jigsaw option 'epochs'"),
        (out_of_range(), {"filter_by": "nope"}, r"unknown filter_by 'nope'"),
        (out_of_range(), {"head": "body"}, r"not an nn\.Linear"),
        (
            not_finite_at(431, 77, 599),
            {},
            r"data's inputs are not finite \(NaN or inf\) in 3 item\(s\): 77, 431, 599; ",
        ),
        (few_of_class_5(), {"weight_decay": "a"}, r"weight_decay must be a number >= 0"),
        (
            six_classes(),
            {"jigsaw": {"num_learners": 1000}},
            r"1000 x 1 minibatch\(es\) of 128 = 128000 .* pool has 540: lower "
            r"jigsaw\['num_learners'\] or jigsaw\['batches_per_learner'\]",
        ),
        (
            six_classes(),
            {"jigsaw": {"local_epochs": 0}},
            r"jigsaw\['local_epochs'\] must be an integer >= 1, got 0",
        ),
        (
            few_of_class_5(),
            {"factory": one_output_net, "head": None},
            r"the model's head '2' has 1 output: it must give a logit per class",
        ),
        (
            six_classes(),
            {"jigsaw": {"num_learners": 4, "prune": "omp"}},
            r"^jigsaw\['prune'\] must be an instance of lipt\.jigsaw\.parts' prune classes "
            r"\(MagnitudePruning\(\"omp\", 0\.85, 0\.95\), [^\n]* not 'omp'$",
        ),
        (
            six_classes(),
            {"jigsaw": {"num_learners": 4, "augment": "randaugment"}},
            r"^jigsaw\['augment'\] must be an instance of lipt\.jigsaw\.parts' augment classes "
            r"\(NoAugment\(\), RandAugment\(\)\) or None for the default, not 'randaugment'$",
        ),
    ],
    ids=[
        "no-labels",
        "label-above-the-heads-classes",
        "negative-label",
        "fewer-per-class-than-folds",
        "one-fold",
        "unknown-jigsaw-option",
        "unknown-filter",
        "head-not-linear",
        "non-finite-inputs",
        "weight-decay-not-a-number",
        "pool-too-small-for-the-jigsaw-learners",
        "jigsaw-count-below-one",
        "one-output-head",
        "prune-by-name",
        "augment-by-name",
    ],
)
def test_bad_input_is_refused_in_one_line_before_any_work(data, kwargs, words, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the jigsaw stage ran before the input was checked")

    monkeypatch.setattr(api, "jigsaw_pretrain", no_work)
    with pytest.raises(ValueError, match="^[^\n]*" + words + "[^\n]*$"):
        refuse(data, **kwargs)


class ReachedJigsawError(Exception):
    """The jigsaw stage was reached: every check before it passed."""


def reach_jigsaw(*args, **kwargs):
    raise ReachedJigsawError(kwargs.get("head"))


class Tagged(nn.Module):
    """A `classifier` that is not the last nn.Linear registered: the default head is it."""

    def __init__(self) -> None:
        super().__init__()
        self.classifier = nn.Linear(16, CLASSES)
        self.body = nn.Sequential(nn.Linear(DIM, 16), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.body(x))


@pytest.mark.parametrize(
    ("factory", "name"),
    [(make_net, "head"), (Tagged, "classifier"), (lambda: nn.Linear(DIM, CLASSES), None)],
    ids=["last-linear", "model-classifier", "the-model-is-its-head"],
)
def test_the_head_defaults_to_model_classifier_else_the_last_linear(factory, name, monkeypatch):
    """As docs/API.md says; it was "classifier" always, so that examples' own nets (no
    `classifier`) failed with "the model has no submodule 'classifier'"."""
    monkeypatch.setattr(api, "jigsaw_pretrain", reach_jigsaw)
    x, labels, _ = noisy_blobs()
    if name is None:  # the learners' heads are read by name: a bare nn.Linear has none
        with pytest.raises(ValueError, match=r"^the model is itself an nn\.Linear: wrap it"):
            lipt.find_label_issues(factory, TensorDataset(x, labels))
        return
    with pytest.raises(ReachedJigsawError) as reached:
        lipt.find_label_issues(factory, TensorDataset(x, labels))
    assert reached.value.args == (name,)  # the jigsaw stage is given the head by name


class CosineHead(nn.Module):
    """A head that is no nn.Linear (scaled cosine similarity): its last nn.Linear, the default
    head, is a hidden layer of 48 outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(DIM, 48), nn.ReLU())
        self.prototypes = nn.Parameter(torch.randn(CLASSES, 48))

    def forward(self, x: Tensor) -> Tensor:
        h = F.normalize(self.body(x), dim=1)
        return 10 * h @ F.normalize(self.prototypes, dim=1).t()


class LogitsAndEmbedding(nn.Module):
    """A forward returning (logits, embedding): lipt.select reads it, the learners cannot."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(DIM, 48), nn.ReLU())
        self.classifier = nn.Linear(48, CLASSES)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = self.body(x)
        return self.classifier(h), h


@pytest.mark.parametrize(
    ("factory", "words"),
    [
        (
            CosineHead,
            r"^factory\(\)'s model returns \(2, 6\) for a batch of 2, but its head 'body\.0' has "
            r"48 outputs: the head must be the model's final nn\.Linear, [^\n]*head=$",
        ),
        (
            LogitsAndEmbedding,
            r"^factory\(\)'s model returns a tuple: the jigsaw learners train its output with "
            r"cross-entropy, so its forward must return the logits \[batch, 6\]$",
        ),
        (
            lambda: make_net().double(),
            r"^factory\(\)'s model fails on the data's inputs \(RuntimeError: mat1 and mat2 must "
            r"have the same dtype[^\n]*\(\(2, 24\), torch\.float32\), its weights of their dtype$",
        ),
    ],
    ids=["last-linear-not-the-head", "forward-returns-a-tuple", "weights-of-another-dtype"],
)
def test_a_model_the_learners_cannot_train_is_refused_before_any_learner(
    factory, words, monkeypatch
):
    """Each trained every learner to a failure ("no jigsaw learner is left to merge: all 10
    ... failed") or, the cosine head, judged the labels on the hidden layer as 48 classes and
    its input as the embedding, without a word."""
    import lipt.jigsaw.api

    def no_learner(*args, **kwargs):
        raise AssertionError("a learner trained before the model was checked")

    monkeypatch.setattr(lipt.jigsaw.api, "train_learner", no_learner)
    x, labels, _ = noisy_blobs()
    with pytest.raises(ValueError, match=words):
        lipt.find_label_issues(factory, TensorDataset(x, labels), jigsaw={"local_epochs": 5})


def test_jigsaw_pretrain_refuses_a_part_by_name_before_any_learner(monkeypatch):
    """merge="uniform" ended in an AttributeError traceback ('str' object has no attribute
    'bn_batches'); prune="omp" or augment="none" failed every learner, then "no jigsaw learner
    is left to merge"."""
    import lipt.jigsaw.api

    def no_learner(*args, **kwargs):
        raise AssertionError("a learner trained before the parts were checked")

    monkeypatch.setattr(lipt.jigsaw.api, "train_learner", no_learner)
    x, labels, _ = noisy_blobs()
    dm = lipt.PoolDataModule(TensorDataset(x, labels), val_size=0.1, batch_size=32)
    for key, name in (("merge", "uniform"), ("prune", "omp"), ("augment", "none")):
        with pytest.raises(
            ValueError,
            match=rf"^{key} must be an instance of lipt\.jigsaw\.parts' {key} classes "
            rf"\([^\n]*\) or None for the default, not '{name}'$",
        ):
            lipt.jigsaw_pretrain(make_net, dm, num_learners=4, **{key: name})


def test_int32_labels_flag_what_int64_labels_flag(found):
    """Labels from numpy are often int32: every learner failed on them ("expected target dtype
    to be Long or Byte, but got Int"), and the run ended with no learner to merge."""
    result, labels, _ = found
    x, _, _ = noisy_blobs()
    again = lipt.find_label_issues(
        make_net, TensorDataset(x, labels.int()), jigsaw={"local_epochs": 5}
    )
    assert again.soup.counts["learners_merged"] == result.soup.counts["learners_merged"]
    assert torch.equal(again.indices, result.indices) and torch.equal(again.probs, result.probs)
    assert again.given.dtype == torch.int64


def test_a_target_transform_labels_the_pool_as_it_labels_the_items(tmp_path, monkeypatch):
    """torchvision's ImageFolder keeps the folder labels in `.targets` and maps each item's
    through `target_transform`: here 3 folders, 2 classes (insects, mammals)."""
    from PIL import Image
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    for name in ("ant", "bee", "cow"):
        (tmp_path / name).mkdir()
        for i in range(10):
            Image.new("RGB", (8, 8), (20 * i, 0, 0)).save(tmp_path / name / f"{i}.png")
    to_tensor = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    insect_or_mammal = lambda y: int(y == 2)  # noqa: E731
    dataset = ImageFolder(str(tmp_path), to_tensor, target_transform=insect_or_mammal)
    dm = lipt.PoolDataModule(dataset, val_size=6, batch_size=4)
    items = torch.tensor([dataset[i][1] for i in range(len(dataset))])
    assert sorted(set(dataset.targets)) == [0, 1, 2]  # what the data set holds
    assert torch.equal(dm.labels(), items)
    # a two-class head takes these labels: the finder's checks pass, its jigsaw stage starts
    monkeypatch.setattr(api, "jigsaw_pretrain", reach_jigsaw)

    def net() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(192, 2))

    with pytest.raises(ReachedJigsawError):
        lipt.find_label_issues(net, dm, head="1", folds=2, jigsaw={"num_learners": 2})


def test_lipts_own_data_module_is_set_up_when_it_is_not(monkeypatch):
    from functools import partial

    from lipt.data import DataModule
    from lipt.data.sources import make_synthetic

    dm = DataModule(
        partial(make_synthetic, 300, 50, 4, 1, 8, 0),
        4,
        1,
        8,
        [0.5],
        [0.25],
        val_size=50,
        batch_size=32,
    )
    monkeypatch.setattr(api, "jigsaw_pretrain", reach_jigsaw)

    def net() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 4))

    with pytest.raises(ReachedJigsawError):
        lipt.find_label_issues(net, dm, head="1", jigsaw={"num_learners": 4})
    assert len(dm.pool_indices) == 250


def test_lipts_randaugment_on_a_pool_data_module_is_refused_in_one_line():
    """Not taken for every learner failing: the learners stop at the first one's shard."""
    from lipt.core.errors import UserError
    from lipt.jigsaw.parts import RandAugment

    x, labels, _ = noisy_blobs()
    dm = lipt.PoolDataModule(TensorDataset(x, labels), val_size=100, batch_size=32)
    with pytest.raises(UserError, match=r"^lipt's RandAugment is for its own image data sets; "):
        lipt.jigsaw_pretrain(make_net, dm, head="head", num_learners=4, augment=RandAugment())


class Items(Dataset):
    """`x` and `labels` read item by item: a data set whose inputs are only known by reading."""

    def __init__(self, x: Tensor, labels: Tensor) -> None:
        self.x, self.labels = x, labels

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return self.x[i], int(self.labels[i])


def test_a_nan_item_no_learner_read_is_named_before_the_probe(monkeypatch):
    """A NaN item outside every learner's shard passed the jigsaw stage and made the probe's
    L-BFGS fail ("value cannot be converted to type float without overflow"). Where the data
    set does not hold its inputs, the soup's embeddings are checked right after the pass."""
    from lipt.cleaning import issues
    from lipt.jigsaw.learner import learner_shards
    from lipt.jigsaw.parts import JigsawSettings

    def no_fit(*args, **kwargs):
        raise AssertionError("the probe was fitted on a NaN embedding")

    x, labels, _ = noisy_blobs()
    dm = lipt.PoolDataModule(Items(x, labels), val_size=0.1, batch_size=32)
    shards = learner_shards(JigsawSettings(num_learners=4, local_epochs=2), dm, 0)
    unread = dm.pool_indices[~torch.isin(dm.pool_indices, torch.cat(shards))]
    bad = int(unread[len(unread) // 2])
    x[bad, 5] = float("nan")
    monkeypatch.setattr(issues, "fit_softmax_regression", no_fit)
    with pytest.raises(
        ValueError,
        match=rf"^the soup's embeddings are not finite \(NaN or inf\) "
        rf"in 1 item\(s\): {bad}; fix or drop those items[^\n]*$",
    ):
        lipt.find_label_issues(make_net, dm, jigsaw={"num_learners": 4, "local_epochs": 2})


@pytest.mark.parametrize(
    ("issue_types", "words"),
    [
        ("label", r"not the str 'label': write issue_types=\('label',\)"),
        ((), r"issue_types must name at least one issue type"),
        (["label", 3], r"issue_types must name at least one issue type, each a str"),
    ],
    ids=["a-str", "none", "not-a-name"],
)
def test_datalab_report_refuses_issue_types_it_would_misread_before_datalab_runs(
    found, issue_types, words, monkeypatch
):
    """A str was read letter by letter ("Invalid issue type: l"), none ended in pandas' "No
    objects to concatenate"."""
    import cleanlab

    def no_datalab(*args, **kwargs):
        raise AssertionError("Datalab ran")

    monkeypatch.setattr(cleanlab, "Datalab", no_datalab)
    result, _, _ = found
    with pytest.raises(ValueError, match="^[^\n]*" + words + "[^\n]*$"):
        lipt.datalab_report(result, issue_types=issue_types)


# --------------------------------------------------------------------------- against the stage


def read_csv(path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def idx_dir(tmp_path):
    """Fashion-MNIST's IDX files: 1,000 train images of 10 classes, 100 test."""
    root = tmp_path / "fmnist"
    root.mkdir()
    rng = np.random.default_rng(5)
    for prefix, n in (("train", 1000), ("t10k", 100)):
        labels = rng.integers(0, 10, n)
        write_idx(
            root / f"{prefix}-images-idx3-ubyte.gz", class_images(labels, 1, 28, seed=n)[:, 0]
        )
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return root


@pytest.mark.slow
def test_the_api_flags_what_select_py_clean_lipt_flags(make_cfg, tmp_path, idx_dir):
    from lipt.run.config import validate
    from lipt.stages import select as select_stage
    from lipt.stages.build import build_datamodule, build_model, build_part

    overrides = [
        f"dataset.data_dir={idx_dir}",
        "dataset.val_size=100",
        "dataset.label_noise.rate=0.3",
        "trainer.accelerator=cpu",
        "model.width=8",
        "batch_size=32",
        "logger=none",
        "trainer.enable_progress_bar=false",
        "pretrain.num_learners=4",
        "pretrain.local_epochs=3",
        "selector=random",
        "clean=lipt",
        "clean.datalab=true",
    ]
    run = validate(make_cfg(overrides, "select"))
    summary = select_stage.run(run)
    rows = read_csv(tmp_path / "label_issues.csv")
    assert len(rows) > 20

    # The API on the same data, the run's model and jigsaw parts, the same seed.
    seed = run.settings.seed
    jigsaw = {
        "num_learners": 4,
        "local_epochs": 3,
        **{part: build_part(run.node(part)) for part in ("augment", "prune", "merge")},
    }
    dm = build_datamodule(run)
    found = lipt.find_label_issues(
        lambda: build_model(run, seed), dm, jigsaw=jigsaw, seed=seed, head="classifier"
    )
    assert found.indices.tolist() == [int(r["index"]) for r in rows]  # the same, in order
    assert found.suggested.tolist() == [int(r["suggested"]) for r in rows]
    assert found.score.tolist() == pytest.approx([float(r["score"]) for r in rows], abs=1e-6)
    assert found.soup.samples == summary["stages"]["pretrain"]["samples"] == 4 * 3 * 32

    # clean.datalab: Datalab on the run's embeddings and probabilities, as datalab_report
    flagged = read_csv(tmp_path / "datalab_issues.csv")
    report = lipt.datalab_report(found)
    assert [(int(r["index"]), r["issue_type"]) for r in flagged] == list(
        zip(report.issues["index"].tolist(), report.issues["issue_type"].tolist(), strict=True)
    )
    saved = json.loads((tmp_path / "datalab_summary.json").read_text())
    assert saved["issue_types"] == report.summary
    assert summary["stages"]["clean"]["datalab"]["label"] == len(rows)
    assert {r["issue_type"] for r in flagged} <= {"label", "outlier", "near_duplicate"}
