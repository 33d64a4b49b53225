"""The jigsaw learners merged into one soup: held-out scoring, the soup (group `merge`) and its
report.

Ro et al., ICML 2023, https://proceedings.mlr.press/v202/ro23a.html, section 3.2. The soup is
scored by held-out accuracy on the validation split carved from the training set, never the test
set; every candidate is scored after re-estimating its BatchNorm statistics (`merge.recompute_bn`)
on data the learners already own, so the greedy rules compare the models that will be used.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lipt.core import console
from lipt.core.errors import UserError
from lipt.core.seeding import generator
from lipt.data import LearnerData
from lipt.jigsaw.context import PretrainContext, Pretrained
from lipt.jigsaw.learner import Learner, learner_shards, reused_seconds, state_digest
from lipt.jigsaw.parts import JigsawSettings, Merge
from lipt.jigsaw.soup import SoupResult
from lipt.jigsaw.weights import StateDict, recompute_batchnorm_stats
from lipt.selection.gradients import resolve_head
from lipt.selection.types import LearnerHeads

log = logging.getLogger(__name__)

# Held-out images are kept in memory between evaluations below this size (Fashion-MNIST's 5000:
# 16 MB); a larger split (ImageNet) is streamed through the loader on every evaluation.
MAX_CACHED_EVAL_BYTES = 1 << 30


# --------------------------------------------------------------------------- held-out score


class HeldOut:
    """Held-out accuracy of a state dict: top-1 on the validation split (or a seeded subset of
    `merge.eval_size` of it), after re-estimating BatchNorm statistics on a few un-augmented
    batches of the learners' shards when `merge.recompute_bn` (so every candidate is scored as
    the model that will be used). Counts its calls and forward passes for the report."""

    def __init__(
        self,
        merge: Merge,
        device: torch.device,
        dm: LearnerData,
        template: nn.Module,
        seed: int,
        bn_positions: Tensor,
    ) -> None:
        start = time.perf_counter()
        self.device = device
        # Scored in channels_last: on a CPU max-pooling and BatchNorm run several times faster
        # in NHWC (the merge is forward passes only); the soup itself keeps the model's format.
        self.model = copy.deepcopy(template).to(self.device)
        self.model.to(memory_format=torch.channels_last)
        positions = eval_positions(merge.eval_size, dm, seed)
        self.size = len(positions)
        self.loader: Iterable[Any] | None = dm.eval_loader(positions)
        self.cached: list[tuple[Tensor, Tensor]] | None = None
        batches = iter(self.loader)
        x, y, _ = next(batches)  # float32 inputs: what keeping the split costs, item by item
        if self.size * (x[0].numel() * 4) <= MAX_CACHED_EVAL_BYTES:
            self.cached = [(x, y), *((x, y) for x, y, _ in batches)]
            self.loader = None  # (and its workers, if any)
        del batches
        self.bn_batches: list[Tensor] = []
        if merge.recompute_bn:
            loader = dm.eval_loader(bn_positions, dm.batch_size)
            self.bn_batches = [x for x, _, _ in loader]
        # Kept on the scoring device, read once: no copy or loader per evaluation.
        if self.cached is not None:
            self.cached = [(_nhwc(x.to(self.device)), y.to(self.device)) for x, y in self.cached]
        self.bn_batches = [_nhwc(x.to(self.device)) for x in self.bn_batches]
        self.calls = 0
        self.forward_samples = 0
        self.reused = 0
        # Scores by the candidate's content (`weights_digest`): a learner scored when it
        # finishes is not scored again by the soup, nor is a candidate equal to one already
        # scored (alpha = 1 blends the soup into exactly the candidate learner).
        self.known: dict[str, float] = {}
        self.prescored: set[str] = set()  # learners scored as they finished
        # Wall time spent reading the split and scoring (the merge's share of a jigsaw stage,
        # including the learners' scores taken as they finish).
        self.seconds = time.perf_counter() - start

    def prepare(self, model: nn.Module, batches_format: torch.memory_format) -> None:
        """Recompute BatchNorm statistics of `model` in place (no-op when off), its inputs in
        `batches_format`: the scoring model's NHWC, or the soup's own NCHW (cuDNN would switch
        an NCHW model to NHWC kernels given NHWC inputs, changing the statistics' last bits)."""
        if self.bn_batches:
            batches = [
                x.contiguous(memory_format=batches_format) if x.ndim == 4 else x
                for x in self.bn_batches
            ]
            recompute_batchnorm_stats(model, batches)
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
            correct += int((logits.argmax(dim=1) == y.to(self.device)).sum())
        model.train(was_training)
        self.forward_samples += self.size
        return correct / self.size

    def __call__(self, state_dict: StateDict) -> float:
        start = time.perf_counter()
        key = weights_digest(state_dict)
        if key in self.known:
            if key in self.prescored:  # the soup's first look at a learner: no re-use
                self.prescored.discard(key)
            else:
                self.reused += 1
            self.seconds += time.perf_counter() - start
            return self.known[key]
        self.calls += 1
        self.model.load_state_dict(state_dict)
        self.prepare(self.model, torch.channels_last)
        score = self.accuracy(self.model)
        self.known[key] = score
        self.seconds += time.perf_counter() - start
        return score

    def score_learner(self, learner: Learner) -> float | None:
        """A finished learner's held-out accuracy (None when it is left out), kept for the
        soup's first look at it: the same number, computed once."""
        if learner.status != "ok" or learner.state_dict is None:
            return None
        score = self(learner.state_dict)
        self.prescored.add(weights_digest(learner.state_dict))
        return score


def _nhwc(images: Tensor) -> Tensor:
    if images.ndim != 4:  # not images: nothing to reorder
        return images
    return images.contiguous(memory_format=torch.channels_last)  # [B, C, H, W], NHWC strides


def weights_digest(state_dict: StateDict) -> str:
    """sha256 of a state dict's floating tensors (names and bytes): what a held-out score
    depends on. Integer buffers (BatchNorm's `num_batches_tracked`, which a blend takes from
    the soup side) play no part in an eval-mode forward, nor in a re-estimate, which resets
    them. -0.0 counts as 0.0 (`+ 0.0`): a blend at alpha = 1 turns a pruned learner's -0.0
    weights into 0.0, which change no sum, hence no score."""
    return state_digest({k: v + 0.0 for k, v in state_dict.items() if v.is_floating_point()})


def eval_positions(eval_size: int | None, dm: LearnerData, seed: int) -> Tensor:
    """The validation images the soup is scored on: a seeded subset of `eval_size` of the split
    (None: all of it), sorted. A smaller size takes a prefix of the same seeded permutation, so
    the images a larger `eval_size` leaves out are left out by every smaller one too."""
    positions = dm.val_indices
    if len(positions) == 0:
        raise UserError(
            "the jigsaw soup is scored on the validation split, which is empty: set "
            "dataset.val_size > 0"
        )
    if eval_size is not None and int(eval_size) < len(positions):
        pick = torch.randperm(len(positions), generator=generator(seed, "eval"))[: int(eval_size)]
        positions = positions[pick].sort().values
    return positions


def check_shards_held_out(learners: Sequence[Learner], dm: LearnerData) -> None:
    """UserError for learners that trained on rows of the validation split the soup is scored
    on: saved learners (pretrain.merge_from, a pretrain.learner_dir) made under another split,
    which their recipe does not tell apart where the pool's labels read the same (class-sorted
    labels, as an ImageFolder tree's, with the same count of each class held out)."""
    rows = {le.id: int(torch.isin(le.shard, dm.val_indices).sum()) for le in learners}
    held_out = [learner for learner, count in rows.items() if count]
    if not held_out:
        return
    raise UserError(
        f"jigsaw learners {held_out} trained on {sum(rows.values())} rows of this run's "
        "validation split, which the soup is scored on (saved under another "
        "dataset.split_seed or dataset.val_size); merge learners of this split, or train them "
        "again in another pretrain.learner_dir"
    )


def bn_positions(settings: JigsawSettings, merge: Merge, dm: LearnerData, seed: int) -> Tensor:
    """`merge.bn_batches` minibatches drawn (seeded) from the union of ALL learners' shards:
    data already sent out, so the soup reads nothing new, and the same set whichever learners
    survive, so the in-process and multirun paths agree."""
    union = torch.cat(learner_shards(settings, dm, seed))
    count = min(len(union), int(merge.bn_batches) * dm.batch_size)
    return union[torch.randperm(len(union), generator=generator(seed, "bn"))[:count]]


# --------------------------------------------------------------------------- the soup


def merge_learners(
    ctx: PretrainContext,
    settings: JigsawSettings,
    dm: LearnerData,
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
    # Scoring done before this call (the learners, as they finished) is part of the merge.
    scored_before = 0.0 if evaluate is None else evaluate.seconds
    for bad in (le for le in learners if le.status != "ok"):
        log.warning("jigsaw learner %d is left out of the soup (%s)", bad.id, bad.error)
    usable = [le for le in learners if le.status == "ok"]
    if not usable:
        reasons = "; ".join(f"learner {le.id}: {le.status} ({le.error})" for le in learners[:3])
        raise UserError(
            f"no jigsaw learner is left to merge: all {len(learners)} diverged, failed or are "
            f"missing ({reasons}); lower pretrain.optim.lr or re-run the missing learner jobs"
        )
    needed = settings.least_learners()
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
    check_shards_held_out(usable, dm)
    if evaluate is None:
        positions = bn_positions(settings, ctx.merge, dm, seed)
        evaluate = HeldOut(ctx.merge, ctx.device, dm, init, seed, positions)
    init_accuracy = evaluate(init.state_dict())
    total = ctx.merge.evaluations(len(usable))
    with console.progress("merging: candidates", total) as step:
        best = -1.0

        def scored(state_dict: StateDict) -> float:
            nonlocal best
            score = evaluate(state_dict)
            best = max(best, score)
            step(info=f"held-out best {best:.3f}")
            return score

        soup = ctx.merge.soup([le.state_dict for le in usable], scored)  # type: ignore[misc]
    model = copy.deepcopy(init)
    model.load_state_dict(soup.state_dict)
    evaluate.prepare(model, torch.contiguous_format)  # the statistics the soup was scored with
    report = merge_report(ctx, settings, dm, seed, learners, usable, soup, evaluate)
    report["init_accuracy"] = init_accuracy
    report["merge_seconds"] = round(time.perf_counter() - start + scored_before, 3)
    return model, report


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
    ctx: PretrainContext,
    settings: JigsawSettings,
    dm: LearnerData,
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
        "num_learners": int(settings.num_learners),
        "batches_per_learner": int(settings.batches_per_learner),
        "local_epochs": int(settings.local_epochs),
        "batch_size": dm.batch_size,
        "augment": str(ctx.augment.name),
        "prune": str(ctx.prune.name),
        "eval_split": "validation",
        "eval_size": evaluate.size,
        "recompute_bn": bool(ctx.merge.recompute_bn),
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
        "evaluations_reused": evaluate.reused,
        "eval_forward_samples": evaluate.forward_samples,
    }


def learner_heads(learners: Sequence[Learner], head: str = "classifier") -> LearnerHeads | None:
    """The final linear layers of the usable ("ok") learners, stacked (None: there are none):
    selection applies them to the soup's embeddings for the learners' ensemble. `head`: the
    layer's name in the model (`model.get_submodule(head)`)."""
    states = [le.state_dict for le in learners if le.status == "ok" and le.state_dict is not None]
    if not states:
        return None
    weights = [s[f"{head}.weight"].float() for s in states]  # each [C, D]
    # A head without a bias (nn.Linear(..., bias=False)) adds zeros: the same logits.
    biases = [
        s[f"{head}.bias"].float() if f"{head}.bias" in s else w.new_zeros(len(w))
        for s, w in zip(states, weights, strict=True)
    ]
    return LearnerHeads(weight=torch.stack(weights), bias=torch.stack(biases))  # [L, C, D], [L, C]


def head_shards(learners: Sequence[Learner]) -> list[Tensor]:
    """The shards of the learners whose heads `learner_heads` stacks, in the same order."""
    return [le.shard for le in learners if le.status == "ok" and le.state_dict is not None]


def soup_result(
    soup: nn.Module,
    learners: Sequence[Learner],
    report: dict[str, Any],
    head: str | None,
    trained_here: bool,
) -> Pretrained:
    """Stage 1's result from a soup and its learners: the cost of the learners that exist (a
    "missing" one's job never wrote it), their counts and heads. `trained_here`: the learners
    were obtained in this process, trained or reused from an earlier attempt's checkpoints, so
    their seconds are part of this stage's (not when merging saved ones: merge_report.json keeps
    them all the same)."""
    present = [le for le in learners if le.status != "missing"]
    # `head` None: the soup's `classifier`, else its last nn.Linear (a model of the user's)
    layer = resolve_head(soup, head)
    head = next(name for name, module in soup.named_modules() if module is layer)
    report["learner_seconds"] = round(sum(le.seconds for le in present), 3)
    return Pretrained(
        model=soup,
        learner_seconds=report["learner_seconds"] if trained_here else None,
        merge_seconds=report["merge_seconds"],
        reused_seconds=reused_seconds(present),
        samples=sum(le.samples for le in present),
        unique_samples=sum(len(le.shard) for le in present),
        report=report,
        counts=learner_counts(learners),
        learner_heads=learner_heads(learners, head),
        head_shards=head_shards(learners),
    )
