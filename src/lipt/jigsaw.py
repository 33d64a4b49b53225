"""LiPT's jigsaw pre-training: independent weak learners merged into one model soup.

Ro et al., "Lowering the Pre-training Tax for Gradient-based Subset Training" (ICML 2023,
https://proceedings.mlr.press/v202/ro23a.html), sections 3.2-3.3. From ONE common initial model
(the seeded init), learner i

1. gets its own shard of M minibatches of B samples, disjoint from every other learner's
   (lipt.shards: one seeded permutation of the pool, cut into n pieces);
2. trains a copy of the init on it for K passes in its own Lightning ``Trainer(devices=1)``, with
   RandAugment (group ``augment``) and the SGD settings of ``pretrain.optim``;
3. is pruned once, at its own density drawn from U[low, high] (group ``prune``, lipt.pruning).

Learners never communicate. The soup (group ``merge``, lipt.soup) is scored by held-out accuracy
on the validation split carved from the training set, never the test set.

Everything random about learner i is a function of (seed, i) alone (`derive_seed`), never of the
global RNG state left by earlier learners, so a learner trained by a job of a multirun
(`run_learner_job`, one process per job) equals the one trained in-process (`pretrain_jigsaw`),
and `merge_learner_dir` (called by lipt.soup_callback when the sweep ends) makes the same soup.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import random
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lipt import console
from lipt.artifacts import load_checkpoint, save_checkpoint, write_json
from lipt.build import (
    build_classifier,
    build_datamodule,
    build_model,
    quiet_trainer,
    run_dir,
    state_dict_cpu,
)
from lipt.data import DataModule, IndexedImages
from lipt.errors import UserError
from lipt.pretrain import Pretrained, checkpoint_payload
from lipt.pruning import draw_density, prune_model
from lipt.selection.types import LearnerHeads
from lipt.shards import make_shards, shard_for_learner
from lipt.soup import (
    RUNNING_MEAN,
    SoupResult,
    StateDict,
    alpha_grid,
    greedy_interp_soup,
    greedy_soup,
    is_finite_state_dict,
    recompute_batchnorm_stats,
    uniform_soup,
)
from lipt.summary import summary_payload

__all__ = [
    "HeldOut",
    "Learner",
    "derive_seed",
    "learner_shard",
    "learner_shards",
    "load_learners",
    "merge_learner_dir",
    "merge_learners",
    "merge_saved",
    "pretrain_jigsaw",
    "run_learner_job",
    "train_learner",
]

log = logging.getLogger(__name__)

LEARNERS_DIR = "learners"
# Held-out images are kept in memory between evaluations below this size (Fashion-MNIST's 5000:
# 16 MB); a larger split (ImageNet) is streamed through the loader on every evaluation.
MAX_CACHED_EVAL_BYTES = 1 << 30


# --------------------------------------------------------------------------- seeds and threads


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 32-bit seed that depends on (seed, keys) alone: the same in every process and job
    (hashlib, not the salted built-in hash), and independent across keys."""
    text = ":".join(str(k) for k in (int(seed), *keys))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def generator(seed: int, *keys: int | str) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, *keys))


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed Python, NumPy and torch (CPU and CUDA) for the block, then restore their states, so
    a learner's shuffling and augmentation do not depend on what ran before it."""
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count()))
    with torch.random.fork_rng(devices=devices):
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with `count` intra-op threads (None: unchanged). CPU float results depend
    on the thread count, so fixing it makes multirun and in-process learners bit-identical."""
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(count))
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Ten learners would print Lightning's device banner and data-loader hints ten times."""
    names = ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda")
    with console.loggers_at(logging.WARNING, *names), warnings.catch_warnings():
        # Expected for a learner (few workers, no val loader) and Lightning-internal.
        for message in ("does not have many workers", "no `val_dataloader`", "treespec"):
            warnings.filterwarnings("ignore", message=f".*{message}.*")
        yield


def state_digest(state_dict: StateDict) -> str:
    """sha256 of a state dict's names and bytes: learners must all start from this one init."""
    h = hashlib.sha256()
    for key, value in state_dict.items():
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- shards


def check_learner_ids(cfg: DictConfig) -> list[int] | None:
    """`pretrain.learners` as a list of ids (None: all learners, in-process)."""
    value = cfg.pretrain.get("learners")
    if value is None:
        return None
    ids = [int(value)] if isinstance(value, int) else [int(v) for v in value]
    n = int(cfg.pretrain.num_learners)
    if not ids or any(not 0 <= i < n for i in ids) or len(set(ids)) != len(ids):
        raise UserError(
            f"pretrain.learners={ids} is invalid: give distinct ids in 0..{n - 1} "
            "(or null for all learners)"
        )
    return ids


def _shard_sizes(cfg: DictConfig, dm: DataModule) -> tuple[int, int, int, int]:
    return (
        len(dm.pool_indices),
        int(cfg.pretrain.num_learners),
        int(cfg.pretrain.batches_per_learner),
        dm.batch_size,
    )


def learner_shards(cfg: DictConfig, dm: DataModule, seed: int) -> list[Tensor]:
    """Every learner's shard, as positions in the original training split."""
    try:
        shards = make_shards(*_shard_sizes(cfg, dm), generator=generator(seed, "shards"))
    except ValueError as e:
        raise UserError(str(e)) from e
    return [dm.pool_indices[s] for s in shards]


def learner_shard(cfg: DictConfig, dm: DataModule, seed: int, learner: int) -> Tensor:
    """Learner `learner`'s shard alone (a multirun job reads only this): equal to
    ``learner_shards(cfg, dm, seed)[learner]``."""
    try:
        shard = shard_for_learner(
            *_shard_sizes(cfg, dm), learner, generator=generator(seed, "shards")
        )
    except ValueError as e:
        raise UserError(str(e)) from e
    return dm.pool_indices[shard]


# --------------------------------------------------------------------------- one learner


@dataclass
class Learner:
    """One jigsaw learner: its shard, its pruned weights and what it cost.

    status: "ok" (an ingredient), "diverged" (non-finite weights), "failed" (training raised) or
    "missing" (a multirun job wrote no readable checkpoint). Only "ok" learners are merged.
    """

    id: int
    shard: Tensor  # positions in the original training split
    state_dict: StateDict | None = None
    init_digest: str = ""
    density: float = 1.0
    samples: int = 0  # forward+backward samples: K*M*B, plus one batch for SNIP
    seconds: float = 0.0
    status: str = "ok"
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "density": None if self.state_dict is None else round(self.density, 6),
            "nonzero_prunable": self.nonzero_prunable,
            "samples": self.samples,
            "unique_samples": len(self.shard),
            "seconds": round(self.seconds, 3),
            "error": self.error,
        }

    @property
    def nonzero_prunable(self) -> int | None:
        """Non-zero conv/linear weights (rank >= 2 tensors named *weight) after pruning."""
        if self.state_dict is None:
            return None
        return sum(
            int(torch.count_nonzero(t))
            for key, t in self.state_dict.items()
            if key.endswith("weight") and t.ndim >= 2
        )


def learner_optim(cfg: DictConfig) -> dict[str, Any]:
    settings = OmegaConf.to_container(cfg.pretrain.optim, resolve=True)
    assert isinstance(settings, dict)
    return {str(k): v for k, v in settings.items()}


def randaugment_settings(cfg: DictConfig) -> dict[str, Any] | None:
    node = cfg.get("augment")
    if node is None or node.name == "none":
        return None
    settings = OmegaConf.to_container(node, resolve=True)
    assert isinstance(settings, dict)
    return {str(k): v for k, v in settings.items() if k != "name"}


class NonFiniteLossError(RuntimeError):
    """A learner's training loss became NaN or infinite: it stops there and is left out."""


class StopOnNonFiniteLoss(L.Callback):
    """Stop a learner at its first non-finite loss instead of training on to NaN weights."""

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if isinstance(loss, Tensor) and not bool(torch.isfinite(loss).all()):
            raise NonFiniteLossError(f"loss {float(loss)} at step {trainer.global_step}")


def train_learner(
    cfg: DictConfig, dm: DataModule, init: nn.Module, seed: int, learner: int, shard: Tensor
) -> Learner:
    """Train a copy of `init` on `shard` for K passes, then prune it. A learner that raises is
    returned with status "failed" (and a warning); one whose loss or weights go non-finite as
    "diverged" (it stops at the first non-finite loss)."""
    start = time.perf_counter()
    model = copy.deepcopy(init)
    result = Learner(id=learner, shard=shard, init_digest=state_digest(model.state_dict()))
    module = build_classifier(cfg, model, **learner_optim(cfg))
    try:
        with seeded(derive_seed(seed, "learner", learner)), quiet_lightning():
            trainer = quiet_trainer(
                cfg,
                max_epochs=int(cfg.pretrain.local_epochs),
                callbacks=[StopOnNonFiniteLoss()],
            )
            loader = dm.shard_dataloader(shard, randaugment_settings(cfg))
            trainer.fit(module, train_dataloaders=loader)
        result.samples = module.samples_seen
        result.density, extra = _prune(cfg, dm, model, seed, learner, shard)
        result.samples += extra
    except UserError:
        raise  # a config problem: every learner would hit it
    except NonFiniteLossError as e:  # kept (its checkpoint says so): a re-run would diverge again
        result.status, result.error = "diverged", f"non-finite loss ({e})"
        result.samples = module.samples_seen
        result.state_dict = state_dict_cpu(model)
        result.seconds = time.perf_counter() - start
        log.warning("jigsaw learner %d diverged (%s) and is left out", learner, result.error)
        return result
    except Exception as e:  # a learner that breaks is left out of the soup, not the whole stage
        result.status, result.error = "failed", f"{type(e).__name__}: {e}"
        result.samples = module.samples_seen
        log.warning("jigsaw learner %d failed and is left out: %s", learner, result.error)
        result.seconds = time.perf_counter() - start
        return result
    result.state_dict = state_dict_cpu(model)
    if not is_finite_state_dict(result.state_dict):
        result.status, result.error = "diverged", "non-finite weights"
        log.warning("jigsaw learner %d diverged (non-finite weights) and is left out", learner)
    result.seconds = time.perf_counter() - start
    return result


def _prune(
    cfg: DictConfig, dm: DataModule, model: nn.Module, seed: int, learner: int, shard: Tensor
) -> tuple[float, int]:
    """Prune `model` in place at the learner's own density; returns (density, samples that
    went forward and backward for it: SNIP's one batch)."""
    node = cfg.prune
    if node.name == "none":
        return 1.0, 0
    # Its own generators: the density and a random mask do not depend on how training went.
    density = draw_density(
        node.density_low, node.density_high, generator=generator(seed, "density", learner)
    )
    batch = None
    if node.name == "snip":
        # The learner's first minibatch, un-augmented: the data it owns, as it is.
        first = IndexedImages(dm.train_source, shard[: dm.batch_size], dm.eval_transform())
        x, y, _ = next(iter(dm.loader(first, shuffle=False, batch_size=dm.batch_size)))
        batch = (x, y)
        model.train()  # the loss the learner trained on (BatchNorm on batch statistics)
    prune_model(model, node.name, density, generator=generator(seed, "prune", learner), batch=batch)
    return density, 0 if batch is None else len(batch[1])


# --------------------------------------------------------------------------- held-out score


def merge_device(cfg: DictConfig) -> torch.device:
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


class HeldOut:
    """Held-out accuracy of a state dict: top-1 on the validation split (or a seeded subset of
    `merge.eval_size` of it), after re-estimating BatchNorm statistics on a few un-augmented
    batches of the learners' shards when `merge.recompute_bn` (so every candidate is scored as
    the model that will be used). Counts its calls and forward passes for the report."""

    def __init__(
        self,
        cfg: DictConfig,
        dm: DataModule,
        template: nn.Module,
        seed: int,
        bn_positions: Tensor,
    ) -> None:
        self.device = merge_device(cfg)
        self.model = copy.deepcopy(template).to(self.device)
        positions = dm.val_indices
        if len(positions) == 0:
            raise UserError(
                "the jigsaw soup is scored on the validation split, which is empty: set "
                "dataset.val_size > 0"
            )
        size = cfg.merge.get("eval_size")
        if size is not None and int(size) < len(positions):
            pick = torch.randperm(len(positions), generator=generator(seed, "eval"))[: int(size)]
            positions = positions[pick].sort().values
        self.size = len(positions)
        val = IndexedImages(dm.train_source, positions, dm.eval_transform())
        self.loader: DataLoader | None = dm.loader(val, shuffle=False)
        self.cached: list[tuple[Tensor, Tensor]] | None = None
        if self.size * dm.channels * dm.image_size**2 * 4 <= MAX_CACHED_EVAL_BYTES:
            self.cached = [(x, y) for x, y, _ in self.loader]
            self.loader = None  # (and its workers, if any)
        self.bn_batches: list[Tensor] = []
        if cfg.merge.recompute_bn:
            calib = IndexedImages(dm.train_source, bn_positions, dm.eval_transform())
            loader = dm.loader(calib, shuffle=False, batch_size=dm.batch_size)
            self.bn_batches = [x for x, _, _ in loader]
        self.calls = 0
        self.forward_samples = 0
        # Scores of state dicts already evaluated (by id; the caller keeps them alive): a
        # learner scored when it finishes is not scored again by the soup.
        self.known: dict[int, float] = {}

    def prepare(self, model: nn.Module) -> None:
        """Recompute BatchNorm statistics of `model` in place (no-op when off)."""
        if self.bn_batches:
            recompute_batchnorm_stats(model, self.bn_batches)
            self.forward_samples += sum(len(x) for x in self.bn_batches)

    @torch.no_grad()
    def accuracy(self, model: nn.Module) -> float:
        was_training = model.training
        model.eval()
        correct = 0
        if self.cached is not None:
            batches: Iterable[tuple[Tensor, Tensor]] = self.cached
        else:
            assert self.loader is not None
            batches = ((x, y) for x, y, _ in self.loader)
        for x, y in batches:
            logits = model(x.to(self.device))
            correct += int((logits.argmax(dim=1).cpu() == y).sum())
        model.train(was_training)
        self.forward_samples += self.size
        return correct / self.size

    def __call__(self, state_dict: StateDict) -> float:
        if id(state_dict) in self.known:
            return self.known.pop(id(state_dict))
        self.calls += 1
        self.model.load_state_dict(state_dict)
        self.prepare(self.model)
        return self.accuracy(self.model)

    def score_learner(self, learner: Learner) -> float | None:
        """A finished learner's held-out accuracy (None when it is left out), kept for the
        soup's first look at it: the same number, computed once."""
        if learner.status != "ok" or learner.state_dict is None:
            return None
        score = self(learner.state_dict)
        self.known[id(learner.state_dict)] = score
        return score


def bn_positions(cfg: DictConfig, dm: DataModule, seed: int) -> Tensor:
    """`merge.bn_batches` minibatches drawn (seeded) from the union of ALL learners' shards:
    data already sent out, so the soup reads nothing new, and the same set whichever learners
    survive, so the in-process and multirun paths agree."""
    union = torch.cat(learner_shards(cfg, dm, seed))
    count = min(len(union), int(cfg.merge.bn_batches) * dm.batch_size)
    return union[torch.randperm(len(union), generator=generator(seed, "bn"))[:count]]


# --------------------------------------------------------------------------- the soup


def ratio_grid(value: Any) -> Sequence[float] | str:
    """`merge.ratios`: an int S gives alpha_grid(S), a list the ratios, "running_mean" as is."""
    if isinstance(value, str):
        if value != RUNNING_MEAN:
            raise UserError(
                f"merge.ratios={value!r} is invalid: use an int, a list or running_mean"
            )
        return RUNNING_MEAN
    if isinstance(value, int) and not isinstance(value, bool):
        return alpha_grid(value)
    return [float(r) for r in value]


def expected_evaluations(cfg: DictConfig, n: int) -> int:
    """Held-out evaluations a soup of `n` ingredients makes (for the progress bar)."""
    name, later = cfg.merge.name, max(n - 1, 0)
    if name == "greedy_interp":
        grid = ratio_grid(cfg.merge.ratios)
        return n + later * (1 if isinstance(grid, str) else len(grid))
    return n + (1 if name == "uniform" else later)


def make_soup(
    cfg: DictConfig, states: Sequence[StateDict], evaluate: Callable[[StateDict], float]
) -> SoupResult:
    name = cfg.merge.name
    if name == "uniform":
        return uniform_soup(states, evaluate)
    if name == "greedy":
        return greedy_soup(states, evaluate)
    if name == "greedy_interp":
        grid = ratio_grid(cfg.merge.ratios)
        return greedy_interp_soup(states, evaluate, grid)  # type: ignore[arg-type]
    raise UserError(f"merge.name={name!r} is unknown; use merge=uniform, greedy or greedy_interp")


def merge_learners(
    cfg: DictConfig,
    dm: DataModule,
    init: nn.Module,
    seed: int,
    learners: Sequence[Learner],
    evaluate: HeldOut | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Merge the "ok" learners into one dense model (a copy of `init` with the soup's weights);
    the others are left out with a warning. Returns the model and the merge report. `evaluate`:
    the held-out scorer that already scored the learners as they finished (else made here).

    Raises:
        UserError: no learner is left, or learners started from different initial weights.
    """
    start = time.perf_counter()
    for bad in (le for le in learners if le.status != "ok"):
        log.warning("jigsaw learner %d is left out of the soup (%s)", bad.id, bad.error)
    usable = [le for le in learners if le.status == "ok"]
    if not usable:
        reasons = "; ".join(f"learner {le.id}: {le.status} ({le.error})" for le in learners[:3])
        raise UserError(
            f"no jigsaw learner is left to merge: all {len(learners)} diverged, failed or are "
            f"missing ({reasons}); lower pretrain.optim.lr or re-run the missing learner jobs"
        )
    needed = min_learners(cfg)
    if len(usable) < needed:
        left_out = ", ".join(
            f"{status} {ids}" for status, ids in learner_ids_by_status(learners).items() if ids
        )
        raise UserError(
            f"only {len(usable)} of {len(learners)} jigsaw learners are usable ({left_out}), "
            f"fewer than pretrain.min_learners={needed}; re-run the same command (it trains only "
            "the missing learners), lower pretrain.optim.lr, or lower pretrain.min_learners"
        )
    digest = state_digest(init.state_dict())
    strangers = [le.id for le in usable if le.init_digest != digest]
    if strangers:
        raise UserError(
            f"jigsaw learners {strangers} did not start from this run's initial model (seed "
            f"{seed}); a soup needs one common init: re-train them with the same seed and model"
        )
    if evaluate is None:
        evaluate = HeldOut(cfg, dm, init, seed, bn_positions(cfg, dm, seed))
    init_accuracy = evaluate(init.state_dict())
    total = expected_evaluations(cfg, len(usable))
    with console.progress("merging: candidates", total) as step:
        best = -1.0

        def scored(state_dict: StateDict) -> float:
            nonlocal best
            score = evaluate(state_dict)
            best = max(best, score)
            step(info=f"held-out best {best:.3f}")
            return score

        soup = make_soup(cfg, [le.state_dict for le in usable], scored)  # type: ignore[misc]
    model = copy.deepcopy(init)
    model.load_state_dict(soup.state_dict)
    evaluate.prepare(model)  # the same statistics the soup was scored with
    report = merge_report(cfg, dm, seed, learners, usable, soup, evaluate)
    report["init_accuracy"] = init_accuracy
    report["merge_seconds"] = round(time.perf_counter() - start, 3)
    return model, report


def min_learners(cfg: DictConfig) -> int:
    """`pretrain.min_learners`, by default half of the learners (rounded up)."""
    value = cfg.pretrain.get("min_learners")
    return int(value) if value is not None else -(-int(cfg.pretrain.num_learners) // 2)


def learner_ids_by_status(learners: Sequence[Learner]) -> dict[str, list[int]]:
    """Ids of the learners left out of the soup, by why: missing, diverged, failed."""
    return {
        status: [le.id for le in learners if le.status == status]
        for status in ("missing", "diverged", "failed")
    }


def learner_counts(learners: Sequence[Learner]) -> dict[str, int]:
    """For summary.json's stages.pretrain: how many were merged, failed (diverged or raised),
    or are missing (a job that died before writing its checkpoint)."""
    by_status = learner_ids_by_status(learners)
    return {
        "learners_merged": sum(le.status == "ok" for le in learners),
        "learners_failed": len(by_status["diverged"]) + len(by_status["failed"]),
        "learners_missing": len(by_status["missing"]),
    }


def merge_report(
    cfg: DictConfig,
    dm: DataModule,
    seed: int,
    learners: Sequence[Learner],
    usable: Sequence[Learner],
    soup: SoupResult,
    evaluate: HeldOut,
) -> dict[str, Any]:
    """The soup's report with learner ids (not positions among the usable learners)."""
    ids = [le.id for le in usable]
    raw = soup.to_report()
    scores = dict(zip(ids, raw["ingredient_scores"], strict=True))
    per_learner = [{**le.summary(), "accuracy": scores.get(le.id)} for le in learners]
    return {
        "method": raw["method"],
        "seed": seed,
        "num_learners": int(cfg.pretrain.num_learners),
        "batches_per_learner": int(cfg.pretrain.batches_per_learner),
        "local_epochs": int(cfg.pretrain.local_epochs),
        "batch_size": dm.batch_size,
        "augment": str(cfg.augment.name),
        "prune": str(cfg.prune.name),
        "eval_split": "validation",
        "eval_size": evaluate.size,
        "recompute_bn": bool(cfg.merge.recompute_bn),
        "bn_batches": len(evaluate.bn_batches),
        "learners": per_learner,
        "left_out": [le.id for le in learners if le.status != "ok"],
        **learner_ids_by_status(learners),
        "kept": [ids[i] for i in raw["kept"]],
        "ratios": raw["ratios"],
        "weights": raw["weights"],
        "best_learner": ids[raw["best_ingredient"]],
        "best_learner_accuracy": raw["best_ingredient_score"],
        "soup_accuracy": raw["soup_score"],
        "trials": [{**t, "candidate": ids[t["candidate"]]} for t in raw["trials"]],
        "evaluations": evaluate.calls,
        "eval_forward_samples": evaluate.forward_samples,
    }


# --------------------------------------------------------------------------- checkpoints


def recipe(cfg: DictConfig, dm: DataModule, seed: int) -> dict[str, Any]:
    """What makes learners of one soup: a learner checkpoint must match it to be merged."""

    def plain(node: Any) -> Any:
        return OmegaConf.to_container(node, resolve=True) if node is not None else None

    return {
        "data": dm.data_name,
        "pool_size": len(dm.pool_indices),
        "seed": int(seed),
        "model": plain(cfg.model),
        "num_learners": int(cfg.pretrain.num_learners),
        "batches_per_learner": int(cfg.pretrain.batches_per_learner),
        "local_epochs": int(cfg.pretrain.local_epochs),
        "batch_size": dm.batch_size,
        "optim": plain(cfg.pretrain.optim),
        "augment": plain(cfg.get("augment")),
        "prune": plain(cfg.get("prune")),
    }


def learner_file(learner: int) -> str:
    return f"learner_{learner}.ckpt"


def learner_payload(cfg: DictConfig, dm: DataModule, seed: int, learner: Learner) -> dict[str, Any]:
    """A learner checkpoint: tensors and plain values only (torch.load(weights_only=True))."""
    assert learner.state_dict is not None
    return {
        "state_dict": learner.state_dict,
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "data": dm.data_name,
        "num_classes": int(cfg.dataset.num_classes),
        "pretrain": "jigsaw",
        "seed": int(seed),
        "learner": learner.id,
        "status": learner.status,
        "density": float(learner.density),
        "samples": int(learner.samples),
        "seconds": float(learner.seconds),
        "init_digest": learner.init_digest,
        "shard": learner.shard.clone(),
        "recipe": recipe(cfg, dm, seed),
    }


def load_learner(path: Path, learner: int, shard: Tensor, expected: dict[str, Any]) -> Learner:
    """Learner `learner` from its checkpoint; "missing" when absent or unreadable, "diverged"
    when its weights are not finite.

    Raises:
        UserError: the checkpoint was made by another recipe (seed, data, n, M, K, ...).
    """
    if not path.is_file():
        return Learner(learner, shard, status="missing", error=f"no checkpoint at {path}")
    try:
        payload = load_checkpoint(path)
    except UserError as e:
        return Learner(learner, shard, status="missing", error=str(e))
    if payload.get("recipe") != expected or int(payload.get("learner", -1)) != learner:
        got = payload.get("recipe") or {}
        diff = sorted(k for k in expected if got.get(k) != expected[k]) or ["learner"]
        raise UserError(
            f"{path} was trained with other settings ({', '.join(diff)}) than this merge; use "
            "a fresh pretrain.learner_dir or the same overrides as the learner jobs"
        )
    result = Learner(
        id=learner,
        shard=payload["shard"],
        state_dict=payload["state_dict"],
        init_digest=str(payload.get("init_digest", "")),
        density=float(payload.get("density", 1.0)),
        samples=int(payload.get("samples", 0)),
        seconds=float(payload.get("seconds", 0.0)),
    )
    if payload.get("status") == "diverged":
        result.status, result.error = "diverged", f"diverged in training ({path})"
    elif not is_finite_state_dict(payload["state_dict"]):
        result.status, result.error = "diverged", f"non-finite weights in {path}"
    return result


def train_or_reuse(
    cfg: DictConfig,
    dm: DataModule,
    init: nn.Module,
    seed: int,
    learner: int,
    shard: Tensor,
    folder: Path,
) -> Learner:
    """Learner `learner` from its checkpoint in `folder` when an earlier attempt (a killed run,
    a sweep whose other jobs died) finished it with this recipe; else trained now, and its
    checkpoint written at once, so that a run killed later keeps it."""
    path = folder / learner_file(learner)
    if path.is_file():
        try:
            saved = load_learner(path, learner, shard, recipe(cfg, dm, seed))
        except UserError as e:  # another recipe's learner in this folder: replaced, as before
            log.warning("jigsaw learner %d is trained again: %s", learner, e)
            saved = Learner(learner, shard, status="missing")
        if saved.status != "missing":
            log.info("jigsaw learner %d (%s) reused from %s", learner, saved.status, path)
            return saved
    trained = train_learner(cfg, dm, init, seed, learner, shard)
    if trained.state_dict is not None:  # diverged ones too: the merge reports them
        save_checkpoint(path, learner_payload(cfg, dm, seed, trained))
        # (the log file only: the terminal has the learners' bar and the soup's line)
        console.detail.info("jigsaw learner %d (%s) written to %s", learner, trained.status, path)
    return trained


def learner_dir(cfg: DictConfig, shared: bool) -> Path:
    """`pretrain.learner_dir`, else <run dir>/learners; for `shared` (a multirun job training
    some learners) <sweep dir>/learners, the one folder all jobs of the sweep write to."""
    explicit = cfg.pretrain.get("learner_dir")
    if explicit:
        return Path(str(explicit)).expanduser()
    if shared:
        sweep = sweep_dir_of_job()
        if sweep is not None:
            return sweep / LEARNERS_DIR
    return run_dir(cfg) / LEARNERS_DIR


def sweep_dir_of_job() -> Path | None:
    """The sweep dir of the running multirun job, or None outside one. Derived from the job's
    output dir (sweep dir / subdir) rather than by re-resolving hydra.sweep.dir, whose ${now:}
    a remote job would resolve to another time."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    depth = len(Path(str(hc.sweep.subdir)).parts)
    return Path(str(hc.runtime.output_dir)).parents[depth - 1]


# --------------------------------------------------------------------------- entry points


def pretrain_jigsaw(cfg: DictConfig, dm: DataModule, model: nn.Module, seed: int) -> Pretrained:
    """All n learners in this process from the common init `model`, then the soup.

    Returns the soup (a dense copy of `model`), the samples all learners passed forward and
    backward (n*K*M*B, plus SNIP's batches), the n*M*B distinct samples of their shards, the
    merge report, and every learner's checkpoint for pretrain.py to write. With
    `pretrain.merge_from`, merges the learner checkpoints saved there instead of training.
    """
    if check_learner_ids(cfg) is not None:
        raise UserError(
            "pretrain.learners selects learners for the jobs of a `pretrain.py -m` sweep; "
            "drop it (null) to train and merge all learners in this run"
        )
    merge_from = cfg.pretrain.get("merge_from")
    if merge_from:
        return merge_saved(cfg, dm, model, seed, Path(str(merge_from)).expanduser())
    folder = learner_dir(cfg, shared=False)
    if seed != int(cfg.seed):  # selector.repeats: the learners of each seed apart
        folder = folder / f"seed_{seed}"
    with torch_threads(cfg.pretrain.get("num_threads")):
        shards = learner_shards(cfg, dm, seed)
        # Built before training so each learner is scored as it finishes (for the bar and the
        # log); the soup reuses those scores, so the merge computes exactly what it did before.
        evaluate = HeldOut(cfg, dm, model, seed, bn_positions(cfg, dm, seed))
        learners = []
        with console.progress("pre-training: learners", len(shards)) as step:
            for i, shard in enumerate(shards):
                learners.append(train_or_reuse(cfg, dm, model, seed, i, shard, folder))
                score = evaluate.score_learner(learners[-1])
                shown = "left out" if score is None else f"held-out {score:.3f}"
                console.detail.info("learner %d/%d: %s", i + 1, len(shards), shown)
                step(info=f"learner {i}: {shown}")
        soup, report = merge_learners(cfg, dm, model, seed, learners, evaluate)
    return Pretrained(
        model=soup,
        samples=sum(le.samples for le in learners),
        unique_samples=sum(len(le.shard) for le in learners),
        report=report,
        counts=learner_counts(learners),
        checkpoints={
            str(folder / learner_file(le.id)): learner_payload(cfg, dm, seed, le)
            for le in learners
            if le.state_dict is not None
        },
        learner_heads=learner_heads(learners),
    )


def run_learner_job(cfg: DictConfig) -> dict[str, Any]:
    """`pretrain.py pretrain=jigsaw pretrain.learners=<ids>`: one job of a multirun. Trains only
    its learners, reading only their shards, and writes their checkpoints to the shared learner
    dir; lipt.soup_callback merges when the sweep ends. Writes the job's summary.json."""
    start = time.perf_counter()
    ids = check_learner_ids(cfg)
    assert ids is not None
    out = run_dir(cfg)
    dm = build_datamodule(cfg)
    seed = int(cfg.seed)
    init = build_model(cfg, seed)
    folder = learner_dir(cfg, shared=True)
    learners = []
    with torch_threads(cfg.pretrain.get("num_threads")):
        for i in ids:  # a re-run of the sweep trains only the learners it has no checkpoint of
            shard = learner_shard(cfg, dm, seed, i)
            learners.append(train_or_reuse(cfg, dm, init, seed, i, shard, folder))
    stats = {
        "seconds": round(time.perf_counter() - start, 3),
        "samples": sum(le.samples for le in learners),
        "unique_samples": sum(len(le.shard) for le in learners),
        "learners": [le.summary() for le in learners],
        "learner_dir": str(folder),
    }
    summary = summary_payload(cfg, dm, None, None, {"pretrain": stats})
    write_json(out / "summary.json", summary)
    return summary


def load_learners(cfg: DictConfig, dm: DataModule, seed: int, folder: Path) -> list[Learner]:
    """Learners 0..n-1 from their checkpoints in `folder` (see `load_learner`)."""
    expected = recipe(cfg, dm, seed)
    shards = learner_shards(cfg, dm, seed)  # for the report of missing learners
    return [
        load_learner(folder / learner_file(i), i, shards[i], expected) for i in range(len(shards))
    ]


def merge_saved(
    cfg: DictConfig, dm: DataModule, init: nn.Module, seed: int, folder: Path
) -> Pretrained:
    """The soup of the learner checkpoints in `folder`, merged exactly as `pretrain_jigsaw`
    merges; samples and unique samples are those the saved learners recorded."""
    learners = load_learners(cfg, dm, seed, folder)
    missing = learner_ids_by_status(learners)["missing"]
    if missing:
        log.warning(
            "jigsaw learners %s have no checkpoint in %s (their jobs died or did not run); "
            "re-running the same sweep trains only them",
            missing,
            folder,
        )
    with torch_threads(cfg.pretrain.get("num_threads")):
        soup, report = merge_learners(cfg, dm, init, seed, learners)
    present = [le for le in learners if le.status != "missing"]
    report["learner_dir"] = str(folder)
    report["learner_seconds"] = round(sum(le.seconds for le in present), 3)
    return Pretrained(
        model=soup,
        samples=sum(le.samples for le in present),
        unique_samples=sum(len(le.shard) for le in present),
        report=report,
        counts=learner_counts(learners),
        learner_heads=learner_heads(learners),
    )


def learner_heads(learners: Sequence[Learner]) -> LearnerHeads | None:
    """The final linear layers of the usable ("ok") learners, stacked (None: there are none):
    selection applies them to the soup's embeddings for the learners' ensemble."""
    states = [le.state_dict for le in learners if le.status == "ok" and le.state_dict is not None]
    if not states:
        return None
    return LearnerHeads(
        weight=torch.stack([s["classifier.weight"].float() for s in states]),  # [L, C, D]
        bias=torch.stack([s["classifier.bias"].float() for s in states]),  # [L, C]
    )


def merge_learner_dir(
    cfg: DictConfig, folder: Path, out: Path, seconds: float = 0.0
) -> dict[str, Any]:
    """Merge the learner checkpoints in `folder` (written by a multirun's jobs) into the soup
    and write pretrain.ckpt, merge_report.json and summary.json to `out`. `seconds` is the wall
    time of the whole sweep so far (lipt.soup_callback).

    Raises:
        UserError: a checkpoint of another recipe, or no usable learner.
    """
    start = time.perf_counter()
    dm = build_datamodule(cfg)
    seed = int(cfg.seed)
    result = merge_saved(cfg, dm, build_model(cfg, seed), seed, folder)
    save_checkpoint(
        out / "pretrain.ckpt", checkpoint_payload(cfg, dm, result.model, result.learner_heads)
    )
    write_json(out / "merge_report.json", result.report)
    result.seconds = seconds + time.perf_counter() - start
    summary = summary_payload(cfg, dm, None, None, {"pretrain": result.stats()})
    write_json(out / "summary.json", summary)
    return summary
