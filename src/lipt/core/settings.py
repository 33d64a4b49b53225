"""lipt's own settings that no `_target_` takes, declared with their types and bounds: the top
level of train.yaml, `dataset.*`, the run-time options of `model.*` and a selector's lipt keys.
lipt.stages.run.Run holds them for the stages, built once from the composed config.

A group option's other keys are the parameters of its `_target_` and are declared there
(lipt.core.schema). Building a settings object checks every field (`Checked`), so a bad value is
refused when the settings are built, before any stage, by lipt.run.config and by any code that
builds them itself. No torch, no omegaconf.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Annotated, Any, ClassVar, Literal

# pydantic reads typing's own TypedDict from Python 3.12 only
from typing_extensions import Required, TypedDict

from lipt.core.bounds import BELOW_ONE, COUNT, NON_NEGATIVE, POSITIVE, SEED, SHARE, Interval
from lipt.core.errors import UserError
from lipt.core.schema import check_mapping, fields_of


class Checked:
    """A dataclass whose fields are checked against their annotations when it is built; errors
    name the key as the config spells it (`PREFIX.field`)."""

    PREFIX: ClassVar[str] = ""

    def __post_init__(self) -> None:
        declared = self.keys()
        values = {name: getattr(self, name) for name in declared}
        check_mapping(self.PREFIX, values, declared, open_keys=False)

    @classmethod
    def keys(cls) -> dict[str, Any]:
        """Each field's annotation, by name."""
        return dict(_field_types(cls))  # type: ignore[arg-type]


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """Each field's annotation, Required where the field has no default: a config that leaves
    it out is refused by name (lipt.core.schema), not by the constructor's TypeError."""
    declared = fields_of(cls)
    assert declared is not None, cls  # a Checked subclass is a dataclass
    required = {f.name for f in fields(cls) if f.default is f.default_factory is MISSING}
    return {k: Required[v] if k in required else v for k, v in declared.items()}


class LearnerOptim(TypedDict, total=False):
    """A jigsaw learner's optimiser settings (`pretrain.optim.*`): main training's `optimizer`
    at this learning rate and weight decay, on this schedule over the learner's steps."""

    lr: Annotated[float, POSITIVE]
    weight_decay: Annotated[float, NON_NEGATIVE]
    scheduler: Literal["cosine", "linear", "constant"]


class Protocol(TypedDict, total=False):
    """An experiment's settings per approach (configs/experiment), by approach name."""

    reselect_every: dict[str, Annotated[int, NON_NEGATIVE]]
    fraction: dict[str, Annotated[float, SHARE]]
    warmup_epochs: dict[str, Annotated[int, COUNT]]  # pretrain=full's epochs


class LabelNoise(TypedDict):
    """`dataset.label_noise`: make `rate` of the training split's labels wrong (lipt.data.noise);
    `pairs`: each class's confusable class for kind=pairs (null: the next class)."""

    rate: Annotated[float, BELOW_ONE]  # 0: the labels as the data set has them
    kind: Literal["symmetric", "pairs"]
    seed: Annotated[int, SEED]
    pairs: list[Annotated[int, NON_NEGATIVE]] | None


class PathsSettings(TypedDict):
    output_dir: str  # the run folder (Hydra's, by default)


@dataclass(frozen=True)
class RunSettings(Checked):
    """The top level of train.yaml (select.yaml and pretrain.yaml extend it)."""

    stage: Literal["train", "select", "pretrain"]
    seed: Annotated[int, SEED]
    fraction: Annotated[float, SHARE]
    reselect_every: Annotated[int, NON_NEGATIVE]
    subset_path: str | None
    init_from: Literal["init", "pretrained"]
    ckpt_path: str | None
    record_seen: bool
    batch_size: Annotated[int, Interval(ge=1, le=10**7)]
    paths: PathsSettings
    dry_run: bool = False
    # hparams_search: the summary number the task returns to the sweeper (validation only)
    optimized_metric: Literal["val_accuracy"] | None = None
    # An experiment's approach (configs/approach) and its per-approach protocol, which
    # `fraction` and `reselect_every` read by interpolation.
    approach: str | None = None
    protocol: Protocol | None = None


@dataclass(frozen=True)
class DatasetSettings(Checked):
    """`dataset.*`: what lipt.data.DataModule and the reader (`dataset.load`) need."""

    PREFIX: ClassVar[str] = "dataset"
    # The label and the reader's keys (`load` interpolates them): not the data module's.
    READER_KEYS: ClassVar[tuple[str, ...]] = (
        "name",
        "data_dir",
        "download",
        "resize",
        "num_train",
        "num_test",
    )

    @classmethod
    def module_node(cls, node: Mapping[str, Any]) -> dict[str, Any]:
        """The `dataset` node as its data module (`_target_`) takes it: less the reader's keys."""
        return {k: v for k, v in node.items() if k not in cls.READER_KEYS}

    name: str
    num_classes: Annotated[int, Interval(ge=2, le=10**6)]
    channels: Annotated[int, Interval(ge=1, le=64)]
    image_size: Annotated[int, Interval(ge=1, le=4096)]
    mean: list[Annotated[float, Interval(ge=0, le=1)]]
    std: list[Annotated[float, Interval(gt=0, le=1e3)]]
    # a count of rows, or a share of the pool below 1
    val_size: Annotated[int, NON_NEGATIVE] | Annotated[float, Interval(ge=0, lt=1)]
    split_seed: Annotated[int, SEED]
    crop_padding: Annotated[int, Interval(ge=0, le=4096)]
    flip: bool
    load: dict[str, Any]  # the reader's node: checked against its _target_'s parameters
    # lipt.data.DataModule's defaults, so that a data set's config file of one's own may leave
    # them out
    data_dir: str | None = None
    num_workers: Annotated[int, Interval(ge=0, le=1024)] = 0
    resident: bool = True
    eval_batch_size: Annotated[int, Interval(ge=1, le=10**7)] = 256
    download: bool = False  # fetch the files into data_dir when they are not there
    resize: Annotated[int, COUNT] | None = None  # ImageFolder: the shorter side before cropping
    num_train: Annotated[int, COUNT] | None = None  # synthetic data: rows of each split
    num_test: Annotated[int, COUNT] | None = None
    pool_size: Annotated[int, COUNT] | None = None  # keep this many pool rows (smoke runs)
    label_noise: LabelNoise | None = None  # wrong labels made on purpose (lipt.data.noise)
    train_labels: str | None = None  # a .npy of the training split's labels, replacing its own


@dataclass(frozen=True)
class ModelOptions(Checked):
    """How the model runs, beside its constructor's arguments (`model.*`)."""

    PREFIX: ClassVar[str] = "model"

    channels_last: bool = False  # NHWC weights (faster convolutions on CUDA, esp. bf16)
    compile: bool = False  # torch.compile the forward pass


# The `model` keys for how the model runs, not constructor arguments: no weight is theirs.
MODEL_RUN_KEYS = frozenset(ModelOptions.keys())


def matches_validation(selector: str, target: Any) -> bool:
    """Whether a selector's target is the validation split: GLISTER, and GradMatch with
    target="val" (each needs one: the pool would silently stand in for it)."""
    return selector == "glister" or (selector == "gradmatch" and target == "val")


@dataclass(frozen=True)
class SelectorSettings(Checked):
    """A selector option's lipt keys (`selector.*`), beside its function's parameters, and what
    the run needs to know of the selector: elsewhere `name` is only a label (messages, subset
    files, reports)."""

    PREFIX: ClassVar[str] = "selector"

    name: str
    balance: bool = False  # per-class budgets (lipt.selection.select_balanced)
    needs_model: bool = True  # False: ranks without a model (random)
    repeats: Annotated[int, Interval(ge=1, le=1000)] = 1  # seeds' models whose ranks average
    # it matches the validation split (GLISTER; GradMatch target=val): no config key
    needs_held_out: bool = field(default=False, kw_only=True)

    @classmethod
    def keys(cls) -> dict[str, Any]:
        return {k: v for k, v in super().keys().items() if k != "needs_held_out"}

    @classmethod
    def of(cls, node: Mapping[str, Any] | None) -> SelectorSettings | None:
        """The settings of a `selector` node (composed, or resolved to plain values); None for
        selector=none, which selects nothing (its node has no `_target_`)."""
        if node is None or "_target_" not in node:
            return None
        name = node.get("name")
        held_out = matches_validation(str(name), node.get("target"))
        declared = cls.keys()
        own = {k: v for k, v in node.items() if k in declared}
        try:
            check_mapping(cls.PREFIX, own, declared, open_keys=False)  # a key left out: named
            return cls(**own, needs_held_out=held_out)
        except UserError as e:
            raise UserError(f"selector={name}: {e}" if name is not None else str(e)) from e


@dataclass(frozen=True)
class TrainerOptions(Checked):
    """Lightning Trainer arguments whose range lipt narrows: its schedules span max_epochs, so
    Lightning's -1 (endless) and 0 have no meaning here. The rest are the Trainer's own."""

    PREFIX: ClassVar[str] = "trainer"

    max_epochs: Annotated[int, Interval(ge=1, le=10**7)] = 1
    # Lightning takes 0 and below and fails on them mid-fit (a modulo by 0), or, for a negative
    # accumulation, trains a schedule of one step
    accumulate_grad_batches: Annotated[int, Interval(ge=1, le=10**6)] = 1
    check_val_every_n_epoch: Annotated[int, Interval(ge=1, le=10**7)] | None = 1


@dataclass(frozen=True)
class OptimizerOptions(Checked):
    """Ranges lipt narrows for the `optimizer` group's keys, where the optimiser has them:
    torch takes a learning rate of 0, which trains nothing."""

    PREFIX: ClassVar[str] = "optimizer"

    lr: Annotated[float, POSITIVE] = 0.1
    momentum: Annotated[float, BELOW_ONE] = 0.0
    weight_decay: Annotated[float, NON_NEGATIVE] = 0.0
