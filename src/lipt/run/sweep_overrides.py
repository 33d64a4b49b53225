"""What a command line sweeps, read as Hydra reads it: the config's declared sweep
(`hydra.sweeper.params`, the frontier sweeper's reference job), every value of a swept key, and
every job of the sweep (up to CHECKED_JOBS), for lipt.run.precheck to compose and check. A sweep
Hydra would refuse or run as no job is refused in one line: a sweep outside a multirun, a
sweep of Hydra's own settings, a glob() of a key that is no group or that matches no option, an
empty range, an interval() for the basic sweeper, `hydra.sweeper.params` where the sweeper
declares none, a sweeper param Hydra cannot read as one key (with dots, quotes or a +). Under
--cfg, which Hydra composes as a single run, a sweep is refused as outside a multirun. So is a
seed an Optuna search would tune, and an Optuna study in a database it cannot keep.
(lipt.run.approach_pins holds the same expanded sweep against what each approach pins.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from lipt.core.errors import UserError
from lipt.run.frontier_sweep import (
    check_frontier_settings,
    key_of,
    with_reference,
)
from lipt.run.slurm import check_slurm_launcher, is_slurm_launcher
from lipt.run.sweep_settings import (
    check_ddp_in_multirun,
    check_job_folder,
    check_learner_sweep,
    check_no_seed_search,
    check_optuna_sweeper,
)


def candidate_overrides(args: list[str], declared: list[str]) -> list[list[str]]:
    """Override lists to compose: sweeps (`a=1,2`) are expanded value by value, so a bad choice
    anywhere in a multirun is caught before any job starts. `declared`: the config's own
    `hydra.sweeper.params` (an experiment's approaches, fractions and seeds). As in Hydra's
    BasicSweeper they come first, then `args`; a repeated key keeps its first place and takes
    its last value (so `+approach=...` precedes `+experiment=...`, as in the jobs)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    by_key: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides([*declared, *args]):
        key = o.get_key_element()
        if o.is_interval_sweep():  # an Optuna search's interval(a, b): both of its ends
            interval = o.value()
            by_key[key] = [f"{key}={interval.start}", f"{key}={interval.end}"]  # type: ignore[union-attr]
        elif o.is_sweep_override():
            by_key[key] = [f"{key}={value}" for value in o.sweep_string_iterator()]
        else:
            by_key[key] = [str(o.input_line)]
    by_key = {key: values for key, values in by_key.items() if values}
    firsts = {key: values[0] for key, values in by_key.items()}
    candidates = [list(firsts.values())]
    for key, values in by_key.items():
        candidates += [[*{**firsts, key: value}.values()] for value in values[1:]]
    return candidates


@dataclass(frozen=True)
class DeclaredSweep:
    """What the config's sweeper declares: `params` as overrides, and the frontier sweeper's
    reference job (`hydra/sweeper=frontier`; empty for Hydra's basic sweeper)."""

    params: list[str]
    reference: list[str]
    point_keys: list[str]
    # A run that is not a multirun: its config, composed once here (Hydra's node dropped).
    single: DictConfig | None = None
    # Whether Hydra will run a multirun: -m, or `hydra.mode: MULTIRUN` in the config.
    multirun: bool = False
    # The composition with Hydra's node (the command line's single values): what ${hydra:...}
    # reads (set_hydra_config).
    composed: DictConfig | None = None
    # Whether the sweeper is Hydra's basic one (or lipt's frontier sweeper, built on it).
    basic: bool = True
    # --cfg: Hydra prints one job's config, composed as a run's (never a multirun).
    show_config: bool = False
    # --run given: the user asked for one job by name.
    run_flag: bool = False
    # A multirun whose jobs a local launcher runs (Hydra's basic or joblib launcher, not SLURM).
    local_multirun: bool = False
    # The primary config's name (train, select, pretrain): what a job composes.
    config_name: str = ""

    def check_job(self, cfg: DictConfig) -> None:
        """What one job of this sweep may not do beside the run's own checks (each job's
        config, a swept trainer.devices or trainer.strategy included): Lightning's DDP in a
        local multirun (check_ddp_in_multirun)."""
        if self.local_multirun and "trainer" in cfg:
            check_ddp_in_multirun(cfg.trainer)

    def is_reference(self, job: list[str]) -> bool:
        """Whether `job` is one of the frontier sweeper's reference jobs (as_reference)."""
        return bool(self.reference) and job[: len(self.reference)] == self.reference

    def with_reference(self, jobs: list[list[str]]) -> list[list[str]]:
        """`jobs` and the reference jobs the frontier sweeper adds to them."""
        if not self.reference:
            return jobs
        return with_reference(jobs, self.reference, self.point_keys)

    def one_job_fix(self, multirun_fix: str) -> str:
        """How to fix a sweep where Hydra runs one job: `multirun_fix` (add -m ...), or, where
        --cfg prints that job's config, one value; where --run asked for one job, -m in its
        place."""
        if self.show_config:
            return "--cfg prints one job's config: give one value"
        if self.run_flag:
            return multirun_fix.replace("add -m", "replace --run with -m", 1)
        return multirun_fix


def declared_sweep(
    config_name: str,
    args: list[str],
    multirun: bool,
    show_config: bool = False,
    run_flag: bool = False,
) -> DeclaredSweep:
    """The config's `hydra.sweeper.params` as overrides, composed from the command line's
    single-valued overrides (`hydra.sweeper.params.*` ones included); empty when the config
    declares none or the run is not a multirun (`-m`, or `hydra.mode: MULTIRUN` in the config;
    never with `show_config`, --cfg, which Hydra composes as a run)."""
    import copy

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    misread = {line: found for line in args if (found := misread_sweeper_params(line))}
    parsed = OverridesParser.create().parse_overrides([a for a in args if a not in misread])
    fixed = [str(o.input_line) for o in parsed if not o.is_sweep_override()]
    sweeps = len(fixed) < len(parsed)
    # --cfg composes one job: a sweep's jobs are not its
    cfg = composed_for_sweep(config_name, fixed, None if show_config else multirun, sweeps)
    sweeper = cfg.hydra.sweeper
    if misread:
        line, found = next(iter(misread.items()))
        raise misread_params_refusal(line, found, declared=sweeper.get("params") is not None)
    check_frontier_settings(sweeper, cfg.hydra.get("callbacks"))
    launcher = cfg.hydra.get("launcher")
    if run_flag and cfg.hydra.mode == RunMode.MULTIRUN:  # Hydra runs the sweep all the same
        raise UserError(
            "--run asks for one run, but the config is a sweep (hydra.mode=MULTIRUN, as "
            "+experiment=... and hparams_search=... set it), which Hydra runs whole all the "
            "same; replace --run with -m (for one of its jobs, give each key it sweeps one "
            "value, e.g. seed=0)"
        )
    multirun = not show_config and (multirun or cfg.hydra.mode == RunMode.MULTIRUN)
    if multirun and "pretrain" in cfg:  # before any job: its learners are other jobs' work
        callbacks = cfg.hydra.get("callbacks") or {}
        soup = any(str(c.get("_target_")).endswith(".SoupCallback") for c in callbacks.values())
        swept = [*args, *declared_overrides(sweeper)]
        as_set = OmegaConf.to_container(cfg.pretrain)  # ${hydra:...} resolves in the job only
        assert isinstance(as_set, dict)
        check_learner_sweep(swept, {str(k): v for k, v in as_set.items()}, merges=soup)
    if multirun and not is_slurm_launcher(launcher) and "trainer" in cfg:
        check_ddp_in_multirun(cfg.trainer)
    if is_slurm_launcher(launcher):  # before anything is submitted
        if multirun:  # a single run is Hydra's, not the launcher's: check_slurm_launcher says
            check_job_folder(launcher, cfg)
        check_slurm_launcher(launcher, multirun)
    target = str(sweeper.get("_target_", ""))
    basic = target.endswith((".BasicSweeper", ".FrontierSweeper"))
    if multirun and target.endswith(".OptunaSweeper"):
        check_optuna_sweeper(sweeper, cfg.get("optimized_metric"))
        check_no_seed_search([*(a for a in args if a not in misread), *declared_overrides(sweeper)])
    with_hydra = copy.deepcopy(cfg)
    if not multirun:
        if len(fixed) < len(args):  # refused by check_sweeps
            return DeclaredSweep(
                [],
                [],
                [],
                composed=with_hydra,
                basic=basic,
                show_config=show_config,
                run_flag=run_flag,
                config_name=config_name,
            )
        with open_dict(cfg):
            del cfg["hydra"]  # what compose(..., return_hydra_config=False) drops
        return DeclaredSweep(
            [],
            [],
            [],
            single=cfg,
            composed=with_hydra,
            basic=basic,
            show_config=show_config,
            run_flag=run_flag,
            config_name=config_name,
        )
    return DeclaredSweep(
        declared_overrides(sweeper),
        [str(o) for o in sweeper.get("reference") or []],
        [str(k) for k in sweeper.get("point_keys") or []],
        multirun=True,
        composed=with_hydra,
        basic=basic,
        local_multirun=not is_slurm_launcher(launcher),
        config_name=config_name,
    )


def declared_overrides(sweeper: DictConfig) -> list[str]:
    """The sweeper's declared `params`, as the overrides they stand for (`key=values`)."""
    from omegaconf import OmegaConf

    declared = sweeper.get("params")
    params = OmegaConf.to_container(declared) if declared else {}
    assert isinstance(params, dict)
    return [f"{key!s}={value}" for key, value in params.items()]


SWEEPER_PARAMS = "hydra.sweeper.params"


def composed_with_hydra(config_name: str, fixed: list[str]) -> DictConfig:
    """`fixed` composed with Hydra's node. An override of `hydra.sweeper.params` where the
    sweeper declares none (Hydra's basic sweeper without an experiment: params is null) ends
    Hydra's own composition in a traceback: refused in a line."""
    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser

    def under_params(key: str) -> bool:
        return key == SWEEPER_PARAMS or key.startswith(SWEEPER_PARAMS + ".")

    setting = [
        o
        for o in OverridesParser.create().parse_overrides(fixed)
        if under_params(o.key_or_group) and not o.is_delete()
    ]
    if setting:
        lines = {str(o.input_line) for o in setting}
        base = compose(config_name, [f for f in fixed if f not in lines], return_hydra_config=True)
        if base.hydra.sweeper.get("params") is None:
            o = setting[0]
            key = o.key_or_group.removeprefix(SWEEPER_PARAMS).removeprefix(".")
            value = o.value()  # a quoted sweep ('0,1') is one string here, a sweep there
            shown = value if isinstance(value, str) else o.get_value_element_as_str()
            raise no_params_refusal(str(o.input_line), f"{key}={shown}" if key else "key=a,b")
    return compose(config_name, fixed, return_hydra_config=True)


def composed_for_sweep(
    config_name: str, fixed: list[str], multirun: bool | None, sweeps: bool
) -> DictConfig:
    """`fixed` composed with Hydra's node (composed_with_hydra). A key no option of the
    defaults has (`selector.balance` without a selector) may be one that the jobs of the
    config's own sweep have (its `+approach` values): composed without it then, where that
    command line (`sweeps`) or the config declares a sweep, in a multirun (`multirun`: -m;
    None: --cfg, one job), each job's composition says which job lacks it."""
    from hydra.errors import ConfigCompositionException
    from hydra.types import RunMode

    try:
        return composed_with_hydra(config_name, fixed)
    except ConfigCompositionException as e:
        missing = re.match(r"Could not override '([^']+)'", str(e))
        rest = [f for f in fixed if missing is None or key_of(f) != missing[1]]
        if len(rest) == len(fixed):
            raise
        try:
            cfg = composed_with_hydra(config_name, rest)
        except ConfigCompositionException:
            raise e from None
        if multirun is None or not (sweeps or cfg.hydra.sweeper.get("params")):
            raise
        if not (multirun or cfg.hydra.mode == RunMode.MULTIRUN):
            raise
        return cfg


def no_params_refusal(line: str, instead: str) -> UserError:
    """`line` sets a sweeper param where the sweeper declares none: `instead`, the sweep as
    overrides, is what it meant."""
    return UserError(
        f"{line}: this run's sweeper declares no {SWEEPER_PARAMS} (an experiment's sweep does), "
        f"so Hydra cannot set one; give the sweep as an override instead: -m {instead}"
    )


def misread_sweeper_params(line: str) -> dict[str, str]:
    """The sweeper params `line` sets that Hydra cannot read as one key each (none where it
    can). The sweeper makes each param `key=value`, a key with dots or a + included, but
    Hydra nests a dotted key under hydra.sweeper.params (`hydra.sweeper.params.dataset.val_size`)
    and its grammar refuses quotes or a + in a key (`hydra.sweeper.params.'dataset.val_size'`,
    `hydra.sweeper.params.+approach`, a dict's `{'dataset.val_size': ...}`): only a dict's
    plain keys are read as they are (misread_params_refusal)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    key, equals, value = line.partition("=")
    param = key.lstrip("+").removeprefix(SWEEPER_PARAMS)
    if not equals or param == key.lstrip("+"):
        return {}
    if param.startswith("."):  # one param
        name = param[1:]
        if re.fullmatch(r"[\w$-]+", name):  # as Hydra's grammar reads a key
            return {}
        return {re.sub("['\"]", "", name): unquoted(value)}
    if param:  # another key
        return {}
    parser = OverridesParser.create()
    try:  # a dict of params: refused only where Hydra's grammar refuses it
        parser.parse_override(line)
        return {}
    except HydraException:
        pass
    without_quotes = re.sub(r"""(['"])([^'"]*)\1(\s*:)""", r"\2\3", value)
    try:
        params = parser.parse_override(f"{SWEEPER_PARAMS}={without_quotes}").value()
    except HydraException:
        return {}
    return {str(k): str(v) for k, v in params.items()} if isinstance(params, dict) else {}


def unquoted(value: str) -> str:
    """`value` without the quotes around it, if any."""
    if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def misread_params_refusal(line: str, params: dict[str, str], declared: bool) -> UserError:
    """How to write the sweeper params `line` meant (misread_sweeper_params): as keys of a dict,
    which Hydra reads as one key each; where the sweeper declares none, as overrides."""
    if not declared:
        return no_params_refusal(line, " ".join(f"{k}={v}" for k, v in params.items()))
    entries = ", ".join(f'{k}: "{v}"' for k, v in params.items())
    return UserError(
        f"{line}: Hydra reads a sweeper param with dots, quotes or a + as one key only in a "
        f"dict: '++{SWEEPER_PARAMS}={{{entries}}}'"
    )


def check_sweeps(args: list[str], declared: DeclaredSweep) -> tuple[list[str], list[str]]:
    """`args` and the declared params with each glob() of a group's options spelled out as
    Hydra's sweeper will run it (the options it matches, listed); a sweep Hydra would refuse,
    or run as no job, refused in a line: a sweep outside a multirun, a sweep of Hydra's own
    settings, a glob() of a key that is no group or that matches no option, an empty range, an
    interval() for Hydra's basic sweeper. Inside Hydra's context (its config loader)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    hydra = GlobalHydra.instance().hydra
    assert hydra is not None
    loader = hydra.config_loader
    parser = OverridesParser.create(config_loader=loader)

    def explicit(lines: list[str]) -> list[str]:
        out = []
        for line, o in zip(lines, parser.parse_overrides(lines), strict=True):
            if not o.is_sweep_override():
                out.append(line)
                continue
            key = o.get_key_element()
            if o.is_hydra_override():
                raise UserError(
                    f"{line}: Hydra does not sweep its own settings (hydra.*); give one value"
                    + sweeper_param_fix(o, declared)
                )
            if o.value_type == ValueType.GLOB_CHOICE_SWEEP:
                group = o.key_or_group
                options = loader.get_group_options(group)
                if not options:
                    raise UserError(
                        f"{line}: glob() sweeps the options of a config group, and {group} is "
                        f"not a group; list the values instead ({group}=a,b)"
                    )
                values = list(o.sweep_string_iterator())
                if not values:
                    raise UserError(
                        f"{line} matches none of {group}'s options ({', '.join(options)})"
                    )
                line = f"{key}={','.join(values)}"  # the jobs Hydra's sweeper makes of it
            elif o.is_interval_sweep():
                low, high = o.value().start, o.value().end  # type: ignore[union-attr]
                if low is not None and high is not None and low > high:
                    raise UserError(
                        f"{line}: an interval goes from its low end to its high end; give "
                        f"interval({high}, {low})"
                    )
                if not declared.multirun:
                    fix = "add -m with a sweeper that samples it (e.g. hparams_search=lr_wd), or "
                    raise UserError(
                        f"{line} is a search interval: "
                        + declared.one_job_fix(fix + "give one value")
                    )
                if declared.basic:
                    raise UserError(
                        f"{line}: Hydra's basic sweeper runs listed values, not an interval; "
                        f"give {key}=a,b or range(), or search with hparams_search=lr_wd"
                    )
                out.append(line)
                continue
            else:
                values = list(o.sweep_string_iterator())
                if not values:
                    raise UserError(f"{line} sweeps no values, so Hydra would run no job")
            if not declared.multirun:
                n = f"{len(values)} value{'s' if len(values) != 1 else ''}"
                as_list = f" (a list is {key}=[{line.split('=', 1)[1]}])"
                fix = declared.one_job_fix("add -m to run a job for each, or give one value")
                # a group's [a,b] merges both options into one: no list of values
                is_group = bool(loader.get_group_options(o.key_or_group))
                raise UserError(
                    f"{o.input_line} sweeps {n}: {fix}"
                    + (
                        as_list
                        if o.value_type == ValueType.SIMPLE_CHOICE_SWEEP and not is_group
                        else ""
                    )
                )
            out.append(line)
        return out

    return explicit(args), explicit(declared.params)


def sweeper_param_fix(o: Any, declared: DeclaredSweep) -> str:
    """For a sweep of `hydra.sweeper.params.<key>` (Hydra refuses any sweep of its settings):
    quoted, it is the one string the sweeper reads, where the config declares params (a dotted
    key is refused before: misread_sweeper_params); without params, the override it meant."""
    param = o.key_or_group.removeprefix(SWEEPER_PARAMS + ".")
    if param == o.key_or_group:
        return ""
    values = str(o.input_line).split("=", 1)[1]
    assert declared.composed is not None
    if declared.composed.hydra.sweeper.get("params") is None:
        return f"; sweep it as an override instead: -m {param}={values}"
    return f"; to declare a sweep there, quote it: {o.get_key_element()}='{values}'"


# precheck composes every job of a sweep up to this many; past it, every value of each swept
# key. A job costs about 10 ms (each choice of groups is composed once, ~0.1 s): a tenth of
# Hydra's own composition of the job when it runs.
CHECKED_JOBS = 10_000


def every_job(args: list[str], declared: list[str]) -> list[list[str]]:
    """Every combination of a sweep's values (as Hydra's BasicSweeper makes the jobs)."""
    import itertools

    candidates = candidate_overrides(args, declared)
    by_key: dict[str, list[str]] = {}
    for candidate in candidates:
        for override in candidate:
            key = override.split("=", 1)[0]
            by_key.setdefault(key, [])
            if override not in by_key[key]:
                by_key[key].append(override)
    size = 1
    for values in by_key.values():
        size *= len(values)
    if size > CHECKED_JOBS:
        return candidates
    return [list(job) for job in itertools.product(*by_key.values())]
