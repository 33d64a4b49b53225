"""The command line's flags as Hydra's own parser reads them, checked before Hydra starts
(lipt.run.cli.launch): what Hydra would not read or would answer with a traceback is refused in
one line, and whether precheck composes the overrides first (is_checked_first), with
--config-dir's folder on the search path (with_config_dir)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from lipt.core.errors import fail


def check_flags(args: list[str]) -> argparse.Namespace:
    """The command line as Hydra's own parser reads it. What Hydra refuses, in one line:
    overrides it would not read (those after a flag that follows an override), --resolve without
    --cfg or --help, and two of its commands at once (-m with --cfg: a traceback there)."""
    from hydra._internal.utils import get_args_parser

    known, unread = get_args_parser().parse_known_args(args)
    if unread:
        flags = " ".join(a for a in args if a.startswith("-"))
        fail(f"{' '.join(unread)} would not be read: give Hydra's flags ({flags}) first")
    if known.resolve and not (known.cfg or known.help):
        fail("--resolve only goes with --cfg job|hydra|all (or --help)")
    if known.shell_completion and not (known.help or known.hydra_help):
        check_shell_completion(known.overrides)
    commands = [
        flag
        for flag, given in (
            ("--run", known.run),
            ("--multirun", known.multirun),
            ("--cfg", known.cfg is not None),
            ("--info", known.info is not None),
            ("--shell-completion", known.shell_completion),
        )
        if given
    ]
    if len(commands) > 1 and not (known.help or known.hydra_help):  # help is answered first
        fix = (
            "--cfg prints one job's config; check a sweep's jobs with -m ... dry_run=true"
            if {"--multirun", "--cfg"} <= set(commands)
            else "Hydra takes one of them"
        )
        fail(f"{' and '.join(commands)} do not go together: {fix}")
    return known


def refuse_rerun(path: str, config_name: str) -> NoReturn:
    """Hydra's --experimental-rerun calls the task with the pickled config alone, without the
    job's Hydra node that every run reads (`${hydra:runtime.output_dir}`: a traceback), or
    raises on a file it lacks: the command that runs the job again, in one line, instead."""
    import pickle
    import shlex

    try:
        with open(path, "rb") as f:
            overrides = list(pickle.load(f).hydra.overrides.task)
    except (OSError, pickle.UnpicklingError, AttributeError, EOFError, ImportError) as e:
        # lipt's runs write no config.pickle (Hydra's PickleJobInfoCallback is not set)
        fail(
            f"--experimental-rerun {path} cannot be read ({type(e).__name__}); run the job "
            f"again with the overrides in its <run>/.hydra/overrides.yaml: python "
            f"{config_name}.py <overrides>"
        )
    again = " ".join(shlex.quote(o) for o in overrides)
    fail(
        f"--experimental-rerun runs a job without its Hydra run folder, which lipt's runs "
        f"need; run it again with its overrides: python {config_name}.py {again}"
    )


# What Hydra's --shell-completion takes: one command, for one of the shells it has a plugin for.
COMPLETION_COMMANDS = ("install", "uninstall", "query")
COMPLETION_SHELLS = ("bash", "zsh", "fish")


def check_shell_completion(overrides: list[str]) -> None:
    """--shell-completion takes one of install=, uninstall= or query= a shell: Hydra answers
    anything else (none given, a shell it has no plugin for) with a traceback."""
    given = [o for o in overrides if o.partition("=")[0] in COMPLETION_COMMANDS]
    if len(given) == 1 and given[0].partition("=")[2] in COMPLETION_SHELLS:
        return
    shells = ", ".join(COMPLETION_SHELLS)
    what = " ".join(given) or "no command"
    fail(
        f"--shell-completion takes one of install=, uninstall= or query= one shell ({shells}), "
        f"not {what}: --shell-completion install=bash"
    )


def is_checked_first(args: argparse.Namespace) -> bool:
    """Whether precheck reads the command line before Hydra: for a run, a multirun and --cfg,
    which prints the config a run would get (a mistake is answered as the run would answer it).
    Hydra's help and --info go straight through, and so does a command line that picks another
    primary config (--config-name, --config-path) or reruns a job. --config-dir only adds a
    folder to the search path (with_config_dir)."""
    return not (
        args.help
        or args.hydra_help
        or args.info is not None
        or args.shell_completion
        or args.config_path
        or args.config_name
        or args.experimental_rerun
    )


def with_config_dir(overrides: list[str], config_dir: str | None) -> list[str]:
    """`overrides` with --config-dir's folder as the first entry of hydra.searchpath: where
    Hydra puts it too (after lipt's configs, ahead of the search path's other entries), so
    precheck composes what the run will."""
    if config_dir is None:
        return overrides
    folder = Path(config_dir).expanduser().resolve()
    if not folder.is_dir():
        fail(f"--config-dir {config_dir}: no such folder; give a folder of config groups")
    quote = '"' if "'" in str(folder) else "'"  # Hydra's grammar reads spaces and commas quoted
    entry = f"{quote}file://{folder}{quote}"
    out, added = [], False
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+") == "hydra.searchpath" and value.startswith("["):
            rest = value[1:].strip()
            o, added = f"{key}=[{entry}{'' if rest == ']' else ','}{rest}", True
        out.append(o)
    return out if added else [*out, f"hydra.searchpath=[{entry}]"]
