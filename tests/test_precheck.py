"""The command line as Hydra reads it, checked before Hydra starts (lipt.run.precheck): a sweep
where Hydra runs one job, a glob() of a group's options, sweeper params on the command line,
`${hydra:...}` in an override. What Hydra runs, the precheck checks as those jobs; what Hydra
refuses (or would run as no job, or crash on) ends in one line and exit code 2, writing nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import CONFIGS, FAST, ROOT, run_entry

SELECTORS = sorted(p.stem for p in (CONFIGS / "selector").glob("*.yaml"))


def refusal(args: list[str], multirun: bool, capsys: Any) -> str:
    """precheck's one line for `args` (it must exit 2)."""
    from lipt.run.precheck import precheck

    with pytest.raises(SystemExit) as exit_:
        precheck("train", args, multirun=multirun)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    return err.removeprefix("error: ").rstrip("\n")


@pytest.mark.slow
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_sweep_without_m_is_refused_in_one_line_whether_a_dry_run_or_not(
    tmp_path: Path, dry_run: bool
) -> None:
    """Hydra runs one job outside a multirun and refuses a sweep (in five lines); a dry run
    says what Hydra would do, not "2 jobs composed"."""
    args = [*FAST, "seed=0,1", f"hydra.run.dir={tmp_path / 'run'}"]
    out = run_entry(
        str(ROOT / "train.py"), [*args, f"dry_run={str(dry_run).lower()}"], cwd=tmp_path
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr == (
        "error: seed=0,1 sweeps 2 values: add -m to run a job for each, or give one value "
        "(a list is seed=[0,1])\n"
    )
    assert out.stdout == "" and list(tmp_path.iterdir()) == []


AND_M = "add -m to run a job for each, or give one value"


@pytest.mark.parametrize(
    "args, line",
    [
        (["seed=range(0,3)"], f"seed=range(0,3) sweeps 3 values: {AND_M}"),
        (["selector=glob(random*)"], f"selector=glob(random*) sweeps 2 values: {AND_M}"),
        (
            ["fraction=interval(0.1,0.2)"],
            "fraction=interval(0.1,0.2) is a search interval: add -m with a sweeper that samples"
            " it (e.g. hparams_search=lr_wd), or give one value",
        ),
    ],
)
def test_any_sweep_outside_a_multirun_is_refused_in_one_line(
    args: list[str], line: str, capsys: Any
) -> None:
    assert refusal([*args, "dry_run=true"], False, capsys) == line


@pytest.mark.parametrize("multirun", [False, True])
def test_a_glob_of_a_key_that_is_no_group_is_refused_in_one_line(multirun: bool, capsys) -> None:
    """Hydra refuses it outside a multirun and launches no job in one (exit 0): both refused."""
    assert refusal(["seed=glob(*)", "dry_run=true"], multirun, capsys) == (
        "seed=glob(*): glob() sweeps the options of a config group, and seed is not a group; "
        "list the values instead (seed=a,b)"
    )


def test_a_glob_that_matches_no_option_is_refused_naming_the_options(capsys) -> None:
    assert refusal(["selector=glob(zz*)"], True, capsys) == (
        f"selector=glob(zz*) matches none of selector's options ({', '.join(SELECTORS)})"
    )


@pytest.mark.slow
def test_a_glob_of_a_groups_options_sweeps_them_as_hydra_does(tmp_path, monkeypatch) -> None:
    """`-m 'selector=glob(*,exclude=[...])'`: a job for each option the glob keeps, each
    composed and checked (Hydra's sweeper asks its config loader for the group's options)."""
    from lipt.run.precheck import precheck

    monkeypatch.chdir(tmp_path)
    excluded = ["none", "glister", "gradmatch", "craig"]
    glob = f"selector=glob(*,exclude=[{','.join(excluded)}])"
    args = [*FAST, "budget=subset", glob, "dry_run=true"]
    assert precheck("train", args, multirun=True) == len(SELECTORS) - len(excluded)
    assert list(tmp_path.iterdir()) == []


OWN = "Hydra does not sweep its own settings (hydra.*); give one value"


@pytest.mark.parametrize(
    "args, line",
    [
        (["seed=range(0,0)"], "seed=range(0,0) sweeps no values, so Hydra would run no job"),
        (
            ["fraction=interval(0.1,0.2)"],
            "fraction=interval(0.1,0.2): Hydra's basic sweeper runs listed values, not an "
            "interval; give fraction=a,b or range(), or search with hparams_search=lr_wd",
        ),
        (["hydra.job.chdir=true,false"], f"hydra.job.chdir=true,false: {OWN}"),
        (
            ["hydra.sweeper.params.seed=0,1"],
            f"hydra.sweeper.params.seed=0,1: {OWN}; sweep it as an override instead: -m seed=0,1",
        ),
        (
            ["+experiment=frontier_small", "hydra.sweeper.params.seed=0,1"],
            f"hydra.sweeper.params.seed=0,1: {OWN}; to declare a sweep there, quote it: "
            "hydra.sweeper.params.seed='0,1'",
        ),
    ],
)
def test_a_multirun_sweep_hydra_refuses_or_runs_as_no_job_is_refused_in_one_line(
    args: list[str], line: str, capsys: Any
) -> None:
    assert refusal([*args, "dry_run=true"], True, capsys) == line


@pytest.mark.slow
def test_sweeper_params_on_the_command_line_change_an_experiments_and_are_refused_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Hydra's basic sweeper has no params (null) unless an experiment declares them: setting
    one ends Hydra's composition in a traceback (AssertionError), here in one line. With an
    experiment's params they are changed, and the jobs are Hydra's (5 approaches x 1 fraction
    x 2 seeds, and a reference per seed: 12, as Hydra launches them)."""
    from lipt.run.precheck import precheck

    out = run_entry(
        str(ROOT / "train.py"),
        ["-m", "seed=0,1", "hydra.sweeper.params.seed=3", "dry_run=true"],
        cwd=tmp_path,
    )
    assert out.returncode == 2 and out.stderr == (
        "error: hydra.sweeper.params.seed=3: this run's sweeper declares no "
        "hydra.sweeper.params (an experiment's sweep does), so Hydra cannot set one; give the "
        "sweep as an override instead: -m seed=3\n"
    ), out.stderr
    assert list(tmp_path.iterdir()) == []
    line = refusal(["hydra.sweeper.params={fraction: '0.2,0.3'}"], True, capsys)
    assert line.endswith(
        "so Hydra cannot set one; give the sweep as an override instead: -m key=a,b"
    )
    monkeypatch.chdir(tmp_path)
    args = ["+experiment=frontier_small", "hydra.sweeper.params.fraction=0.2", "seed=4,5"]
    assert precheck("train", [*args, "dry_run=true"], multirun=True) == 12


def test_hydra_interpolations_in_overrides_resolve_as_in_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """`${hydra:...}` reads Hydra's node of the job, as in the run: a folder from it is fine,
    a value of the wrong type is refused naming its key (not "HydraConfig was not set"); an
    interpolation that does not resolve names its key."""
    from lipt.run.precheck import precheck

    monkeypatch.chdir(tmp_path)
    quick = [*FAST, "dry_run=true"]
    assert precheck("train", [*quick, "paths.output_dir=${hydra:runtime.cwd}/x"]) == 1
    assert refusal([*quick, "fraction=${hydra:runtime.cwd}"], False, capsys) == (
        f"fraction='{tmp_path}' is invalid: input should be a valid number"
    )
    assert refusal([*quick, "seed=0,1", "fraction=${hydra:runtime.cwd}"], True, capsys) == (
        f"fraction='{tmp_path}' is invalid: input should be a valid number"
    )
    assert refusal([*quick, "fraction=${nope}"], False, capsys) == (
        "fraction: Interpolation key 'nope' not found"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "override, line",
    [
        (
            "+seed=3",
            "Could not append to config. An item is already at 'seed'. (+ adds a new key: "
            "key=value or ++key=value sets one that is there)",
        ),
        (
            "+selector=random",
            "Multiple values for selector. To override a value use 'override selector: random' "
            "(on the command line: selector=random)",
        ),
    ],
)
def test_adding_what_is_there_says_how_to_set_it(override: str, line: str, capsys: Any) -> None:
    """`+` of a key or group the config has: Hydra's refusal, and the command line's fix."""
    assert refusal([override], False, capsys) == line


@pytest.mark.parametrize(
    "args, line",
    [
        # argparse stops reading overrides at a flag that follows one: Hydra prints its usage
        (
            ["seed=0,1", "-m", "dry_run=true"],
            "dry_run=true would not be read: give Hydra's flags (-m) first",
        ),
        (["--resolve"], "--resolve only goes with --cfg job|hydra|all (or --help)"),
    ],
)
def test_what_hydras_parser_refuses_is_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    out = run_entry(str(ROOT / "train.py"), args, cwd=tmp_path)
    assert (out.returncode, out.stderr) == (2, f"error: {line}\n"), out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == []
