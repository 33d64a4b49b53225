"""What the config's sweeper declares, composed from the command line's single values, as Hydra
reads it: `hydra.sweeper.params`, the frontier sweeper's reference job, and whether Hydra runs a
multirun, for lipt.run.precheck (lipt.run.sweep_overrides expands the sweep into its jobs). What
Hydra would refuse or run otherwise is refused in one line before any job: `hydra.sweeper.params`
where the sweeper declares none, a sweeper param Hydra cannot read as one key (with dots, quotes
or a +), --run where the config is a sweep; so is a seed an Optuna search would tune, an Optuna
study in a database it cannot keep, and what a sweep's learners, DDP or SLURM launcher may not
do (lipt.run.sweep_settings).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from omegaconf import DictConfig

from lipt.core.errors import UserError
from lipt.run.frontier_sweep import (
    check_frontier_settings,
    key_of,
    with_reference,
)
from lipt.run.slurm import check_job_gpus, check_slurm_launcher, is_slurm_launcher
from lipt.run.sweep_settings import (
    check_ddp_in_multirun,
    check_job_folder,
    check_learner_sweep,
    check_no_seed_search,
    check_optuna_sweeper,
)


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
        check_job_gpus(launcher, cfg.get("trainer"))
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
