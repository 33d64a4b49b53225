"""The command line as Hydra reads it, checked before Hydra starts (lipt.run.precheck): a sweep
where Hydra runs one job, a glob() of a group's options, sweeper params on the command line,
`${hydra:...}` in an override, --cfg, the run folder. What Hydra runs, the precheck checks as
those jobs; what Hydra refuses (or would run as no job, or crash on) ends in one line and exit
code 2, writing nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import CONFIGS, FAST, ROOT, run_entry

SELECTORS = sorted(p.stem for p in (CONFIGS / "selector").glob("*.yaml"))


def refusal(
    args: list[str], multirun: bool, capsys: Any, show_config: bool = False, run_flag: bool = False
) -> str:
    """precheck's one line for `args` (it must exit 2)."""
    from lipt.run.precheck import precheck

    with pytest.raises(SystemExit) as exit_:
        precheck("train", args, multirun, show_config, run_flag)
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
        # a group's [a,b] merges both options into one config: no "a list is" for a group
        (["selector=random,coverage"], f"selector=random,coverage sweeps 2 values: {AND_M}"),
        (["+approach=random,coverage"], f"+approach=random,coverage sweeps 2 values: {AND_M}"),
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
        "fraction=${nope}: Interpolation key 'nope' not found"
    )
    # pretrain.optim.lr reads optimizer.lr, and fails first: the line names the user's override
    assert refusal([*quick, "optimizer.lr=${nope}"], False, capsys) == (
        "optimizer.lr=${nope}: Interpolation key 'nope' not found"
    )
    assert refusal([*quick, "optimizer.lr=${oc.selct:nope,0.1}"], False, capsys) == (
        "optimizer.lr=${oc.selct:nope,0.1}: Unsupported interpolation type oc.selct"
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
        # Hydra: "ValueError: Only one of --run, --multirun, --cfg, ..." in a traceback
        (
            ["-m", "-c", "job", "seed=0,1"],
            "--multirun and --cfg do not go together: --cfg prints one job's config; check a "
            "sweep's jobs with -m ... dry_run=true",
        ),
    ],
)
def test_what_hydras_parser_refuses_is_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    out = run_entry(str(ROOT / "train.py"), args, cwd=tmp_path)
    assert (out.returncode, out.stderr) == (2, f"error: {line}\n"), out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == []


PARAM_IN_DICT = "Hydra reads a sweeper param with dots, quotes or a + as one key only in a dict"
NO_PARAMS = (
    "this run's sweeper declares no hydra.sweeper.params (an experiment's sweep does), so Hydra "
    "cannot set one; give the sweep as an override instead"
)


@pytest.mark.parametrize(
    "args, line",
    [
        # Hydra's grammar refuses quotes in a key: "LexerNoViableAltException: ..."
        (
            ["+experiment=frontier_small", "hydra.sweeper.params.'dataset.val_size'=100,200"],
            "hydra.sweeper.params.'dataset.val_size'=100,200: "
            f"{PARAM_IN_DICT}: '++hydra.sweeper.params={{dataset.val_size: \"100,200\"}}'",
        ),
        # and in a dict's keys: "no viable alternative at input '{'dataset.val_size''"
        (
            ["+experiment=frontier_small", "++hydra.sweeper.params={'dataset.val_size': '1,2'}"],
            "++hydra.sweeper.params={'dataset.val_size': '1,2'}: "
            f"{PARAM_IN_DICT}: '++hydra.sweeper.params={{dataset.val_size: \"1,2\"}}'",
        ),
        # Hydra nests a dotted key: the sweeper then reads dataset={'val_size': '1,2'}
        (
            ["+experiment=frontier_small", "+hydra.sweeper.params.dataset.val_size='1,2'"],
            "+hydra.sweeper.params.dataset.val_size='1,2': "
            f"{PARAM_IN_DICT}: '++hydra.sweeper.params={{dataset.val_size: \"1,2\"}}'",
        ),
        # a sweep of a dotted param an experiment declares (Hydra sweeps none of its settings)
        (
            ["+experiment=figure3_cpu", "hydra.sweeper.params.pretrain.batches_per_learner=1,2"],
            "hydra.sweeper.params.pretrain.batches_per_learner=1,2: "
            f"{PARAM_IN_DICT}: '++hydra.sweeper.params={{pretrain.batches_per_learner: \"1,2\"}}'",
        ),
        (
            ["+experiment=frontier_small", "hydra.sweeper.params.+approach=random"],
            "hydra.sweeper.params.+approach=random: "
            f"{PARAM_IN_DICT}: '++hydra.sweeper.params={{+approach: \"random\"}}'",
        ),
        # where the sweeper declares no params: the override it meant
        (
            ["hydra.sweeper.params.'dataset.val_size'=100,200"],
            f"hydra.sweeper.params.'dataset.val_size'=100,200: {NO_PARAMS}: "
            "-m dataset.val_size=100,200",
        ),
    ],
)
def test_a_sweeper_param_hydra_cannot_read_as_one_key_is_refused_saying_how_to_write_it(
    args: list[str], line: str, capsys: Any
) -> None:
    assert refusal([*args, "dry_run=true"], True, capsys) == line


def test_the_dict_a_dotted_sweeper_param_is_refused_for_is_read_as_one_key(capsys: Any) -> None:
    """What the refusal offers (as the shell passes it on): Hydra keeps the param as one key
    beside the experiment's own, and the precheck takes the sweep."""
    import shlex

    from hydra import compose, initialize_config_dir

    from lipt.run.precheck import precheck

    experiment = "+experiment=frontier_small"
    line = refusal([experiment, "hydra.sweeper.params.dataset.val_size=100,200"], True, capsys)
    args = [experiment, *shlex.split(line.split(" dict: ", 1)[1])]
    assert args[1] == '++hydra.sweeper.params={dataset.val_size: "100,200"}', line
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        params = compose("train", args, return_hydra_config=True).hydra.sweeper.params
    assert params["dataset.val_size"] == "100,200" and params["fraction"] == "0.25,0.5"
    assert precheck("train", args, multirun=True) is None


CFG_ONE = "--cfg prints one job's config: give one value"


@pytest.mark.parametrize(
    "args, line",
    [
        (["seed=0,1"], f"seed=0,1 sweeps 2 values: {CFG_ONE} (a list is seed=[0,1])"),
        (["seed=range(2)"], f"seed=range(2) sweeps 2 values: {CFG_ONE}"),
        # an experiment's hydra.mode: MULTIRUN does not make --cfg a multirun
        (
            ["+experiment=frontier_small", "seed=0,1"],
            f"seed=0,1 sweeps 2 values: {CFG_ONE} (a list is seed=[0,1])",
        ),
        (
            ["fraction=interval(0.1,0.2)"],
            f"fraction=interval(0.1,0.2) is a search interval: {CFG_ONE}",
        ),
        (["fraction=2"], "fraction=2 is invalid: input should be less than or equal to 1"),
        (
            ["no_such_key=1"],
            "Could not override 'no_such_key'. (see `--help` for the groups and options, "
            "`+key=value` adds a new key)",
        ),
    ],
)
def test_cfg_refuses_what_a_run_refuses_in_its_config_in_one_line(
    args: list[str], line: str, capsys: Any
) -> None:
    """--cfg prints the config a run would get (Hydra: five lines of "Ambiguous value" for a
    sweep, a traceback for a key, and a value out of range printed as if fine)."""
    assert refusal(args, False, capsys, show_config=True) == line


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["seed=0,1"],
            "seed=0,1 sweeps 2 values: replace --run with -m to run a job for each, or give one "
            "value (a list is seed=[0,1])",
        ),
        (
            ["optimizer.lr=interval(0.1,1)"],
            "optimizer.lr=interval(0.1,1) is a search interval: replace --run with -m with a "
            "sweeper that samples it (e.g. hparams_search=lr_wd), or give one value",
        ),
    ],
)
def test_a_sweep_after_run_is_told_to_replace_run_with_m(
    args: list[str], line: str, capsys: Any
) -> None:
    """--run asks for one job: "add -m" beside it would be refused next (two commands)."""
    assert refusal(args, False, capsys, run_flag=True) == line


def test_a_job_folder_the_slurm_launcher_would_replace_is_refused(
    tmp_path: Path, capsys: Any
) -> None:
    """lipt's SLURM launcher runs each job in hydra.sweep.dir/subdir: a paths.output_dir beside
    it would be ignored (refused before the cluster is asked anything)."""
    args = ["hydra/launcher=slurm", f"paths.output_dir={tmp_path}/${{hydra:job.num}}"]
    assert refusal(args, True, capsys) == (
        f"paths.output_dir={tmp_path}/${{hydra:job.num}} is ignored: hydra/launcher=slurm runs "
        "each job in hydra.sweep.dir/hydra.sweep.subdir; drop paths.output_dir and choose the "
        "folder with hydra.sweep.dir=..."
    )


def test_a_learner_sweeps_folder_is_read_as_set_and_its_experiments_params_as_swept(
    capsys: Any,
) -> None:
    """A learner folder per seed through ${hydra:...} (resolved in the job only) passes; a
    sweep an experiment declares beside pretrain.learners is seen as the command line's is."""
    from lipt.run.precheck import precheck

    learners = ["pretrain=jigsaw", "pretrain.learners=range(2)", "dataset=synthetic"]
    own = [*learners, "seed=0,1", "pretrain.learner_dir=${hydra:sweep.dir}/learners_${seed}"]
    assert precheck("pretrain", own, multirun=True) is None
    declared = [*learners, "hydra/callbacks=soup", "+experiment=figure3_cpu"]
    assert refusal(declared, True, capsys).startswith(
        "the soup callback merges one set of jigsaw learners, but this multirun also sweeps "
    )


@pytest.mark.parametrize(
    "folder", ["${hydra: runtime.output_dir}", "${hydra:sweep.dir}/${hydra:sweep.subdir}"]
)
def test_the_slurm_launchers_own_job_folder_however_spelled_is_no_refusal(
    folder: str, capsys: Any
) -> None:
    """What the launcher sets paths.output_dir to is not "ignored": the next check (no cluster
    here) answers instead; a single run is told to add -m, not that its folder is ignored."""
    args = ["hydra/launcher=slurm", f"paths.output_dir={folder}"]
    assert refusal(args, True, capsys).startswith("no SLURM cluster is reachable")
    single = ["hydra/launcher=slurm", "paths.output_dir=/tmp/elsewhere"]
    assert "add -m" in refusal(single, False, capsys)


def test_ddp_on_several_processes_is_refused_in_a_local_multirun(capsys: Any) -> None:
    """Lightning's DDP starts rank 1 by running the command line again: under -m, the whole
    sweep again. One process, or a single run, passes."""
    from lipt.run.precheck import precheck

    assert refusal(["trainer=ddp", "seed=0,1"], True, capsys).startswith(
        "trainer.strategy=ddp on 2 processes starts each extra one by running the command again"
    )
    assert precheck("train", ["trainer=ddp", "trainer.devices=1", "seed=0,1"], True) is None
    assert precheck("train", ["trainer=ddp"], False) is None


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["trainer.strategy=ddp", "trainer.devices=1,2"], "trainer.strategy=ddp on 2 processes"),
        (["trainer=default,ddp"], "trainer.strategy=ddp on 2 processes"),
        (["trainer.strategy=auto,ddp", "trainer.devices=2"], "trainer.strategy="),
        (
            ["trainer.devices=2", "seed=0,1"],
            "trainer.strategy=auto on 2 processes (trainer.devices=2) is Lightning's DDP",
        ),
        (["trainer.devices=1,2"], "trainer.strategy=auto on 2 processes"),
        # FSDP and DeepSpeed start their processes with DDP's launcher
        (["trainer.strategy=fsdp", "trainer.devices=2", "seed=0,1"], "trainer.strategy=fsdp on 2"),
        (["trainer.strategy=deepspeed_stage_2", "trainer.devices=2", "seed=0,1"], "trainer.st"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else "",
)
def test_ddp_in_any_job_of_a_local_multirun_is_refused(
    args: list[str], start: str, capsys: Any
) -> None:
    """Each job's trainer is checked, not only the command line's fixed values: a sweep of
    trainer.devices or trainer.strategy (or of the trainer option) that makes one job DDP, or
    devices=2 under strategy=auto (Lightning's DDP too), would run the whole sweep again in
    rank 1."""
    message = refusal([*args, "trainer.accelerator=cpu"], True, capsys)
    assert message.startswith(start) and "whole sweep again" in message, message


@pytest.mark.parametrize(
    "args",
    [
        ["trainer.devices=1", "trainer.strategy=auto,ddp", "seed=0,1"],
        ["trainer.devices=1", "trainer.strategy=ddp", "seed=0,1"],
    ],
)
def test_a_local_multirun_whose_jobs_start_no_ddp_process_passes(args: list[str]) -> None:
    from lipt.run.precheck import precheck

    assert precheck("train", [*args, "trainer.accelerator=cpu"], True) is None


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["optimized_metric=null"],
            "the Optuna sweeper optimises the number each trial returns, but "
            "optimized_metric=null returns the whole summary, which every trial would fail on "
            "after training; set optimized_metric=val_accuracy (or use Hydra's basic sweeper)",
        ),
        (["hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials=0 runs no trial; give 1 or more"),
        (
            ["hydra.sweeper.n_jobs=0"],
            "hydra.sweeper.n_jobs=0 launches no trial at a time; give 1 or more",
        ),
        (
            ["hydra.sweeper.direction=minimize"],
            "hydra.sweeper.direction=minimize would choose the trial of the lowest val_accuracy; "
            "use hydra.sweeper.direction=maximize",
        ),
        (
            ["hydra.sweeper.direction=[maximize,minimize]"],
            "hydra.sweeper.direction=['maximize', 'minimize'] optimises 2 objectives, but "
            "optimized_metric=val_accuracy is one number; give one direction (maximize)",
        ),
        (
            ["optimizer.lr=tag(log, interval(0.5, 0.01))"],
            "optimizer.lr=tag(log, interval(0.5, 0.01)): an interval goes from its low end to its "
            "high end; give interval(0.01, 0.5)",
        ),
        (  # the sweeper's own params: the same
            ["++hydra.sweeper.params={optimizer.weight_decay: 'interval(0.1, 0.001)'}"],
            "optimizer.weight_decay=interval(0.1, 0.001): an interval goes from its low end to "
            "its high end; give interval(0.001, 0.1)",
        ),
    ],
)
def test_an_optuna_search_that_would_end_in_a_traceback_or_pick_the_worst_is_refused(
    args: list[str], line: str, capsys: Any
) -> None:
    """Optuna asks each trial for one number and maximises it: a trial returning the whole
    summary fails after training (every trial, then "No trials are completed yet"), so do no
    trials or none at a time; a reversed interval fails as the study starts; minimize picks the
    worst validation accuracy. Each is one line before any trial (also without dry_run)."""
    assert refusal(["hparams_search=lr_wd", *FAST, *args], False, capsys) == line


def test_an_optuna_search_as_shipped_passes() -> None:
    from lipt.run.precheck import precheck

    ok = ["hydra.sweeper.direction=[maximize]", "optimizer.lr=tag(log, interval(0.01, 0.5))"]
    assert precheck("train", ["hparams_search=lr_wd", *FAST, *ok], False) is None


GRAMMAR = "(Hydra's override grammar: https://hydra.cc/docs/advanced/override_grammar/basic)"


@pytest.mark.parametrize(
    ("arg", "multirun", "line"),
    [
        ("seed=[0,1", False, "seed=[0,1 cannot be read: no viable alternative at input '[0,1' "),
        ("seed=0,,1", True, "seed=0,,1 cannot be read: extraneous input ',' "),
        (
            "optimizer.lr=${oops",
            False,
            "optimizer.lr=${oops cannot be read: mismatched input '{' expecting <EOF> ",
        ),
    ],
)
def test_an_override_hydra_cannot_parse_is_named_in_its_one_line(
    arg: str, multirun: bool, line: str, capsys: Any
) -> None:
    """Hydra names the override on a line of its own, which one line would drop: the line
    names it, with the parser's reason (not its list of every token it expected)."""
    assert refusal([arg, "dry_run=true"], multirun, capsys) == line + GRAMMAR


@pytest.mark.parametrize("config", ["+experiment=table2_cpu", "hparams_search=lr_wd"])
def test_run_with_a_config_that_is_a_sweep_is_refused(config: str, capsys: Any) -> None:
    """Hydra takes hydra.mode=MULTIRUN from the config over --run and runs the whole sweep (an
    experiment's 72 jobs): --run asked for one run, so the run is refused, not the sweep run.
    --run with hydra.mode=RUN given is a run, as Hydra runs it."""
    from lipt.run.precheck import precheck

    message = refusal([config, "dry_run=true"], False, capsys, run_flag=True)
    assert message.startswith("--run asks for one run, but the config is a sweep"), message
    assert "replace --run with -m" in message, message
    assert precheck("train", ["hparams_search=lr_wd", "hydra.mode=RUN"], False, False, True) is None


def test_cfg_prints_a_config_it_does_not_look_at_the_machine_for(tmp_path: Path) -> None:
    """--cfg looks at the config, not at the machine (a config is often printed to be run
    elsewhere): a data folder that is not here, a run folder that cannot be written, a key an
    experiment leaves at ??? or one its sweep sets are printed as Hydra prints them."""
    from lipt.run.precheck import precheck

    blocker = tmp_path / "file"
    blocker.write_text("")
    for args in (
        ["dataset.data_dir=/no/such/dir"],
        [f"paths.output_dir={blocker}/run", f"hydra.run.dir={blocker}/run"],
        ["+experiment=table1"],  # dataset.data_dir: ???, and ${approach} its sweep sets
    ):
        assert precheck("train", args, show_config=True) is None, args
    out = run_entry(str(ROOT / "train.py"), ["-c", "job", "seed=0,1"], cwd=tmp_path)
    assert (out.returncode, out.stderr) == (
        2,
        f"error: seed=0,1 sweeps 2 values: {CFG_ONE} (a list is seed=[0,1])\n",
    )
    out = run_entry(str(ROOT / "train.py"), ["-c", "job", "+experiment=table1"], cwd=tmp_path)
    assert out.returncode == 0 and "data_dir: ???" in out.stdout, out.stderr
    assert list(tmp_path.iterdir()) == [blocker]


def test_a_run_folder_that_cannot_be_written_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """paths.output_dir is made by the stage once Hydra has started the job: checked before,
    read with Hydra's node as the job reads it (a multirun's first job for ${hydra:job.num})."""
    from lipt.run.precheck import precheck

    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    quick = [*FAST, "dry_run=true"]
    assert refusal([*quick, f"paths.output_dir={blocker}/run"], False, capsys) == (
        f"paths.output_dir={blocker}/run cannot be written ({blocker} is not a folder); "
        "choose a writable folder"
    )
    job_folder = f"paths.output_dir={blocker}/${{hydra:job.num}}"
    assert refusal([*quick, "seed=0,1", job_folder], True, capsys) == (
        f"paths.output_dir={blocker}/0 cannot be written ({blocker} is not a folder); "
        "choose a writable folder"
    )
    unset = "hydra.run.dir=${oc.env:LIPT_NO_SUCH_VARIABLE}"
    assert refusal([*quick, unset], False, capsys).startswith(
        "hydra.run.dir does not resolve (KeyError raised while resolving interpolation: "
        "\"Environment variable 'LIPT_NO_SUCH_VARIABLE' not found\")"
    )
    # Hydra's own folder (outputs/<stage>/<date>/<time> below the working folder, by default)
    (tmp_path / "outputs").write_text("")
    line = refusal(quick, False, capsys)
    assert line.startswith(f"the run folder {tmp_path}/outputs/train/"), line
    assert line.endswith(
        f"({tmp_path}/outputs is not a folder); choose a writable one with hydra.run.dir=..."
    )
    (tmp_path / "outputs").unlink()
    # a folder of each job's number, below the working folder: as the jobs will make it
    runs = "paths.output_dir=${hydra:runtime.cwd}/runs/${hydra:job.num}"
    assert precheck("train", [*FAST, "seed=0,1", runs], multirun=True) is None
    # a job folder named by a key the job sets (scripts/same_bits.sh's): its sweep folder stands
    # for it, written or refused as that is
    # (one job per approach: a subdir that parts no other swept key is refused)
    by_approach = ["+approach=random,coverage", "fraction=0.1", "seed=0"]
    by_approach += ["hydra.sweep.subdir=${approach}"]
    sweep = ["+experiment=frontier_small", *by_approach]
    assert precheck("train", [*sweep, f"hydra.sweep.dir={tmp_path}/sweep"], multirun=True) is None
    assert refusal([*sweep, f"hydra.sweep.dir={blocker}/sweep"], True, capsys).startswith(
        f"hydra.sweep.dir={blocker}/sweep cannot be written"
    )
    assert list(tmp_path.iterdir()) == [blocker]
