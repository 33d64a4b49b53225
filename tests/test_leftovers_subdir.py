"""`hydra.sweep.subdir` whose keys do not part the jobs: `s${seed}` in a sweep of `fraction`
(seed not swept) is one folder for every job, each overwriting the one before, as a subdir
without `${...}` is. The check takes each job's overrides (lipt.run.precheck's jobs) and
refuses only where the overrides tell two jobs' folders are the same: never the default
`${hydra.job.num}`, `${hydra.job.override_dirname}`, nor the sweeps the docs run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import DictConfig

import lipt.run.precheck as precheck_module
from lipt.core.errors import UserError
from lipt.run.sweep_settings import check_sweep_subdir

FAST = ["dataset=synthetic", "budget=infobatch", "pretrain=none", "logger=none"]


class Checked(BaseException):
    """Ends a precheck once the sweep's folders are checked (nothing else of it is tested)."""


@pytest.fixture
def sweep_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, object]]:
    """precheck, stopped once it has checked the sweep's folders; the answer: "ok" or the
    refusal."""
    seen: dict[str, object] = {}

    def check(sweep: DictConfig, jobs: list[list[str]]) -> None:
        try:
            check_sweep_subdir(sweep, jobs)
            seen["answer"] = "ok"
        except UserError as e:
            seen["answer"] = str(e)
        raise Checked

    monkeypatch.setattr(precheck_module, "check_sweep_subdir", check)
    yield seen


def _answer(seen: dict[str, object], stage: str, args: list[str]) -> str:
    with pytest.raises(Checked):
        precheck_module.precheck(stage, args, multirun=True)
    return str(seen["answer"])


@pytest.mark.parametrize(
    ("args", "keys"),
    [
        (["fraction=0.1,0.2", "hydra.sweep.subdir=s${seed}"], "fraction"),
        (["fraction=0.1,0.2", "seed=0,1", "hydra.sweep.subdir=s${seed}"], "fraction"),
        (["optimizer.lr=0.1,0.2", "seed=0,1", "hydra.sweep.subdir=${seed}"], "optimizer.lr"),
        # a constant subdir under the default sweep.dir: its ${stage} is every job's
        (["selector=glister,coverage", "hydra.sweep.subdir=same"], "selector"),
        # override_dirname leaves out its exclude_keys
        (
            [
                "fraction=0.1,0.2",
                "hydra.job.config.override_dirname.exclude_keys=[fraction]",
                "hydra.sweep.subdir=${hydra.job.override_dirname}",
            ],
            "fraction",
        ),
    ],
)
def test_a_subdir_that_does_not_name_a_swept_key_is_refused(sweep_check, args, keys):
    answer = _answer(sweep_check, "train", [*FAST, *args])
    subdir = args[-1].split("=", 1)[1]
    assert answer.startswith(f"hydra.sweep.subdir={subdir} (in hydra.sweep.dir="), answer
    assert f"is one folder for jobs that differ only in {keys}, each overwriting" in answer


@pytest.mark.parametrize(
    "args",
    [
        ["fraction=0.1,0.2", "seed=0,1"],  # the default: ${hydra.job.num}
        ["fraction=0.1,0.2", "seed=0,1", "hydra.sweep.subdir=s${seed}_f${fraction}"],
        ["fraction=0.1,0.2", "hydra.sweep.subdir=${hydra.job.override_dirname}"],
        ["fraction=0.1,0.2", "hydra.sweep.subdir=${hydra:job.id}"],
        ["selector=glister,coverage", "hydra.sweep.subdir=${selector.name}"],
        ["selector=glister,coverage", "hydra.sweep.subdir=${hydra:runtime.choices.selector}"],
        ["optimizer.lr=0.1,0.2", "hydra.sweep.subdir=lr${optimizer}"],  # the node holding it
        # sweep.dir holds the rest
        ["optimizer.lr=0.1,0.2", "hydra.sweep.dir=/tmp/s${optimizer.lr}", "hydra.sweep.subdir=."],
        # an approach (a _global_ option) may set the seed: not told from the overrides
        ["+approach=random,infobatch", "hydra.sweep.subdir=s${seed}"],
    ],
)
def test_a_subdir_that_parts_the_jobs_passes(sweep_check, args):
    assert _answer(sweep_check, "train", [*FAST, *args]) == "ok"


@pytest.mark.parametrize(
    ("stage", "args"),
    [
        ("train", ["selector=random,coverage", "seed=0,1,2"]),  # README
        ("train", ["dry_run=true", "selector=glister,coverage", "fraction=0.1,0.2", "seed=0,1,2"]),
        ("train", ["+experiment=frontier_cpu"]),  # ${hydra.job.override_dirname}
        ("train", ["+experiment=frontier_small", "+approach=full_schedule,infobatch"]),
        ("train", ["+experiment=figure3_cpu"]),
        ("pretrain", ["pretrain=jigsaw", "pretrain.learners=range(4)", "hydra/callbacks=soup"]),
        (  # scripts/same_bits.sh
            "train",
            [
                "+experiment=frontier_cpu",
                "+approach=lipt_dynamic,coverage,infobatch,full_schedule",
                "fraction=0.1",
                "seed=0",
                "hydra.sweep.dir=/tmp/same_bits/after",
                "hydra.sweep.subdir=${approach}",
            ],
        ),
    ],
)
def test_the_sweeps_the_docs_run_pass(sweep_check, stage, args):
    assert _answer(sweep_check, stage, args) == "ok"


def test_a_constant_subdir_is_refused_whatever_the_jobs(tmp_path: Path) -> None:
    sweep = DictConfig({"dir": str(tmp_path), "subdir": "same"})
    with pytest.raises(UserError, match="is one folder for all 3 jobs"):
        check_sweep_subdir(sweep, [["seed=0"], ["seed=1"], ["seed=2"]])
    check_sweep_subdir(
        DictConfig({"dir": str(tmp_path), "subdir": "s${seed}"}), [["seed=0"], ["seed=1"]]
    )
