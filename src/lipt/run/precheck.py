"""The command line checked before Hydra starts: what `launch` runs first.

The overrides are composed as Hydra will compose them, a sweep's every value and every job
(what they sweep: lipt.run.sweep_overrides), and held to the run's checks, so a mistake anywhere
in a multirun ends with one line on stderr and exit code 2 before any job starts or anything is
written. `${hydra:...}` in an override reads Hydra's node as the job will (`set_hydra_config`),
and so does the run folder, checked here since the stage makes it only once the job has started.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lipt.core.errors import UserError, fail, one_line
from lipt.run.approach_pins import check_approach_choices, check_reference_takes
from lipt.run.sweep_overrides import candidate_overrides, check_sweeps, declared_sweep, every_job
from lipt.run.sweep_settings import HYDRA_JOB_FOLDER


def config_dir() -> Path:
    """configs/ of the repository (lipt is installed editable), or $LIPT_CONFIG_DIR."""
    env = os.environ.get("LIPT_CONFIG_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[3] / "configs"
    if not (path / "train.yaml").is_file():
        fail(f"no lipt configs at {path}; set LIPT_CONFIG_DIR to the repository's configs/")
    return path


def set_hydra_config(composed: DictConfig, multirun: bool) -> None:
    """Hydra's node as a run's job sees it (hydra.core.utils.run_job: the mode, the job's
    folder; a multirun's first job), so that `${hydra:...}` in an override resolves here as it
    will in the run. Unset at the end of precheck."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict, read_write
    from omegaconf.errors import OmegaConfBaseException

    cfg = copy.deepcopy(composed)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.MULTIRUN if multirun else RunMode.RUN
        if multirun:
            cfg.hydra.job.id = 0
            cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)  # what ${hydra:...} in the folder reads, as in run_job
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        folder = str(OmegaConf.select(cfg, key))
    except (OmegaConfBaseException, ValueError) as e:
        reason = " ".join(str(e).splitlines()[0].split())
        raise UserError(f"{key} does not resolve ({reason}); give a folder that does") from e
    if multirun:
        # A subdir of the job's own keys (${approach}) does not resolve: the sweep folder
        # stands for it.
        with contextlib.suppress(OmegaConfBaseException, ValueError):
            folder = os.path.join(folder, str(OmegaConf.select(cfg, "hydra.sweep.subdir")))
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = os.path.abspath(folder)
    HydraConfig.instance().set_config(cfg)


def compose_jobs(
    config_name: str,
    jobs: list[list[str]],
    composed: dict[tuple[str, ...], DictConfig] | None = None,
) -> Generator[DictConfig, None, None]:
    """Each job's config as `hydra.compose` makes it, without Hydra's node. Jobs that differ
    only in plain values, not in a config group's choice, share one composition: Hydra sets
    those values after composing the defaults, and so does this, with Hydra's own function
    (a sweep's seeds and fractions cost a copy, not a composition of ~30 files). `composed`:
    the compositions by their group choices, kept across calls (filled here)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    composed = {} if composed is None else composed
    parser = OverridesParser.create()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        loader = hydra.config_loader
        assert isinstance(loader, ConfigLoaderImpl)
        # Hydra's repository of config files depends on the job's hydra.searchpath alone: made
        # once (it reads the primary config: most of a job's cost in a sweep of values)
        repos: dict[tuple[str, ...], Any] = {}
        for job in jobs:
            # as Hydra's defaults list tells them apart (hydra._internal.defaults_list.Overrides)
            parsed = parser.parse_overrides(job)
            own = tuple(str(o.input_line) for o in parsed if o.is_hydra_override())
            if own not in repos:
                repos[own] = loader._parse_overrides_and_create_caching_repo(config_name, job)[1]
            repo = repos[own]
            is_value = [
                not o.is_hydra_override()
                and (isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group))
                for o in parsed
            ]
            groups = tuple(line for line, value in zip(job, is_value, strict=True) if not value)
            if groups not in composed:
                composed[groups] = compose(config_name, list(groups), return_hydra_config=False)
            cfg = copy.deepcopy(composed[groups])
            values = [o for o, value in zip(parsed, is_value, strict=True) if value]
            ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
            yield cfg


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
    try:
        from lipt.core.lock import check_unlocked  # before Hydra writes .hydra/ into it

        ddp_child = os.environ.get("LOCAL_RANK", "0") != "0"  # shares its rank 0's folder
        for arg in [] if show_config else args:
            if arg.startswith("hydra.run.dir=") and not ddp_child:
                check_unlocked(Path(arg.split("=", 1)[1]))
            if arg.startswith(("hydra.run.dir=", "hydra.sweep.dir=")):
                check_writable(arg)
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            declared = declared_sweep(config_name, args, multirun, show_config, run_flag)
            args, params = check_sweeps(args, declared)
            check_approach_choices(args, params, declared)
            check_reference_takes(args, params, declared)
        assert declared.composed is not None
        set_hydra_config(declared.composed, declared.multirun)
        # Hydra's own settings are not the run's, but its search path finds a user's config files.
        overrides = [
            a
            for a in args
            if a.startswith("hydra.searchpath=") or not a.startswith(("hydra.", "hydra/"))
        ]
        jobs: list[list[str]] = []  # a single run's one job is its candidate
        if show_config:
            assert declared.single is not None
            check_values(declared.single)
            return None
        if declared.single is not None:
            composed: Iterable[DictConfig] = [declared.single]
        else:
            candidates = candidate_overrides(overrides, params)
            composed = opened(compose_jobs(config_name, declared.with_reference(candidates), kept))
            jobs = declared.with_reference(every_job(overrides, params))
        configs = []
        for cfg in composed:
            validate(cfg, deep=False)
            declared.check_job(cfg)
            check_output_dir(cfg, declared.multirun)
            configs.append(cfg)
        # then what builds the Trainer, selector, ... (imports torch)
        runs = [validate(cfg) for cfg in configs]
        for cfg in opened(compose_jobs(config_name, jobs, kept)):  # the rules across keys
            validate(cfg, build=False)
            declared.check_job(cfg)
        if not any(run.settings.dry_run for run in runs):
            return None
        from lipt.run.preflight import build_everything

        loaded: dict[str, Any] = {}
        for run in runs:
            build_everything(run, loaded)
        return max(len(jobs), 1)
    except (HydraException, OmegaConfBaseException, UserError) as e:
        fail(refusal_line(e, given))
    finally:
        for generator in generators:  # left mid-way by a refusal: their Hydra context ends now
            generator.close()
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = hydra_config  # Hydra sets the run's own


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
