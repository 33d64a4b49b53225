"""The command line checked before Hydra starts: what `launch` runs first.

The overrides are composed as Hydra will compose them, a sweep's every value and every job
(what they sweep: lipt.run.sweep_overrides), and held to the run's checks, so a mistake anywhere
in a multirun ends with one line on stderr and exit code 2 before any job starts or anything is
written. `${hydra:...}` in an override reads Hydra's node as the job will (`set_hydra_config`),
and so does the run folder, checked here since the stage makes it only once the job has started.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lipt.core.errors import UserError, fail, one_line
from lipt.run.approach_pins import (
    accepted_elsewhere,
    check_approach_choices,
    check_reference_takes,
    job_refusal,
    swept_groups,
)
from lipt.run.composition import compose_jobs, config_dir, set_hydra_config
from lipt.run.declared_sweep import DeclaredSweep, declared_sweep
from lipt.run.sweep_overrides import candidate_overrides, check_sweeps, every_job
from lipt.run.sweep_settings import HYDRA_JOB_FOLDER, check_sweep_subdir


def refusal_line(e: Exception, given: list[str]) -> str:
    """The one line a refusal of the command line `given` prints: the key or override it names
    first where Hydra or OmegaConf name it on a line of their own, a hint for Hydra's errors."""
    from hydra.errors import OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    message = one_line(e)
    key = e.full_key if isinstance(e, OmegaConfBaseException) else None
    typed = interpolating_override(message, given)
    if typed is not None:  # where the key that failed only reads the user's ${...}
        message = f"{typed}: {message}"
    elif key and key not in message:  # OmegaConf names it on a line of its own
        message = f"{key}: {message}"
    if isinstance(e, OverrideParseException):  # Hydra names the override on another line
        message = f"{e.override} cannot be read: {parse_reason(e.message)} ({GRAMMAR})"
        quoted = quoted_override(e.override, e.message)
        if quoted is not None:
            message = f"{e.override} cannot be read: {quoted} ({GRAMMAR})"
    return message + ("" if isinstance(e, UserError) else override_hint(e))


def precheck(
    config_name: str,
    args: list[str],
    multirun: bool = False,
    show_config: bool = False,
    run_flag: bool = False,
) -> int | None:
    """Compose and validate the config from `args` as Hydra will; exit 2 on the first problem.
    A sweep's candidate jobs (each value once) get every check; every job (up to
    CHECKED_JOBS) gets those that build nothing, the rules across keys among them. With
    `dry_run=true`, also build what each run builds first; returns the number of jobs checked
    then (None without dry_run). `show_config` (--cfg): Hydra prints one job's config, which
    is composed and its values checked (check_values); returns None. `run_flag`: --run was
    given (a sweep's fix then names it)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lipt.run.config import validate

    # compose_jobs holds Hydra's context between its configs: closed here, not whenever a
    # traceback that refers to them is collected (which would clear Hydra under other code)
    generators: list[Generator[DictConfig, None, None]] = []
    # a sweep's candidate jobs are composed, then every job: each choice of groups once
    kept: dict[tuple[str, ...], DictConfig] = {}

    hydra_config = HydraConfig.instance().cfg  # set_hydra_config's is set while checking

    def opened(jobs: Generator[DictConfig, None, None]) -> Generator[DictConfig, None, None]:
        generators.append(jobs)
        return jobs

    given = list(args)
    # the job being composed or checked, and what a refusal of it names (job_refusal)
    current: list[str] = []
    jobs: list[list[str]] = []  # a single run's one job is its candidate
    listed: list[list[str]] = []
    groups: set[str] = set()
    declared = DeclaredSweep([], [], [])
    try:
        if not show_config:
            check_given_folders(args)
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            declared = declared_sweep(config_name, args, multirun, show_config, run_flag)
            args, params = check_sweeps(args, declared)
            check_approach_choices(args, params, declared)
            check_reference_takes(args, params, declared)
            groups = swept_groups(args, params)
        assert declared.composed is not None
        set_hydra_config(declared.composed, declared.multirun)
        # Hydra's own settings are not the run's, but its search path finds a user's config files.
        overrides = [
            a
            for a in args
            if a.startswith("hydra.searchpath=") or not a.startswith(("hydra.", "hydra/"))
        ]
        if show_config:
            assert declared.single is not None
            check_values(declared.single)
            return None
        listed = [[]]
        if declared.single is not None:
            composed: Iterable[DictConfig] = [declared.single]
        else:
            # a method's own refusal before its reference's, which takes the method's overrides
            listed = methods_first(declared, candidate_overrides(overrides, params))
            composed = opened(compose_jobs(config_name, listed, kept))
            jobs = methods_first(declared, every_job(overrides, params))
            assert declared.composed is not None
            check_sweep_subdir(declared.composed.hydra.sweep, jobs)
        configs = []
        for cfg in each_job(listed, composed, current):
            validate(cfg, deep=False)
            declared.check_job(cfg)
            check_output_dir(cfg, declared.multirun)
            configs.append(cfg)
        # then what builds the Trainer, selector, ... (imports torch)
        runs = [validate(cfg) for cfg in each_job(listed, configs, current)]
        for cfg in each_job(jobs, opened(compose_jobs(config_name, jobs, kept)), current):
            validate(cfg, build=False)  # the rules across keys
            declared.check_job(cfg)
        return built_dry_runs(runs, max(len(jobs), 1))
    except (HydraException, OmegaConfBaseException, UserError) as e:
        methods = [job for job in listed if not declared.is_reference(job)]
        elsewhere = accepted_elsewhere(config_name, methods, groups)
        fail(job_refusal(refusal_line(e, given), current, listed, declared, groups, elsewhere))
    finally:
        for generator in generators:  # left mid-way by a refusal: their Hydra context ends now
            generator.close()
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = hydra_config  # Hydra sets the run's own


def check_given_folders(args: list[str]) -> None:
    """The run or sweep folder given on the command line: writable, and not a running run's
    (checked before Hydra writes .hydra/ into it)."""
    from lipt.core.job import is_ddp_child
    from lipt.core.lock import check_unlocked

    ddp_child = is_ddp_child()  # shares its rank 0's folder (srun: SLURM_PROCID too)
    for arg in args:
        if arg.startswith("hydra.run.dir=") and not ddp_child:
            check_unlocked(Path(arg.split("=", 1)[1]))
        if arg.startswith(("hydra.run.dir=", "hydra.sweep.dir=")):
            check_writable(arg)


def built_dry_runs(runs: list[Any], jobs: int) -> int | None:
    """With `dry_run=true`, what each of `runs` builds first, built (lipt.run.preflight);
    `jobs`, the sweep's count, or None without dry_run."""
    if not any(run.settings.dry_run for run in runs):
        return None
    from lipt.run.preflight import build_everything

    loaded: dict[str, Any] = {}
    for run in runs:
        build_everything(run, loaded)
    return jobs


def methods_first(declared: DeclaredSweep, jobs: list[list[str]]) -> list[list[str]]:
    """`jobs` and the frontier's reference jobs for them, the references last."""
    return sorted(declared.with_reference(jobs), key=declared.is_reference)


def each_job(
    jobs: list[list[str]], configs: Iterable[DictConfig], current: list[str]
) -> Generator[DictConfig, None, None]:
    """`configs`, one per job of `jobs`, with `current` holding the job of the config being
    composed (a refusal while composing it) and checked (after it is yielded)."""
    it = iter(configs)
    for job in jobs:
        current[:] = job
        yield next(it)


# Where Hydra's override grammar is told: how a value with a comma, a bracket or ${...} is written.
GRAMMAR = "Hydra's override grammar: https://hydra.cc/docs/advanced/override_grammar/basic"


def interpolating_override(message: str, args: list[str]) -> str | None:
    """The override of `args` whose `${...}` names the key or resolver OmegaConf did not find
    (`message`), if one does: a key that interpolates it (pretrain.optim.lr reads optimizer.lr)
    may be the one OmegaConf names."""
    found = re.search(
        r"Interpolation key '([^']+)' not found|Unsupported interpolation type (\S+)", message
    )
    if found is None:
        return None
    name = re.escape(found[1] or found[2])
    for arg in args:
        if re.search(r"\$\{\s*" + name + r"\s*[}:]", arg.partition("=")[2]):
            return arg
    return None


LEXER_FAILED = "LexerNoViableAltException: "


def quoted_override(override: str, message: str) -> str | None:
    """How to write an override whose value has a character Hydra's lexer reads only inside
    quotes (a non-ASCII letter: a folder named `ü`), where the parser's `message` points at
    one; None otherwise. The fix is given as typed in a shell: the quotes Hydra needs inside
    the shell's."""
    lines = message.splitlines()
    if len(lines) < 2 or not lines[0].startswith(LEXER_FAILED) or "^" not in lines[1]:
        return None
    at = lines[1].index("^") - len(LEXER_FAILED)
    key, _, value = override.partition("=")
    if not 0 <= at < len(override) or override[at].isascii() or "'" in value or '"' in value:
        return None
    return f"Hydra reads {override[at]!r} only in a quoted value: write \"{key}='{value}'\""


def parse_reason(message: str) -> str:
    """The parser's reason in Hydra's message of an override it cannot read, without the line
    that repeats the override, the link, or the parser's list of the tokens it expected."""
    lines = [
        line
        for line in message.splitlines()
        if line.strip() and not line.startswith(("Error parsing override", "See https://"))
    ]
    reason = lines[0] if lines else message.splitlines()[0]
    return re.sub(r" expecting \{[^}]*\}", "", reason)


def check_values(cfg: DictConfig) -> None:
    """--cfg: the printed config's values against their types and ranges and the rules across
    them, as a run checks them first, and nothing of the machine (files, folders, devices: a
    config is often printed to be run elsewhere). One with a key left at ??? or a value that
    does not resolve yet (an experiment's `${approach}`, which its sweep sets) is printed as it
    is, as Hydra prints it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

    from lipt.run.config import run_of
    from lipt.run.rules import check_settings

    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (InterpolationResolutionError, MissingMandatoryValue):
        return
    check_settings(run_of(cfg))


def check_writable(arg: str) -> None:
    """A run or sweep folder named on the command line can be made and written."""
    from lipt.run.preflight import unwritable

    key, _, value = arg.partition("=")
    problem = unwritable(Path(value)) or full(Path(value))
    if problem is not None:
        raise UserError(f"{key}={value} cannot be written ({problem}); choose a writable folder")


# The least free space a run folder's disk must have: Hydra writes .hydra/ and the log first
# (about 10 KiB), and a full disk there ended in Hydra's traceback, a half-written hydra.yaml
# left behind; lipt's own files report a full disk in one line (lipt.core.artifacts).
MIN_FREE_BYTES = 1 << 20


def full(folder: Path) -> str | None:
    """Why `folder` (or the nearest folder above it that exists) is too full to start a run
    in, or None: less than MIN_FREE_BYTES free."""
    import shutil

    probe = folder.expanduser().absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free >= MIN_FREE_BYTES:
        return None
    return f"its disk is full: {free // 1024} KiB free at {probe}; free 1 MiB or more"


def check_output_dir(cfg: DictConfig, multirun: bool) -> None:
    """The folder the run writes (paths.output_dir) can be made and written: the stage makes it
    only once Hydra has started the job. Read with Hydra's node as the job sees it
    (set_hydra_config; a multirun's first job), so `${hydra:job.num}` in it reads as there."""
    from omegaconf import OmegaConf

    from lipt.run.preflight import unwritable

    folder = str(cfg.paths.output_dir)
    problem = unwritable(Path(folder)) or full(Path(folder))
    if problem is None:
        return
    paths = OmegaConf.to_container(cfg.paths)  # as set: not resolved
    if isinstance(paths, dict) and paths.get("output_dir") == HYDRA_JOB_FOLDER:
        key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        raise UserError(
            f"the run folder {folder} cannot be written ({problem}); choose a writable one "
            f"with {key}=..."
        )
    raise UserError(
        f"paths.output_dir={folder} cannot be written ({problem}); choose a writable folder"
    )


def override_hint(e: BaseException) -> str:
    """Where Hydra refused an override: how to set a key that is there, or where the groups
    and options are listed."""
    text = str(e)
    if "Could not append to config. An item is already at" in text:  # +key=value of a key set
        return " (+ adds a new key: key=value or ++key=value sets one that is there)"
    twice = re.match(
        r"Multiple values for (\S+)\. To override a value use 'override \S+: (.+)'", text
    )
    if twice:  # +group=option of a group in the defaults: Hydra answers in a config file's terms
        return f" (on the command line: {twice[1]}={twice[2]})"
    if "Could not find" in text or "Could not override" in text or "Key '" in text:
        return " (see `--help` for the groups and options, `+key=value` adds a new key)"
    return ""
