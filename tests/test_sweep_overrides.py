"""Sweeps as a user types them: the frontier's jobs as its sweeper makes them (the reference's
own approach among the methods runs once per setting, not once per budget), overrides the
reference job cannot take or that replace what an approach pins, a seed under an Optuna search,
and the report command a sweep's table prints. Each refusal is one line and exit code 2 before
any job starts (lipt.run.precheck)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FAST, run_entry


def refusal(args: list[str], capsys: Any, multirun: bool = True) -> str:
    """precheck's one line for `args` (it must exit 2)."""
    from lipt.run.precheck import precheck

    with pytest.raises(SystemExit) as exit_:
        precheck("train", args, multirun)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    return err.removeprefix("error: ").rstrip("\n")


def frontier_jobs(args: list[str], params: dict[str, str]) -> list[list[str]]:
    """The jobs lipt's frontier sweeper makes of `params` (the experiment's) and `args` (the
    command line's), as Hydra hands them to it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hydra_plugins.lipt_frontier.frontier_sweeper import FrontierSweeper

    lines = [*(f"{k}={v}" for k, v in params.items()), *args]
    overrides = OverridesParser.create().parse_overrides(lines)
    batches = FrontierSweeper().split_arguments(overrides, None)
    return [job for batch in batches for job in batch]


FRONTIER_CPU = {
    "+approach": "full_schedule,coverage",
    "fraction": "0.1,0.2,0.3,0.5",
    "seed": "0,1,2",
}


def test_the_references_own_approach_runs_once_per_setting_not_once_per_budget() -> None:
    """docs/METHODS.md's `+approach=full_data trainer.max_epochs=16,24`, the whole pool's curve
    past the reference: 2 epochs x 3 seeds, where every budget of the sweep ran its copy (24
    jobs more, each a whole-pool run the report counted as another seed)."""
    jobs = frontier_jobs(["+approach=full_data", "trainer.max_epochs=16,24"], FRONTIER_CPU)
    assert sorted(map(sorted, jobs)) == sorted(
        sorted(["+approach=full_data", f"seed={s}", f"trainer.max_epochs={e}"])
        for s in range(3)
        for e in (16, 24)
    )
    # beside other methods, each at every budget, and however the approach is quoted
    jobs = frontier_jobs(["+approach=coverage,'full_data'", "seed=0"], FRONTIER_CPU)
    assert jobs == [
        ["+approach=full_data", "seed=0"],
        *(["+approach=coverage", f"fraction={f}", "seed=0"] for f in (0.1, 0.2, 0.3, 0.5)),
    ]
    # the methods' jobs are as before: the product, the references first
    jobs = frontier_jobs([], FRONTIER_CPU)
    assert len(jobs) == 3 + 2 * 4 * 3
    assert jobs[:3] == [["+approach=full_data", f"seed={s}"] for s in range(3)]


def test_the_precheck_counts_the_jobs_the_sweeper_runs() -> None:
    from lipt.run.precheck import precheck

    args = ["+experiment=frontier_small", "+approach=full_data,random", "trainer.max_epochs=2,3"]
    # 2 references, random at 2 budgets x 2 epochs; full_data's 4 copies at the budgets gone
    assert precheck("train", [*args, "dry_run=true"], multirun=True) == 2 + 4


@pytest.mark.parametrize(
    ("method", "setting"),
    [
        ("+approach=coverage", "selector.class_tilt=0.3"),
        ("+approach=coverage", "pretrain.num_learners=4"),
        ("+approach=infobatch", "budget.epochs=all"),
        ("+approach=coverage", "~selector.class_tilt"),
    ],
)
def test_a_methods_own_setting_names_the_reference_and_how_to_keep_it_off(
    method: str, setting: str, capsys: Any
) -> None:
    """Every job of the frontier takes the overrides outside its point keys, the reference's
    too, whose config lacks a method's keys: Hydra's "Could not override" named only the key
    (which the method has), and pointed at `+key=`, which the method's job refuses."""
    line = refusal(["+experiment=frontier_small", method, setting], capsys)
    key = setting.lstrip("~").split("=")[0]
    assert line.startswith(f"{setting} reaches the frontier's reference job too")
    assert "(+approach=full_data: " in line and f"whose config has no {key};" in line
    fix = f"hydra.sweeper.point_keys=[approach,fraction,{key}]"
    assert line.endswith(f"'{fix}'")
    # the fix it names works: the reference runs without it, the method with it
    from lipt.run.precheck import precheck

    assert precheck("train", ["+experiment=frontier_small", method, setting, fix], True) is None


def test_a_key_the_reference_has_already_is_named_so(capsys: Any) -> None:
    """`+key=` adds a key only where there is none: the reference's budget=full has `steps`,
    and the refusal said its config "has no budget.steps"."""
    args = ["+experiment=frontier_small", "+approach=coverage", "+budget.steps=all"]
    line = refusal(args, capsys)
    assert "whose config already has budget.steps;" in line, line


def test_a_key_no_job_has_is_still_hydras_refusal(capsys: Any) -> None:
    line = refusal(["+experiment=frontier_small", "+approach=coverage", "selector.bogus=1"], capsys)
    assert line.startswith("Could not override 'selector.bogus'")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            [
                "+experiment=frontier_small",
                "+approach=infobatch,full_schedule",
                "budget=full_schedule",
            ],
            "budget=full_schedule replaces the budget that +approach=infobatch pins "
            "(budget=infobatch)",
        ),
        (
            ["+experiment=frontier_small", "+approach=full_schedule_linear", "scheduler=constant"],
            "scheduler=constant replaces the scheduler that +approach=full_schedule_linear pins "
            "(scheduler=linear)",  # pinned by the approach itself, beside full_schedule's
        ),
        (
            ["+experiment=frontier_small", "+approach=coverage,random", "pretrain=none,jigsaw"],
            "pretrain=none replaces the pretrain that +approach=coverage pins (pretrain=jigsaw)",
        ),
        (  # the approach's own choice, but the sweeper hands it to the reference job too
            ["+experiment=frontier_small", "+approach=full_schedule", "budget=full_schedule"],
            "budget=full_schedule replaces the budget that the frontier's reference job "
            "(+approach=full_data), which takes every override but hydra.sweeper.point_keys, "
            "pins (budget=full)",
        ),
    ],
)
def test_a_choice_that_replaces_what_an_approach_pins_is_refused(
    args: list[str], words: str, capsys: Any
) -> None:
    """Hydra's command line wins over an approach's `override /group: option`: the runs would
    train another method and every report would show it under the approach's name."""
    assert refusal(args, capsys).startswith(words)


def test_a_single_run_of_an_approach_with_another_selector_is_refused(capsys: Any) -> None:
    from lipt.run.precheck import precheck

    line = refusal(["+approach=coverage", "selector=random"], capsys, multirun=False)
    assert line.startswith("selector=random replaces the selector that +approach=coverage pins")
    # the approach's own choice, said again, and a group it leaves alone, pass
    for ok in (["selector=coverage"], ["merge=greedy"], ["model.width=4"]):
        assert precheck("train", ["+approach=coverage", *ok], False) is None


def test_select_py_of_an_approach_picks_the_approachs_selector_or_is_refused(
    capsys: Any,
) -> None:
    """select.py's own `override selector: coverage` comes first in Hydra's defaults tree and
    wins over an approach's: `select.py +approach=random` selected with coverage and recorded
    approach=random."""
    from lipt.run.precheck import precheck

    with pytest.raises(SystemExit) as exit_:
        precheck("select", ["+approach=random"], False)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(
        "error: select.py chooses selector=coverage ahead of +approach=random's selector=random"
    ), err
    for ok in (["+approach=random", "selector=random"], ["+approach=coverage"], []):
        assert precheck("select", ok, False) is None
    assert precheck("train", ["+approach=random"], False) is None  # train.py pins no selector


def test_a_users_approach_on_the_search_path_is_held_to_its_pins(
    tmp_path: Path, capsys: Any
) -> None:
    folder = tmp_path / "configs" / "approach"
    folder.mkdir(parents=True)
    (folder / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /pretrain: none\n"
        "  - override /budget: infobatch\napproach: mine\n"
    )
    searchpath = f"hydra.searchpath=[file://{tmp_path / 'configs'}]"
    line = refusal(
        ["+experiment=frontier_small", searchpath, "+approach=mine", "budget=full"], capsys
    )
    assert line.startswith("budget=full replaces the budget that +approach=mine pins")


@pytest.mark.parametrize(
    "swept", ["seed=0,1,2", "dataset.split_seed=range(3)", "++hydra.sweeper.params.seed='0,1'"]
)
def test_an_optuna_search_refuses_to_search_over_seeds(swept: str, capsys: Any) -> None:
    """The Optuna sweeper samples a swept seed as a hyper-parameter: each trial trained one
    seed and 'Best parameters' named the luckiest one (seed=2 of 0,1,2 in a 3-trial search)."""
    from lipt.run.precheck import precheck

    args = [*FAST, "hparams_search=lr_wd", "hydra.sweeper.n_trials=2"]
    line = refusal([*args, swept], capsys)
    key = swept.lstrip("+").removeprefix("hydra.sweeper.params.").split("=")[0]
    assert line.startswith(f"{key}=" if "params" in swept else f"{swept}: ")
    assert "an Optuna search samples each swept key as a hyper-parameter" in line
    assert line.endswith(f"(-m {key}=0,1,2)")
    # one seed, the sampler's own seed, and seeds swept by Hydra's basic sweeper pass
    assert precheck("train", [*args, "seed=1", "hydra.sweeper.sampler.seed=3"], True) is None
    assert precheck("train", [*FAST, "seed=0,1,2"], True) is None


def test_the_report_command_a_sweep_prints_runs_as_pasted(tmp_path: Path) -> None:
    """A sweep's table ended with `make report SWEEP=<folder>`, which make splits at a space
    (and expands at a $): where it would, the report's own module with the folder quoted."""
    sweep = tmp_path / "runs of $USER's"
    done = run_entry("train.py", ["-m", *FAST, "seed=0,1", f'hydra.sweep.dir="{sweep}"'])
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("  (tables and plots with python -m lipt.report.sweep "), last
    command = shlex.split(last.removeprefix("  (tables and plots with ").removesuffix(")"))
    assert command == ["python", "-m", "lipt.report.sweep", str(sweep)]
    report = run_entry("-m", command[2:])  # as pasted
    assert report.returncode == 0, report.stderr[-2000:]
    assert (sweep / "report" / "results.md").is_file()
    # a folder make reads as typed keeps make's command
    from lipt.run.hydra_callbacks import report_command

    assert report_command(tmp_path / "a,b=c%d") == f"make report SWEEP={tmp_path}/a,b=c%d"


def test_an_optuna_study_in_a_database_is_refused_where_optuna_cannot_keep_one(
    tmp_path: Path, capsys: Any
) -> None:
    """`hydra.sweeper.storage=sqlite:///...` (to keep a study across sweeps) ended in an
    AssertionError's traceback from Optuna 2's database storage on SQLAlchemy 2, exit 1."""
    from importlib.metadata import version

    from lipt.run.precheck import precheck

    if int(version("optuna").split(".")[0]) >= 3 or int(version("sqlalchemy").split(".")[0]) < 2:
        pytest.skip("this Optuna keeps a study in a database on this SQLAlchemy")
    args = [*FAST, "hparams_search=lr_wd", "hydra.sweeper.n_trials=1"]
    url = f"sqlite:///{tmp_path / 'study.db'}"
    line = refusal([*args, f"hydra.sweeper.storage='{url}'"], capsys)
    assert line.startswith(f"hydra.sweeper.storage={url}: Optuna 2.")
    assert line.endswith("leave hydra.sweeper.storage=null, a study in memory for the sweep")
    assert not (tmp_path / "study.db").exists()
    assert precheck("train", [*args, "hydra.sweeper.storage=null"], True) is None
