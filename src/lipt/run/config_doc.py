"""docs/CONFIG.md, generated from configs/: every config group, option and key, its default and
the YAML comment that explains it.

    python -m lipt.run.config_doc > docs/CONFIG.md   # or: --out docs/CONFIG.md

A key's description is the comment on its line, else the comment lines right above it; a file's
description is the comment block it opens with. Values are shown as written in the YAML.
tests/test_docs.py regenerates the page and compares, so it cannot go stale.

Plain PyYAML and the standard library: no Hydra, no omegaconf, no torch, and nothing of lipt's
stages imports it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TOP_LEVEL = ("train", "select", "pretrain")  # the entry points' configs, in pipeline order
KEY_LINE = re.compile(
    r"^(?P<indent> *)(?P<key>[^\s#:'\"-][^\s:#]*|'[^']*'|\"[^\"]*\"):(?P<rest>.*)$"
)
ITEM_LINE = re.compile(r"^(?P<indent> *)- (?P<item>.*)$")
MAX_VALUE = 60  # characters of a value shown before it is cut with "…"


@dataclass(frozen=True)
class Key:
    """One key of a config file: its dotted path (under the file's package), its value as
    written (empty for a mapping) and its description (the YAML comment)."""

    path: str
    value: str
    description: str
    mapping: bool = False  # a key holding other keys (shown only where it has a comment)


@dataclass(frozen=True)
class ConfigFile:
    """One YAML file: what its opening comment says, its defaults list and its keys."""

    name: str
    description: str
    package: str  # the prefix of its keys: "" at the top level or for `# @package _global_`
    defaults: list[Key] = field(default_factory=list)
    keys: list[Key] = field(default_factory=list)


def default_config_dir() -> Path:
    """configs/ of the repository (lipt is installed editable), or $LIPT_CONFIG_DIR."""
    env = os.environ.get("LIPT_CONFIG_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "configs"


def split_comment(text: str) -> tuple[str, str]:
    """`value  # comment` -> (value, comment); a `#` inside quotes or `${...}` is not one."""
    quote = ""
    depth = 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(depth - 1, 0)
        elif ch == "#" and depth == 0 and (i == 0 or text[i - 1] in " \t"):
            return text[:i].strip(), text[i + 1 :].strip()
    return text.strip(), ""


def comment_text(line: str) -> str | None:
    """The text of a comment-only line (None for any other line)."""
    stripped = line.strip()
    if not stripped.startswith("#"):
        return None
    return stripped[1:].strip()


def join_comments(lines: Sequence[str]) -> str:
    return " ".join(line for line in lines if line and not line.startswith("@package"))


def leaf_paths(data: Any, prefix: str = "") -> Iterator[str]:
    """Every key path of a loaded YAML mapping (mappings too, not list items)."""
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}{key}"
            yield path
            yield from leaf_paths(value, path + ".")


def shown(value: str) -> str:
    value = value.strip()
    return value if len(value) <= MAX_VALUE else value[: MAX_VALUE - 1] + "…"


def parse(text: str, name: str, package: str) -> ConfigFile:
    """Read one config file's keys, values and comments, line by line; the key paths found are
    checked against PyYAML's reading of the same text."""
    lines = text.splitlines()
    if "@package _global_" in text:
        package = ""
    data = yaml.safe_load(text) or {}
    # The opening comment block describes the file.
    head: list[str] = []
    i = 0
    while i < len(lines) and comment_text(lines[i]) is not None:
        head.append(str(comment_text(lines[i])))
        i += 1
    pending: list[str] = []  # comment lines right above the next key
    stack: list[tuple[int, str]] = []  # (indent, key) of the mappings we are in
    keys: list[Key] = []
    defaults: list[Key] = []
    block_indent: int | None = None  # inside a block scalar (`key: |`) until the indent drops
    in_defaults = False
    for line in lines[i:]:
        indent = len(line) - len(line.lstrip(" "))
        if block_indent is not None:
            if not line.strip() or indent > block_indent:
                continue
            block_indent = None
        comment = comment_text(line)
        if not line.strip():
            pending = []
            continue
        if comment is not None:
            pending.append(comment)
            continue
        item = ITEM_LINE.match(line)
        if item:
            value, same_line = split_comment(item["item"])
            if in_defaults:
                defaults.append(Key("defaults", value, join_comments([*pending, same_line])))
            pending = []
            continue
        if line.strip() in ("{}", "[]"):  # a file that sets nothing
            continue
        match = KEY_LINE.match(line)
        if not match:
            raise ValueError(f"{name}: cannot read line {line!r}")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = match["key"].strip("'\"")
        path = ".".join([*(k for _, k in stack), key])
        value, same_line = split_comment(match["rest"])
        description = join_comments([*pending, same_line])
        pending = []
        in_defaults = path == "defaults"
        if in_defaults:
            continue
        if value in ("|", ">", "|-", ">-", "|+", ">+"):
            block_indent = indent
            loaded = nested(data, path)
            first = str(loaded).strip().splitlines()[0] if str(loaded).strip() else ""
            value = f"{first} …" if str(loaded).strip().count("\n") else first
        elif not value:
            stack.append((indent, key))
        full = f"{package}.{path}" if package else path
        keys.append(Key(full, shown(value), description, mapping=not value))
    found = [k.path for k in keys]
    expected = [f"{package}.{p}" if package else p for p in leaf_paths(data) if p != "defaults"]
    if found != expected:
        raise ValueError(f"{name}: read keys {found}, PyYAML reads {expected}")
    return ConfigFile(name, join_comments(head), package, defaults, keys)


def nested(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


def cell(text: str) -> str:
    """Text for a Markdown table cell."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def code(text: str) -> str:
    if not text:
        return ""
    tick = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    escaped = text.replace("|", "\\|")
    return f"{tick}{pad}{escaped}{pad}{tick}"


def prose(text: str) -> str:
    """Comment text for a Markdown paragraph: `<time>` would read as an HTML tag."""
    return text.replace("<", "&lt;").replace(">", "&gt;")


def key_table(keys: Sequence[Key]) -> list[str]:
    keys = [k for k in keys if not k.mapping or k.description]
    if not keys:
        return ["(no keys of its own)", ""]
    rows = ["| key | default | description |", "| --- | --- | --- |"]
    rows += [f"| `{k.path}` | {code(k.value)} | {cell(k.description)} |" for k in keys]
    return [*rows, ""]


def group_defaults(top: ConfigFile) -> dict[str, str]:
    """Group -> its default option, from a top-level defaults list (`- group: option`)."""
    chosen: dict[str, str] = {}
    for entry in top.defaults:
        if ":" in entry.value:
            group, option = (s.strip() for s in entry.value.split(":", 1))
            chosen[group.removeprefix("optional ").strip()] = option
    return chosen


def groups(config_dir: Path) -> list[str]:
    """Every group folder under config_dir (nested ones as `hydra/callbacks`), sorted."""
    return sorted(
        str(p.relative_to(config_dir))
        for p in config_dir.rglob("*")
        if p.is_dir() and any(p.glob("*.yaml"))
    )


def render(config_dir: Path) -> str:
    """The whole of docs/CONFIG.md."""
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m lipt.run.config_doc > docs/CONFIG.md` from configs/; do not",
        "     edit by hand: tests/test_docs.py regenerates it and fails when it differs. -->",
        "",
        "Every config group, option and key of `configs/`, with its default and the comment that",
        "explains it in the YAML. Override any key on the command line (`python train.py",
        "fraction=0.05 optimizer.lr=0.05`), pick an option of a group with `group=option`",
        "(`selector=glister`), add an experiment with `+experiment=<name>`. A value `${...}` is",
        "an interpolation: it follows the key it names. Generated from the YAML files by",
        "`python -m lipt.run.config_doc > docs/CONFIG.md`.",
        "",
        "## Entry points",
        "",
    ]
    tops = [parse((config_dir / f"{n}.yaml").read_text(), f"{n}.yaml", "") for n in TOP_LEVEL]
    chosen = group_defaults(tops[0])
    for top in tops:
        out += [f"### `{top.name}`", "", prose(top.description), ""]
        if top.defaults:
            out += ["| defaults | description |", "| --- | --- |"]
            out += [f"| `{d.value}` | {cell(d.description)} |" for d in top.defaults]
            out.append("")
        out += key_table(top.keys)
    out += ["## Groups", ""]
    names = groups(config_dir)
    for group in names:
        options = sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
        marked = chosen.get(group, "")
        listed = ", ".join(f"`{o}`" + (" (default)" if marked == o else "") for o in options)
        out.append(f"- [`{group}`](#group-{group.replace('/', '')}): {listed}")
    out.append("")
    for group in names:
        package = group.replace("/", ".")
        out += [f"## Group `{group}`", ""]
        default = chosen.get(group)
        if default == "null":  # in the defaults list, none chosen unless asked
            line = f"`{group}=<option>`; default: none."
        elif default:
            line = f"`{group}=<option>`; default: `{default}`."
        elif group.startswith("hydra/"):  # in Hydra's own defaults list: chosen, not added
            line = f"`{group}=<option>`; default: Hydra's own."
        else:
            line = f"`+{group}=<option>`."
        out += [line, ""]
        for path in sorted((config_dir / group).glob("*.yaml")):
            option = parse(path.read_text(), f"{group}/{path.name}", package)
            out += [f"### `{group}={path.stem}`", ""]
            if option.description:
                out += [prose(option.description), ""]
            if option.defaults:
                listed = ", ".join(f"`{d.value}`" for d in option.defaults)
                out += [f"Defaults list: {listed}.", ""]
            out += key_table(option.keys)
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=Path, default=default_config_dir(), help="configs/")
    parser.add_argument("--out", type=Path, default=None, help="write here (default: stdout)")
    args = parser.parse_args(argv)
    text = render(args.configs)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
