"""A sweep job refused for an override the user gave every job: the refusal names the job that
refuses it (the frontier's reference job, or the option of a swept group that lacks the key)
and a fix that works, not a group option the user never chose (`budget=full`) or Hydra's bare
"Could not override". Each refusal is one line and exit code 2 before any job starts."""

from __future__ import annotations

from typing import Any

import pytest

FRONTIER = ["+experiment=frontier_cpu", "dataset=synthetic", "seed=0", "fraction=0.1"]


def refusal(args: list[str], capsys: Any) -> str:
    """precheck's one line for the multirun `args` (it must exit 2)."""
    from lipt.run.precheck import precheck

    with pytest.raises(SystemExit) as exit_:
        precheck("train", args, multirun=True)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    return err.removeprefix("error: ").rstrip("\n")


def test_a_methods_setting_refused_by_the_reference_names_it_and_its_fix(capsys: Any) -> None:
    """`+approach=paper reselect_every=3`: the paper's job takes the period, the reference
    (`+approach=full_data`, budget=full) does not. The refusal names the reference, not a
    `budget=full` the user never wrote, and the fix it gives passes."""
    args = [*FRONTIER, "+approach=paper", "reselect_every=3"]
    line = refusal(args, capsys)
    assert line.startswith("reselect_every=3 reaches the frontier's reference job"), line
    assert "+approach=full_data" in line and "budget=full trains the whole pool" in line
    fix = "hydra.sweeper.point_keys=[approach,fraction,reselect_every]"
    assert f"'{fix}'" in line and "selector=coverage in place of" not in line, line

    from lipt.run.precheck import precheck

    assert precheck("train", [*args, fix], multirun=True) is None


def test_a_key_a_declared_approach_lacks_names_that_approach(capsys: Any) -> None:
    """The frontier declares its approaches in hydra.sweeper.params: `selector.balance=false`
    reaches `+approach=full_schedule`, which has no selector (it was Hydra's bare "Could not
    override 'selector.balance'", which named no job)."""
    line = refusal([*FRONTIER, "selector.balance=false"], capsys)
    assert line.startswith(
        "selector.balance=false reaches every job of the sweep, and the one with "
        "+approach=full_schedule has no selector.balance;"
    ), line


def test_a_key_a_swept_option_lacks_names_that_option(capsys: Any) -> None:
    """The same for a group swept on the command line, without an experiment."""
    args = ["dataset=synthetic", "+approach=coverage,full_schedule", "selector.balance=false"]
    line = refusal(args, capsys)
    assert "the one with +approach=full_schedule has no selector.balance" in line, line


def test_a_value_a_swept_option_refuses_names_that_option(capsys: Any) -> None:
    """`reselect_every=3` over the frontier's approaches: the whole pool's shorter schedule
    trains no subset to re-select; the refusal says it is that approach's job."""
    line = refusal([*FRONTIER, "reselect_every=3"], capsys)
    assert line.startswith(
        "reselect_every=3 reaches every job of the sweep, and the one with "
        "+approach=full_schedule refuses it: budget=full_schedule trains the whole pool"
    ), line


@pytest.mark.parametrize(
    "args",
    [
        [*FRONTIER, "selector.nope=false"],  # no job has the key
        [*FRONTIER, "fraction=1.5"],  # every job refuses the value
        ["dataset=synthetic", "+approach=coverage,full_schedule", "selector.nope=false"],
    ],
)
def test_what_no_job_takes_keeps_its_own_refusal(args: list[str], capsys: Any) -> None:
    """Where no job takes the override, no one job is blamed for it."""
    line = refusal(args, capsys)
    assert "reaches" not in line and "the one with" not in line, line
    assert args[-1].split("=")[0] in line, line


def test_a_period_on_an_approach_of_the_whole_pool_offers_another_approach(capsys: Any) -> None:
    """`+approach=lipt_dynamic reselect_every=2`: the approach pins budget=lipt, so the fix is
    another approach (one that passes), not `selector=coverage in place of budget=lipt`, which
    the approach's pins would refuse."""
    from lipt.run.precheck import precheck

    with pytest.raises(SystemExit):
        precheck("train", ["dataset=synthetic", "+approach=lipt_dynamic", "reselect_every=2"])
    line = capsys.readouterr().err
    assert "+approach=coverage in place of +approach=lipt_dynamic" in line, line
    assert "selector=coverage in place of" not in line, line
    fixed = ["dataset=synthetic", "+approach=coverage", "reselect_every=2"]
    assert precheck("train", fixed) is None
