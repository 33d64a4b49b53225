"""Selection for any model and data: `select(model, data, budget)` ranks the pool with the model
(any `nn.Module`, a LightningModule included) and returns a `Subset` of dataset positions and
loss weights. No Lightning, no Hydra: the model runs in eval mode over `(x, y, idx)` batches.

It is the one path of lipt's own selection stage too (lipt.stages.select.choose_subset): the
model's outputs on the pool (`rank_pool`), then the selector (`pick`), whose result is turned
from pool rows into dataset positions, with the subset's profile.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from lipt.core.errors import UserError, one_line
from lipt.core.finite import nonfinite_rows
from lipt.selection.common import Selector, select_balanced
from lipt.selection.contract import checked_selector
from lipt.selection.gradients import index_order, model_outputs, resolve_head
from lipt.selection.profile import subset_profile
from lipt.selection.selectors import check_held_out, needs_model, selector_of
from lipt.selection.types import LearnerHeads, PoolOutputs, SelectionInputs


@dataclass(frozen=True)
class Subset:
    """A selection: `indices` [k] int64, ascending positions in the data set (never in its
    validation split), their float32 loss `weights` [k], the selector's `diagnostics` (the
    fallbacks it took, lipt.selection.Selection) and, when a model ranked the pool, its
    `profile` (lipt.selection.profile: where the subset sits in the model's eyes)."""

    indices: Tensor
    weights: Tensor
    diagnostics: dict[str, int] = field(default_factory=dict)
    profile: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.indices.shape[0])


def budget_of(budget: int | float, pool_size: int) -> int:
    """A count of rows: an int as it is, a float in (0, 1] as that share of the pool, rounded.

    Raises:
        ValueError: a budget that selects nothing or more than the pool.
    """
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise ValueError(f"budget must be a count or a share of the pool, not {budget!r}")
    # numpy's integers and floats are counts and shares as Python's are
    budget = int(budget) if isinstance(budget, numbers.Integral) else float(budget)
    if isinstance(budget, float) and not 0.0 < budget <= 1.0:  # NaN too, before round() of it
        raise ValueError(f"a budget share must be in (0, 1], got {budget}")
    count = round(budget * pool_size) if isinstance(budget, float) else budget
    if not 1 <= count <= pool_size:
        raise ValueError(
            f"budget {budget!r} selects {count} of a pool of {pool_size}; give 1..{pool_size} "
            "rows or a share in (0, 1] that selects at least one"
        )
    return int(count)


def rank_pool(
    models: Sequence[nn.Module],
    pool: Callable[[], Iterable[Any]],
    val: Iterable[Any] | None = None,
    head: nn.Linear | str | None = None,
    learner_heads: LearnerHeads | None = None,
    device: torch.device | str | None = None,
) -> SelectionInputs:
    """What the selectors see: each model's outputs on the pool (`pool()` makes a fresh loader
    of (x, y, idx) batches for each), the first model's on `val` batches, the first model's
    final linear layer (`head`, lipt.selection.gradients.resolve_head) and the jigsaw learners'
    heads."""
    if not models:
        raise ValueError("rank_pool needs at least one model")
    if device is None:
        param = next(models[0].parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
    pools = [model_outputs(m, pool(), device, head) for m in models]
    val_outputs = None if val is None else model_outputs(models[0], val, device, head)
    linear = resolve_head(models[0], head)
    for i, outputs in enumerate(pools):
        check_outputs(outputs, "the pool" if i == 0 else f"the pool (model {i})")
    if val_outputs is not None:
        check_outputs(val_outputs, "the validation split")
    return SelectionInputs(
        pool=pools[0],
        val=val_outputs,
        extra_pools=tuple(pools[1:]),
        classifier_weight=linear.weight.detach().float().cpu(),
        classifier_bias=None if linear.bias is None else linear.bias.detach().float().cpu(),
        learner_heads=learner_heads,
        outputs_checked=True,
    )


def check_outputs(outputs: PoolOutputs, where: str) -> None:
    """Refuse what no selector can rank: a label outside the head's classes (it would index
    another class's logit, or none) and a logit or embedding that is NaN or infinite (a
    selector would pick by it silently, or never finish).

    Raises:
        UserError: naming the first such dataset index and how many there are.
    """
    classes = outputs.num_classes
    bad = (outputs.targets < 0) | (outputs.targets >= classes)  # [N]
    if bool(bad.any()):
        first = int(torch.nonzero(bad)[0, 0])
        raise UserError(
            f"{where} has {int(bad.sum())} label(s) outside the head's {classes} classes "
            f"(dataset index {int(outputs.indices[first])}: label "
            f"{int(outputs.targets[first])}); give the head one output per class "
            f"(labels 0..{classes - 1})"
        )
    # [K] rows, ascending, chunk by chunk: no [N, D] mask of a large pool's embeddings
    rows = torch.cat([nonfinite_rows(outputs.logits), nonfinite_rows(outputs.embeddings)]).unique()
    if len(rows):
        first = int(rows[0])
        raise UserError(
            f"the model's outputs on {where} are NaN or infinite for {len(rows)} "
            f"item(s) (dataset index {int(outputs.indices[first])} first): no selector can "
            "rank them; check those inputs and the model (a diverged training, an overflow "
            "in low precision)"
        )


def labels_of_pool(pool: Iterable[Any]) -> PoolOutputs:
    """The pool as a labels-only selector (random) sees it: labels and positions, read from
    (x, y, idx) batches without any model.

    Raises:
        ValueError: no batch, or a dataset index that comes twice (a row must not be selected
            twice, nor the pool look larger than it is); UserError: a negative label.
    """
    targets, indices = [], []
    for batch in pool:
        targets.append(torch.as_tensor(batch[1]).long().cpu())
        indices.append(torch.as_tensor(batch[2]).long().cpu())
    if not indices:
        raise ValueError("the pool is empty")
    order, idx_sorted = index_order(torch.cat(indices))
    labels = torch.cat(targets)[order]
    if bool((labels < 0).any()):  # -1, "unlabelled" in some data sets, is no class
        first = int(torch.nonzero(labels < 0)[0, 0])
        raise UserError(
            f"the pool has {int((labels < 0).sum())} negative label(s) (dataset index "
            f"{int(idx_sorted[first])}: label {int(labels[first])}): give every item a class "
            "index >= 0, or leave the unlabelled items out of the data set"
        )
    return PoolOutputs.labels_only(labels, idx_sorted, int(labels.max()) + 1)


def pick(
    inputs: SelectionInputs,
    budget: int,
    selector: Selector,
    seed: int = 0,
    balance: bool = False,
    profile: bool = True,
) -> Subset:
    """Run `selector` (per class with `balance`) on `inputs` with a generator seeded by `seed`;
    rows become dataset positions, ascending. With `profile` and a model's embeddings, the
    subset's profile against a random subset drawn from the same seed, and its seconds."""
    generator = torch.Generator().manual_seed(seed)
    selector = checked_selector(selector)  # a user's own too: one line for a wrong output
    if balance:
        selection = select_balanced(selector, inputs, budget, generator=generator)
    else:
        selection = selector(inputs, budget, generator=generator)
    assert len(selection.rows) == budget and len(torch.unique(selection.rows)) == budget
    where: dict[str, float] = {}
    if profile and inputs.pool.embeddings.shape[1] > 0:
        start = time.perf_counter()
        reference = torch.Generator().manual_seed(seed)  # the random subset beside it
        where.update(subset_profile(inputs.pool, selection.rows, reference))
        where["seconds"] = round(time.perf_counter() - start, 3)
    # Rows are positions in the pool; a subset speaks positions in the data set.
    indices = inputs.pool.indices[selection.rows]
    order = torch.argsort(indices)
    weights = selection.weights[order].float()
    return Subset(indices[order], weights, dict(selection.diagnostics), where)


def pool_batches(data: Any) -> Callable[[], Iterable[Any]]:
    """A maker of fresh pool loaders: `data.pool_dataloader` (lipt's data modules), or a
    re-iterable of (x, y, idx) batches (a DataLoader, a list)."""
    maker = getattr(data, "pool_dataloader", None)
    if callable(maker):
        return lambda: maker()
    if isinstance(data, Iterable) and not isinstance(data, Iterator):
        return lambda: data
    raise ValueError(
        "data must be a lipt data module (PoolDataModule) or a re-iterable of (x, y, idx) "
        f"batches (a DataLoader, a list), not {type(data).__name__}"
    )


def pool_size_of(data: Any, batches: Callable[[], Iterable[Any]]) -> int:
    """The pool's rows: a data module's pool, else the batches' dataset indices.

    Raises:
        ValueError: a batch that is not (x, y, idx) (a loader of the data set's own (x, y)
            items, say), read before any model runs.
    """
    indices = getattr(data, "pool_indices", None)
    if isinstance(indices, Tensor):
        return len(indices)
    size = 0
    for batch in batches():
        if not isinstance(batch, tuple | list) or len(batch) < 3:
            kind = type(batch).__name__
            shown = f"a {kind} of {len(batch)}" if isinstance(batch, tuple | list) else f"a {kind}"
            raise ValueError(
                f"data's batches must be (x, y, idx), idx the dataset positions, not {shown}: "
                "wrap the data set in lipt.PoolDataModule(dataset) and pass that"
            )
        size += len(batch[2])
    return size


def seed_of(seed: Any) -> int:
    """`seed` as Python's int (a numpy integer too: a seed of a sweep drawn with numpy).

    Raises:
        ValueError: anything but an integer (None, a float, a bool).
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return int(seed)


def check_model_runs(model: nn.Module, batches: Callable[[], Iterable[Any]]) -> None:
    """The model once over the pool's first two inputs, in eval mode, on its parameters'
    device: a forward that fails on the data's inputs (numpy's float64 embeddings for float32
    weights, another width) is a ValueError saying so rather than torch's error mid-pass. The
    RNG (a loader draws a seed) and every submodule's train/eval flag are left as they were.

    Raises:
        ValueError: the forward raises.
    """
    flags = {m: m.training for m in model.modules()}
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        x = torch.as_tensor(next(iter(batches()))[0][:2])
        try:
            model.eval()(x.to(device))
        except Exception as e:
            raise ValueError(
                f"the model fails on the data's inputs ({type(e).__name__}: {one_line(e)}): "
                f"make its forward take a batch of them ({tuple(x.shape)}, {x.dtype}; "
                "numpy's float64 as float32: x.astype(np.float32)), its weights of their dtype"
            ) from e
        finally:
            for module, training in flags.items():
                module.train(training)


def check_learner_heads(learner_heads: Any, head: nn.Linear | None = None) -> None:
    """ValueError unless `learner_heads` is None or the jigsaw learners' heads, of the shape
    of the model's `head` where it is given (heads of another soup's model)."""
    if learner_heads is None:
        return
    if not isinstance(learner_heads, LearnerHeads):
        raise ValueError(
            "learner_heads must be the jigsaw learners' heads, lipt.jigsaw_pretrain(...)"
            f".learner_heads, or None, not a {type(learner_heads).__name__}"
        )
    shape = tuple(learner_heads.weight.shape[1:])
    if head is not None and shape != (head.out_features, head.in_features):
        raise ValueError(
            f"learner_heads are [classes, features] {shape}, the model's head "
            f"{(head.out_features, head.in_features)}: give the heads of this model's soup"
        )


def select(
    model: nn.Module | Sequence[nn.Module] | None,
    data: Any,
    budget: int | float,
    selector: str | Selector = "coverage",
    *,
    head: nn.Linear | str | None = None,
    seed: int = 0,
    balance: bool = False,
    learner_heads: LearnerHeads | None = None,
    val: Iterable[Any] | None = None,
    profile: bool = True,
) -> Subset:
    """Select `budget` rows (a count, or a share in (0, 1]) of the pool of `data` with
    `selector` (a name of `SELECTORS` or a selector function, e.g. a functools.partial of one
    with its knobs), ranked by `model`'s outputs: its logits and the embeddings that enter its
    final linear layer (`head`: that layer or its name; by default `model.classifier` or the
    model's last nn.Linear). Several models: the first ranks, the others are GraNd's repeats.

    `data`: a lipt data module (its `pool_dataloader()`, and `val_dataloader()` when its
    validation split is not empty, unless `val` is given) or an iterable of (x, y, idx) batches.
    `learner_heads`: the jigsaw learners' heads of a soup (lipt.jigsaw_pretrain), which the
    default selector, coverage, ensembles with it. The same `seed` (an integer, a numpy one
    too) gives the same subset.

    Raises:
        ValueError: before any model runs, for a bad budget, seed, selector, head,
            learner_heads or data (batches other than (x, y, idx)), a model that fails on the
            pool's first inputs (another dtype or width), or a selector that matches
            the validation split (GLISTER, GradMatch's target="val") without one; after the
            pass over the pool, for a label outside the head's classes (a negative one for
            `random`, which runs no model) or outputs that are NaN or infinite; and for a
            selector of one's own whose output is no Selection of `budget` distinct pool rows
            with finite weights >= 0 (lipt.selection.contract).
    """
    fn = selector_of(selector)
    seed = seed_of(seed)
    check_learner_heads(learner_heads)
    batches = pool_batches(data)
    budget = budget_of(budget, pool_size_of(data, batches))
    check_held_out(fn, data, val)
    models = [] if model is None else [model] if isinstance(model, nn.Module) else list(model)
    if not needs_model(fn):
        # no model's outputs to check: zeros of lipt's own
        labels_only = SelectionInputs(pool=labels_of_pool(batches()), outputs_checked=True)
        return pick(labels_only, budget, fn, seed, balance)
    if not models:
        raise ValueError("this selector ranks the pool with a model: pass the model")
    # a bad head, or learner heads of another model, fail here, before the pool is scored
    check_learner_heads(learner_heads, resolve_head(models[0], head))
    check_model_runs(models[0], batches)
    if val is None and len(getattr(data, "val_indices", ())) > 0:
        val = data.val_dataloader()
    inputs = rank_pool(models, batches, val, head, learner_heads)
    return pick(inputs, budget, fn, seed, balance, profile)
