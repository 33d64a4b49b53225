"""The checker behind tests/test_docs.py: every command a doc shows must run.

The ```bash / ```sh / ```shell and ```python blocks of README.md and docs/*.md are read; each
shell line (backslash continuations joined, `# comments` dropped) is checked by what it is:

- `python train.py|select.py|pretrain.py [-m] OVERRIDES`: composed and validated in-process by
  `lipt.run.precheck.precheck`, exactly as the entry script does before Hydra starts (every job
  of a `-m` sweep; the Trainer, loggers, selector and data files included); with
  `hydra/launcher=slurm`, its `hydra.launcher.*` keys are checked against the launcher's config
  and the rest as on any launcher. A path a command reads
  (`ckpt_path`, `subset_path`, `pretrain.merge_from`) must lie in the run or sweep folder of an
  earlier command of the same doc (`hydra.run.dir=` / `hydra.sweep.dir=`); an empty stand-in
  is made there, in a scratch folder, since only its existence is checked.
- `python benchmarks/<name>.py ARGS` and `python -m lipt.<module> ARGS`: the script's own
  argparse parser reads ARGS (its `main` is stopped right after parsing: nothing runs).
- `python examples/<name>.py`: runs for real, from the repository root (examples take seconds).
- `make [VAR=value ...] TARGET ...`: every target exists in the Makefile; `make run ARGS="..."`
  also goes through precheck as `python train.py ...`.
- anything else must match ALLOWED, so a new kind of command fails until someone decides how
  to check it.

```python blocks run for real in a new process (forked from the tests' preloaded Python), from
the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from tests.helpers import ROOT

SHELL = ("bash", "sh", "shell")
STAGES = ("train.py", "select.py", "pretrain.py")
# Shell lines that are not checked further: each a full-line regular expression.
ALLOWED = (
    r"\. \.venv/bin/activate",  # after `make run` or `make install`
    r"source \.venv/bin/activate",
)
# Keys whose value is a file or folder an earlier run wrote (True: a folder).
PATH_KEYS = {"ckpt_path": False, "subset_path": False, "pretrain.merge_from": True}
RUN_DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir")
HYDRA_FLAGS = ("--help", "--hydra-help", "--info", "--cfg")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a doc: its language and first line number (1-based)."""

    doc: Path
    lang: str
    line: int
    text: str


@dataclass(frozen=True)
class Command:
    doc: Path
    line: int
    text: str

    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}: {self.text}"


@dataclass
class Session:
    """What the commands of one doc share: a scratch folder to run in, and the run and sweep
    folders that earlier commands wrote."""

    workdir: Path
    produced: list[str] = field(default_factory=list)


def blocks(doc: Path) -> list[Block]:
    found: list[Block] = []
    lang: str | None = None
    start = 0
    body: list[str] = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        fence = re.match(r"^\s*```\s*([\w+-]*)\s*$", line)
        if fence and lang is None:
            lang, start, body = fence[1].lower(), number + 1, []
        elif fence:
            found.append(Block(doc, str(lang), start, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    return found


def shell_commands(block: Block) -> Iterator[Command]:
    """One Command per logical line: continuations joined, blank and comment lines skipped."""
    pending = ""
    first = block.line
    for offset, raw in enumerate(block.text.splitlines()):
        if not pending:
            first = block.line + offset
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        if text and not text.startswith("#"):
            yield Command(block.doc, first, text)


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, flags=re.M))


class ParsedError(Exception):
    """Raised right after a script's parser accepted its arguments: run nothing more."""


def parse_only(main: Callable[[], object], argv: list[str]) -> str | None:
    """Run `main` with `argv` as sys.argv until its ArgumentParser has parsed it."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        raise ParsedError

    stderr = io.StringIO()
    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop),
        mock.patch.object(sys, "argv", argv),
        contextlib.redirect_stderr(stderr),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        try:
            main()
        except ParsedError:
            return None
        except SystemExit as e:
            return None if e.code in (0, None) else f"exit {e.code}: {stderr.getvalue().strip()}"
    return "the script ended without parsing its arguments"


_SCRIPTS: dict[Path, dict[str, object]] = {}


def script_main(path: Path) -> Callable[[], object]:
    if path not in _SCRIPTS:
        _SCRIPTS[path] = runpy.run_path(str(path), run_name="doc_check")
    main = _SCRIPTS[path].get("main")
    assert callable(main), f"{path} has no main()"
    return main


def check_stage(stage: str, args: list[str], session: Session) -> str | None:
    """`python <stage>.py ARGS` as lipt.run.cli.launch checks it, in the session's scratch
    folder."""
    from lipt.run.precheck import precheck

    flags = [a for a in args if a.startswith("-")]
    overrides = [a for a in args if not a.startswith("-")]
    if any(f in HYDRA_FLAGS for f in flags):
        return None  # Hydra's own flags: no run
    if any(f not in ("-m", "--multirun") for f in flags):
        return f"unknown flag in {flags}"
    for override in overrides:
        key, _, value = override.partition("=")
        if key in PATH_KEYS and value != "last":
            if not any(value.startswith(d.rstrip("/") + "/") for d in session.produced):
                return f"{key}={value} is not in the folder of an earlier command of this doc"
            stand_in = session.workdir / value
            if PATH_KEYS[key]:
                stand_in.mkdir(parents=True, exist_ok=True)
            else:
                stand_in.parent.mkdir(parents=True, exist_ok=True)
                stand_in.touch()
    # A command for a SLURM cluster: its `hydra.launcher.*` keys must be the launcher's; the
    # rest is checked as on any launcher but what only a local launcher refuses (DDP under -m:
    # srun starts a SLURM job's processes; a GPU this machine lacks), the launcher itself
    # running against a real scheduler in tests/test_slurm.py, which asks a cluster that CI
    # starts after this suite.
    on_slurm = "hydra/launcher=slurm" in overrides
    if on_slurm:
        known = set((ROOT / "configs/hydra/launcher/slurm.yaml").read_text().split("\n"))
        for override in overrides:
            key = override.partition("=")[0]
            if key.startswith("hydra.launcher.") and not any(
                line.startswith(key.removeprefix("hydra.launcher.") + ":") for line in known
            ):
                return f"{key} is not a key of hydra/launcher=slurm"
        overrides = [
            o
            for o in overrides
            if o != "hydra/launcher=slurm" and not o.startswith("hydra.launcher.")
        ]
    # A config folder on Hydra's search path is named from the repository root, where the
    # docs' commands run; the check runs in a scratch folder.
    overrides = [
        re.sub(r"file://(?!/)", f"file://{ROOT}/", o) if o.startswith("hydra.searchpath=") else o
        for o in overrides
    ]
    stderr = io.StringIO()
    local_only = "lipt.run.declared_sweep.check_ddp_in_multirun"  # where it is called
    with (
        contextlib.chdir(session.workdir),
        contextlib.redirect_stderr(stderr),
        mock.patch(local_only) if on_slurm else contextlib.nullcontext(),
        # its jobs' GPUs are the nodes', not this machine's
        mock.patch("lipt.run.slurm.submits_to_slurm", return_value=True)
        if on_slurm
        else contextlib.nullcontext(),
    ):
        try:
            precheck(stage.removesuffix(".py"), overrides, multirun=bool(flags))
        except SystemExit as e:
            return f"exit {e.code}: {stderr.getvalue().strip()}"
    for override in overrides:
        key, _, value = override.partition("=")
        if key in RUN_DIR_KEYS:
            session.produced.append(value)
    return None


def check_make(argv: list[str], session: Session) -> str | None:
    targets = makefile_targets()
    assignments = dict(a.split("=", 1) for a in argv if "=" in a)
    wanted = [a for a in argv if "=" not in a]
    missing = [t for t in wanted if t not in targets]
    if missing or not wanted:
        return f"no Makefile target {missing or '(none given)'}"
    if "run" in wanted:  # make run ARGS="..." is python train.py ...
        return check_stage("train.py", shlex.split(assignments.get("ARGS", "")), session)
    return None


def check_shell(command: str, session: Session) -> str | None:
    """None if `command` runs as documented, else what is wrong."""
    try:
        argv = shlex.split(command, comments=True)
    except ValueError as e:  # an unclosed quote
        return f"cannot split into words: {e}"
    if not argv or any(re.fullmatch(pattern, " ".join(argv)) for pattern in ALLOWED):
        return None
    if argv[0] == "make":
        return check_make(argv[1:], session)
    if argv[0] != "python" or len(argv) < 2:
        return f"not a kind of command the doc checker knows (add it to ALLOWED?): {argv[0]}"
    if argv[1] in STAGES:
        return check_stage(argv[1], argv[2:], session)
    if argv[1].startswith("benchmarks/") and argv[1].endswith(".py"):
        path = ROOT / argv[1]
        if not path.is_file():
            return f"no such script {argv[1]}"
        return parse_only(script_main(path), argv[1:])
    if argv[1].startswith("examples/") and argv[1].endswith(".py"):
        if not (ROOT / argv[1]).is_file():
            return f"no such example {argv[1]}"
        return run_python(argv[1], argv[2:])
    if argv[1] == "-m" and len(argv) > 2 and argv[2].startswith("lipt."):
        args = argv[3:]
        if len(args) >= 2 and args[-2] == ">":  # stdout to a file
            args = args[:-2]
        import importlib

        try:
            module = importlib.import_module(argv[2])
        except ImportError as e:
            return f"cannot import {argv[2]}: {e}"
        main = getattr(module, "main", None)
        if not callable(main):
            return f"{argv[2]} has no main()"
        return parse_only(main, [argv[2], *args])
    return f"not a kind of python command the doc checker knows: {' '.join(argv[:2])}"


def run_python(script: str, args: list[str]) -> str | None:
    """`python SCRIPT ARGS` for real, from the repository root: None if it exits 0. Forked from
    the tests' preloaded Python (tests.helpers.run_entry), which has imported torch already."""
    from tests.helpers import run_entry

    done = run_entry(script, args, timeout=300)
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.strip()[-500:]}"
    return None


def check_python(code: str) -> str | None:
    """Run a ```python block for real, from the repository root (as a script file, since the
    preloaded Python runs files)."""
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "block.py"
        script.write_text(code)
        return run_python(str(script), [])


def check_doc(
    doc: Path, workdir: Path, checked_elsewhere: Callable[[str], bool] = lambda _: False
) -> list[str]:
    """Every problem with the commands of one doc, as `path:line: command: problem`.
    `checked_elsewhere(command)`: a command another test already runs through the same check."""
    session = Session(workdir)
    problems: list[str] = []
    for block in blocks(doc):
        if block.lang in SHELL:
            for command in shell_commands(block):
                if checked_elsewhere(command.text):
                    continue
                problem = check_shell(command.text, session)
                if problem:
                    problems.append(f"{command.where()}: {problem}")
        elif block.lang == "python":
            problem = check_python(block.text)
            if problem:
                problems.append(f"{doc.relative_to(ROOT)}:{block.line}: python block: {problem}")
    return problems
