"""Stage 2: rank the training pool with pre-trained gradients and choose a subset.

`choose_subset` wires a pure selector (lipt.selection, chosen by the `selector` config group) to
the ranking models (lipt.stages.pretrain.ranking_models) and the data; `reselection` wires it to
main training's Reselection callback (`reselect_every`). `run` is `select.py`'s body: it loads
`ckpt_path` or pre-trains in-process, then writes subset.npz and summary.json.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, cast

from torch import Tensor, nn

from lipt.budget import subset_rows
from lipt.core import console
from lipt.core.artifacts import check_subset, load_subset, save_subset, write_json
from lipt.core.errors import UserError
from lipt.core.job import run_dir
from lipt.core.seeding import reselect_seed
from lipt.core.settings import SelectorSettings
from lipt.data import DataModule
from lipt.jigsaw.context import Pretrained
from lipt.report.pictures import SUBSET_PICTURE, write_subset_picture
from lipt.selection import LearnerHeads, PoolOutputs, SelectionInputs
from lipt.selection.api import pick, rank_pool
from lipt.selection.reselection import Reselection
from lipt.stages.build import Parts, build_parts
from lipt.stages.clean import clean_pool
from lipt.stages.pretrain import Ranking, ranking_models
from lipt.stages.result_settings import settled
from lipt.stages.results import Selected, with_cleaning
from lipt.stages.run import Run
from lipt.stages.summary import subset_class_counts, summary_payload

log = logging.getLogger(__name__)

SUBSET_FILE = "subset.npz"
# The selecting attempt's stages.pretrain and stages.select, so a resumed run's summary.json
# reports what they cost then (a resume does not run them again).
STAGES_FILE = "stages.json"


def budget_for(run: Run, pool_size: int) -> int:
    fraction = run.settings.fraction
    budget = subset_rows(fraction, pool_size)
    if budget < 1:
        raise UserError(
            f"fraction={fraction} of a pool of {pool_size} selects nothing; raise fraction"
        )
    return budget


def chosen_selector(run: Run) -> SelectorSettings:
    """The chosen selector's settings, where the run selects (lipt.run.config refuses
    selector=none there)."""
    assert run.selector is not None, "a run that selects has a selector"
    return run.selector


def check_held_out(run: Run, dm: DataModule) -> None:
    """A selector that matches the validation split needs validation rows (else its target
    would silently be the pool)."""
    selector = run.selector  # None: budget=lipt's ensemble ranks for no selector
    if selector is not None and selector.needs_held_out and len(dm.val_indices) == 0:
        raise UserError(
            f"selector={selector.name} matches the validation split, which is empty here; "
            "set dataset.val_size > 0"
        )


def choose_subset(
    run: Run,
    parts: Parts,
    models: list[nn.Module],
    seed: int,
    diagnostics: dict[str, int] | None = None,
    learner_heads: LearnerHeads | None = None,
    profile: dict[str, float] | None = None,
) -> tuple[Tensor, Tensor]:
    """Positions in the original training split (ascending) and their float32 weights.

    The selector's diagnostics (fallbacks it took, see `lipt.selection.Selection`) are logged
    and, when `diagnostics` is given, stored in it. `learner_heads` (the jigsaw learners',
    fitting models[0]'s embeddings) go to the selector. When `profile` is given and a model
    ranked the pool, it receives `subset_profile` of the subset (lipt.selection.profile).

    A selector that needs no model (random) never runs `models` over the pool, so random
    online (`selector=random reselect_every=R`) only re-draws."""
    dm, fn = parts.dm, parts.selector  # the selector's function, built with its settings
    check_held_out(run, dm)
    selector = chosen_selector(run)
    assert fn is not None, "build_parts builds the function of a chosen selector"
    pool_size = len(dm.pool_indices)
    budget = budget_for(run, pool_size)
    log.info(describe_selection(selector, budget, pool_size))
    if models and selector.needs_model:
        rows = pool_size * len(models) + len(dm.val_indices)
        with console.progress("selecting: rows scored", rows) as step:
            val = console.counted(dm.val_dataloader(), step) if len(dm.val_indices) else None
            inputs = rank_pool(
                models,
                lambda: console.counted(dm.pool_dataloader(), step),
                val,
                None,
                learner_heads,
            )
    else:
        idx = dm.pool_indices  # labels and positions: a selector that needs no model
        inputs = SelectionInputs(  # no model's outputs to check: zeros of lipt's own
            pool=PoolOutputs.labels_only(dm.train_source.labels[idx], idx, dm.num_classes),
            outputs_checked=True,
        )
    with console.progress(f"selecting: {selector.name} picks", budget) as step:
        picking = console.counting_selector(fn, step)
        subset = pick(inputs, budget, picking, seed, selector.balance, profile is not None)
    if any(subset.diagnostics.values()):
        log.warning("selector=%s fell back: %s", selector.name, subset.diagnostics)
    elif subset.diagnostics:
        log.info("selector=%s diagnostics: %s", selector.name, subset.diagnostics)
    if diagnostics is not None:
        diagnostics.update(subset.diagnostics)
    if profile is not None and subset.profile:
        profile.update(subset.profile)
        log.info(
            "subset profile: model error percentile %.2f, embedding-norm percentile %.2f "
            "(random: 0.50), nearest-pick distance %.2fx a random subset's",
            profile["difficulty_percentile"],
            profile["norm_percentile"],
            profile["coverage_ratio"],
        )
    return subset.indices, subset.weights


def describe_selection(selector: SelectorSettings, budget: int, pool_size: int) -> str:
    """The line that opens selection: how many rows of the pool, by which selector."""
    balanced = " (balanced)" if selector.balance else ""
    return f"selecting {budget:,} of {pool_size:,} with {selector.name}{balanced}"


def subset_meta(run: Run, dm: DataModule) -> dict[str, Any]:
    """What a later run checks before it trusts a subset file: the data, the split, the
    selector's and pre-training's names, and, for a resume that keeps the subset, every key of
    the groups that made it (SUBSET_GROUPS, as `settled` reads them)."""
    return {
        "dataset": dm.data_name,
        "dataset_train_size": len(dm.train_source),
        "val_size": len(dm.val_indices),
        "split_seed": run.dataset.split_seed,
        "selector": chosen_selector(run).name,
        "pretrain": run.pretrain_name,
        "fraction": float(run.settings.fraction),
        "seed": run.settings.seed,
        **cleaning_meta(run),
        **subset_settings(run),
    }


# The groups whose keys make the subset: the selector, and the pre-training that ranks for it.
SUBSET_GROUPS = ("selector", "pretrain", "augment", "prune", "merge")
PRETRAINING_GROUPS = SUBSET_GROUPS[1:]


def subset_settings(run: Run) -> dict[str, Any]:
    """The keys of SUBSET_GROUPS, dotted (selector.balance); what a resume that keeps a subset
    holds against its own, since a subset records no other run's (older subsets have none)."""
    return {
        key: value
        for key, value in settled(run.config).items()
        if "." in key and key.partition(".")[0] in SUBSET_GROUPS
    }


# Keys of the `clean` group that change neither the flagged labels nor what is done with them.
NOT_CLEANING = ("_target_", "name", "datalab")


def cleaning_meta(run: Run) -> dict[str, Any]:
    """The label cleaning the pool had before it was selected from: `clean` (its name) and
    its keys that change the pool, as `clean.<key>`. None for clean=none: a subset file of a
    run without cleaning is as it was (lipt.stages.resume reads none as clean=none)."""
    node = run.node("clean")
    if "_target_" not in node:
        return {}
    keys = sorted(key for key in node if key not in NOT_CLEANING)
    return {"clean": str(node.get("name")), **{f"clean.{key}": node[key] for key in keys}}


def select_subset(
    run: Run, parts: Parts, made: Pretrained | None = None, loaded: Ranking | None = None
) -> Selected:
    """Stage 2 as select.py and train.py run it: the ranking model(s) (`made`: pre-trained in
    this run already, by label cleaning; `loaded`: ckpt_path's, read already), then the subset."""
    check_held_out(run, parts.dm)  # before any pre-training
    needs_model = chosen_selector(run).needs_model
    ranking = loaded or (ranking_models(run, parts, made) if needs_model else Ranking([]))
    start = time.perf_counter()
    diagnostics: dict[str, int] = {}
    profile: dict[str, float] = {}
    indices, weights = choose_subset(
        run, parts, ranking.models, run.settings.seed, diagnostics, ranking.heads, profile
    )
    return Selected(
        indices=indices,
        weights=weights,
        seconds=time.perf_counter() - start,
        diagnostics=diagnostics,  # fallbacks the selector took (lipt.selection.Selection)
        profile=profile,
        pretrained=ranking.pretrained,
        pretrain_stats=ranking.pretrain_stats,
        loaded_pretrain=ranking.loaded_pretrain,
    )


def reselection(
    run: Run, parts: Parts, out: Path, subset: tuple[Tensor, Tensor] | None
) -> Reselection | None:
    """Re-selection every `reselect_every` epochs with the model being trained, for a subset
    this run selected (None otherwise)."""
    settings = run.settings
    if settings.reselect_every <= 0 or subset is None or settings.subset_path is not None:
        return None

    def choose(module: nn.Module, epoch: int, profile: dict[str, float]) -> tuple[Tensor, Tensor]:
        model = cast(nn.Module, module.model)  # the Classifier's network
        with console.no_bars():  # Lightning's own bar is live during training
            seed = reselect_seed(settings.seed, epoch)
            return choose_subset(run, parts, [model], seed, profile=profile)

    meta = subset_meta(run, parts.dm)
    return Reselection(settings.reselect_every, parts.dm, out_dir=out, meta=meta, choose=choose)


def load_checked_subset(
    dm: DataModule, path: Path, run: Run | None = None
) -> tuple[Tensor, Tensor]:
    """A subset file's indices and weights, refused unless it fits this run's data and split
    (and, given `run`, the `fraction` and `selector` its summary.json will record)."""
    indices, weights, meta = load_subset(path)
    check_subset_fits(dm, path, indices, weights, meta)
    if run is not None:
        check_subset_labels(run, path, meta)
    return indices, weights


def check_subset_labels(run: Run, path: Path, meta: dict[str, Any]) -> None:
    """A saved subset (subset_path) trains as it was selected, whatever `fraction` and
    `selector` say; they label the run (summary.json's config, a sweep's report), so they are
    refused where they are not the subset's (a file that records none is not checked)."""
    recorded = meta.get("fraction")
    fraction = float(run.settings.fraction)
    if isinstance(recorded, int | float) and float(recorded) != fraction:
        recorded = float(recorded)  # printed as typed back: 0.33333333, not :g's 0.333333
        raise UserError(
            f"{path} is a fraction={recorded!r} subset, but this run has fraction={fraction!r}, "
            f"which a saved subset does not change; pass fraction={recorded!r}, or select a "
            f"fraction={fraction!r} subset (select.py fraction={fraction!r})"
        )
    chosen, made_by = run.selector, meta.get("selector")
    if chosen is not None and isinstance(made_by, str) and chosen.name != made_by:
        raise UserError(
            f"{path} was selected by selector={made_by}, but this run has "
            f"selector={chosen.name}, which a saved subset does not run; pass "
            f"selector={made_by} or drop selector"
        )


def check_subset_fits(
    dm: DataModule, path: Path, indices: Tensor, weights: Tensor, meta: dict[str, Any]
) -> None:
    """lipt.core.artifacts.check_subset against this run's data module."""
    expected = {"dataset": dm.data_name, "dataset_train_size": len(dm.train_source)}
    check_subset(path, indices, weights, meta, expected, len(dm.train_source), dm.val_indices)


def write_selection(run: Run, dm: DataModule, out: Path, selected: Selected) -> None:
    """stages.json, subset.npz, the jigsaw merge report of a soup made here, and the subset's
    picture."""
    meta, stages = subset_meta(run, dm), selected.stages()
    if selected.loaded_pretrain is not None:  # ranked by ckpt_path's model, not `pretrain`'s
        meta["pretrain"] = selected.loaded_pretrain
        meta = {  # the keys of `pretrain`'s groups: not what ranked
            k: v
            for k, v in meta.items()
            if "." not in k or k.split(".")[0] not in PRETRAINING_GROUPS
        }
    # stages.json first: a run killed between the two has no subset.npz and selects again.
    write_json(out / STAGES_FILE, stages)
    save_subset(out / SUBSET_FILE, selected.indices, selected.weights, meta)
    if selected.pretrained is not None and selected.pretrained.report:
        write_json(out / "merge_report.json", selected.pretrained.report)
    write_subset_picture(dm, selected.indices, out / SUBSET_PICTURE)


def run(run: Run) -> dict[str, Any]:
    """`select.py`, on the run's typed settings (lipt.run.config.validate builds them):
    subset.npz, merge_report.json (a soup made here) and summary.json."""
    if run.selector is None:
        raise UserError("selector=none selects nothing; choose a selector, e.g. selector=glister")
    out = run_dir(run.folder)
    parts = build_parts(run)
    dm = parts.dm
    # ckpt_path's model is checked against the pool as read, before label cleaning drops rows
    # of it (the pool it was pre-trained on), and before cleaning's work.
    ranks = chosen_selector(run).needs_model
    if run.settings.ckpt_path and not ranks:  # a sweep's baseline beside selectors that rank
        log.warning(f"ckpt_path is not read: selector={run.selector.name} ranks with no model")
    loaded = ranking_models(run, parts) if ranks and run.settings.ckpt_path else None
    cleaned = clean_pool(run, parts, out, resume=False)
    made = None if cleaned is None else cleaned.pretrained
    selected = select_subset(run, parts, made, loaded)
    write_selection(run, dm, out, selected)
    counts = subset_class_counts(dm, selected.indices)
    stages = with_cleaning(selected.stages(), cleaned)
    summary = summary_payload(run, dm, None, len(selected.indices), stages, class_counts=counts)
    write_json(out / "summary.json", summary)
    return summary
