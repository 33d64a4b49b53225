"""The docs stay true: every command they show runs (tests/doc_check.py), docs/CONFIG.md is what
`python -m lipt.run.config_doc` makes of configs/ today, links resolve, the README stays a
five-minute read, and user-facing docs talk about the software, not its history."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lipt.run.config_doc import render
from tests.doc_check import (
    PATH_KEYS,
    RUN_DIR_KEYS,
    SHELL,
    Session,
    blocks,
    check_doc,
    check_python,
    check_shell,
    shell_commands,
)
from tests.helpers import CONFIGS, ROOT

README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
# The methods' one-page cards (src/lipt/<method>/README.md): their commands are checked too.
CARDS = sorted((ROOT / "src" / "lipt").rglob("README.md"))
USER_DOCS = [*DOCS, *CARDS]
# A line of a code block that is a command a user would type
COMMAND = re.compile(r"^\s*(\$ )?(python|make|lipt-\w+) ")


def prechecked_by_test_experiments(command: str) -> bool:
    """docs/RESULTS.md's sweep commands: tests/test_experiments.py checks that every job of each
    is a job of its experiment's sweep, each of which it composes and checks, and composes one
    with the command's own settings (test_results_doc_sweep_command_composes_every_run): more
    than the precheck this file would run, so they are not checked twice."""
    from tests.test_experiments import results_commands

    return command.startswith("python train.py -m ") and (
        shlex.split(command, comments=True)[3:] in results_commands()
    )


def run_by_test_api(command: str) -> bool:
    """The example of the README and docs/API.md: tests/test_api.py
    (test_the_readme_example_runs_as_written) runs it as written and checks what it prints, so
    it is not run again."""
    return command == "python examples/own_model.py"


def prechecked_as_a_cpu_sweep(command: str) -> bool:
    """`python train.py -m +experiment=table2_cpu` (README, USAGE): the very precheck call that
    tests/test_experiments.py makes (test_the_cli_precheck_passes_each_sweep_with_the_experiments_
    own_params), so it is not made again."""
    from tests.test_experiments import CPU_SWEEPS

    argv = words(command)
    return argv[:3] == ["python", "train.py", "-m"] and argv[3:] in CPU_SWEEPS


def words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:  # an unclosed quote: the checker reports it
        return []


def on_its_own(argv: list[str]) -> bool:
    """A command whose check reads and writes nothing of its doc's session: it neither reads a
    path an earlier command wrote nor names a run folder a later one reads, so its check (in a
    scratch folder of its own) is the same wherever it is shown."""
    joined = " ".join(argv)  # `make run ARGS="..."` included
    return bool(argv) and not any(f"{key}=" in joined for key in (*PATH_KEYS, *RUN_DIR_KEYS))


def first_shown() -> dict[tuple[str, ...], Path]:
    """Each command of a code block -> the first of USER_DOCS that shows it."""
    first: dict[tuple[str, ...], Path] = {}
    for doc in USER_DOCS:
        for block in blocks(doc):
            if block.lang in SHELL:
                for command in shell_commands(block):
                    first.setdefault(tuple(words(command.text)), doc)
    return first


FIRST_SHOWN = first_shown()


def checked_in_an_earlier_doc(doc: Path, command: str) -> bool:
    """A command that another doc shows first (the frontier's sweep: README and METHODS) is
    checked there, by the same check: not again here (each sweep's precheck costs seconds)."""
    argv = words(command)
    return on_its_own(argv) and FIRST_SHOWN.get(tuple(argv), doc) != doc


@pytest.mark.first
@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_in_the_doc_runs(doc, tmp_path):
    own = {"RESULTS.md": prechecked_by_test_experiments}.get(doc.name, run_by_test_api)

    def elsewhere(command: str) -> bool:
        return (
            own(command)
            or prechecked_as_a_cpu_sweep(command)
            or checked_in_an_earlier_doc(doc, command)
        )

    problems = check_doc(doc, tmp_path, elsewhere)
    assert not problems, "\n".join(problems)


def inline_commands(doc: Path) -> list[str]:
    """The commands a doc's prose shows in `backticks` (outside code blocks), less those with a
    placeholder for the reader to fill (`<sweep folder>`, `...`, `[--out DIR]`)."""
    prose = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    shown = re.findall(r"`((?:python|make) [^`]+)`", re.sub(r"\n\s*", " ", prose))
    return [c for c in shown if not re.search(r"<|\.\.\.|\[--", c)]


# RELIABILITY.md's inline commands show refusals; RESULTS.md and SLURM.md are checked with their
# own experiments' and launcher's tests.
PROSE_DOCS = [d for d in USER_DOCS if d.name not in ("RELIABILITY.md", "RESULTS.md", "SLURM.md")]


def shown_before(doc: Path) -> list[str]:
    """The inline commands of the prose docs before `doc`."""
    shown: list[str] = []
    for earlier in PROSE_DOCS[: PROSE_DOCS.index(doc)]:
        shown += inline_commands(earlier)
    return shown


@pytest.mark.parametrize("doc", PROSE_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_in_the_docs_prose_runs(doc, tmp_path):
    """A command written inline in a sentence passes the same checks as one in a code block."""
    problems = []
    # what is checked elsewhere by the same check: an earlier sentence's command (of this doc or
    # an earlier one) and a code block's (test_every_command_in_the_doc_runs)
    checked = {*FIRST_SHOWN, *(tuple(words(c)) for c in shown_before(doc))}
    for command in inline_commands(doc):
        argv = words(command)
        if (on_its_own(argv) and tuple(argv) in checked) or prechecked_as_a_cpu_sweep(command):
            continue
        checked.add(tuple(argv))
        problem = check_shell(command, Session(tmp_path))
        if problem:
            problems.append(f"{doc.relative_to(ROOT)}: `{command}`: {problem}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_command_hides_in_a_block_the_checker_skips(doc):
    """The checker reads ```bash/sh/shell and ```python blocks only: a command shown in a block
    of no language (or another) would go unchecked."""
    for block in blocks(doc):
        if block.lang not in (*SHELL, "python"):
            shown = [line for line in block.text.splitlines() if COMMAND.match(line)]
            assert not shown, f"{doc.relative_to(ROOT)}:{block.line}: tag it ```bash: {shown}"


def test_the_docs_show_commands_of_every_kind_the_checker_knows():
    shown = [b for doc in DOCS for b in blocks(doc) if b.lang in ("bash", "sh", "shell")]
    text = "\n".join(b.text for b in shown)
    for kind in (
        "python train.py",
        "python select.py",
        "python pretrain.py",
        "python train.py -m",
        "python benchmarks/",
        "python examples/",
        "make run",
        "make test",
    ):
        assert kind in text, kind


@pytest.mark.parametrize(
    "command",
    [
        "python train.py selector=nope",  # no such option
        "python train.py fraction=1.5",  # a bad value
        "python train.py -m selector=random,nope",  # a bad value in a sweep
        "python select.py ckpt_path=outputs/nowhere/pretrain.ckpt",  # no earlier command wrote it
        "python train.py --no-such-flag",
        "make no_such_target",
        "make run ARGS='optimizer.lr=0'",
        "python benchmarks/selector_quality.py --no-such-flag",
        "python benchmarks/no_such_benchmark.py",
        "python examples/no_such_example.py",
        "python -m lipt.run.config_doc --no-such-flag",
        "python -m lipt.no_such_module",
        "rm -rf outputs",  # not on the allow-list
        "pip install torch",
        "python -c 'print(1)'",
    ],
)
def test_the_checker_reports_a_broken_command(command, tmp_path):
    assert check_shell(command, Session(tmp_path)) is not None


def test_the_checker_passes_a_chain_of_commands_that_write_and_read_a_run(tmp_path):
    session = Session(tmp_path)
    assert check_shell("python pretrain.py hydra.run.dir=outputs/soup", session) is None
    assert check_shell("python select.py ckpt_path=outputs/soup/pretrain.ckpt", session) is None
    assert check_shell(". .venv/bin/activate", session) is None
    assert check_shell("make report SWEEP=multirun/x", session) is None
    assert (
        check_shell("python benchmarks/selection_cost.py --skip-large  # a comment", session)
        is None
    )


def test_the_checker_runs_python_blocks_for_real():
    assert check_python("import lipt") is None
    assert check_python("raise SystemExit(3)") is not None


def test_config_doc_is_generated_from_the_configs_of_today():
    """Regenerate docs/CONFIG.md: a config key added, removed or re-commented without running
    `python -m lipt.run.config_doc > docs/CONFIG.md` fails here."""
    assert (ROOT / "docs" / "CONFIG.md").read_text() == render(CONFIGS)


def test_config_doc_lists_every_option_key_and_comment(tmp_path):
    import shutil

    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    with (configs / "selector" / "coverage.yaml").open("a") as f:
        f.write("# the width of a made-up knob\nmade_up_knob: 3  # in made-up units\n")
    text = render(configs)
    assert (
        "| `selector.made_up_knob` | `3` | the width of a made-up knob in made-up units |" in text
    )
    for group in ("dataset", "model", "pretrain", "selector", "experiment", "hydra/callbacks"):
        assert f"## Group `{group}`" in text
    assert "### `selector=coverage`" in text and "`none` (default)" in text
    budgets = (
        "`full`, `full_schedule`, `full_steps`, `infobatch`, `infobatch_soup`, `lipt` (default), "
    )
    budgets += "`subset`"
    assert f"- [`budget`](#group-budget): {budgets}" in text


def test_config_doc_needs_neither_hydra_nor_torch_and_no_stage_imports_it():
    code = (
        "import sys, lipt.run.config_doc\n"
        "bad = {'omegaconf', 'hydra', 'torch', 'lightning'} & set(sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    for module in (ROOT / "src" / "lipt").rglob("*.py"):
        if module.name != "config_doc.py":
            assert "config_doc" not in module.read_text(), module


def github_anchor(heading: str) -> str:
    """The id GitHub gives a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    found: set[str] = set()
    in_code = False
    for line in doc.read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(github_anchor(line.lstrip("#")))
    return found


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(doc):
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        assert linked.exists(), f"{doc.name}: {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{doc.name}: {target}"


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_say_what_ran_not_who_ran_it(doc):
    banned = re.compile(
        r"issue ?#?\d|\(issue[:)]|this session|sessions|earlier machine|before the resume fix",
        re.IGNORECASE,
    )
    hits = [line for line in doc.read_text().splitlines() if banned.search(line)]
    assert not hits, hits


def test_readme_is_a_five_minute_read():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 300
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0] == "## Time to accuracy", "right after the intro"
    for section in (
        "## Set-up",
        "## Usage",
        "## What a run writes",
        "## Results",
        "## Tests",
        "## Layout",
        "## Read more",
    ):
        assert section in headings, section
    setup = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    first_block = setup.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in first_block.splitlines()] == [
        ["make", "run"],
        ["make", "test"],
    ]
    tests = text.split("## Tests", 1)[1].split("\n## ", 1)[0]
    # The slowest tests it lists exist (a renamed or removed test leaves the table stale).
    listed = re.findall(r"`(test_\w+\.py)::(test_\w+)", tests)
    assert len(listed) >= 10, listed
    for file, name in listed:
        assert f"def {name}(" in (ROOT / "tests" / file).read_text(), (file, name)
    for word in ("make test", "make test-slow", "make lint", "`slow`", "`ddp`", "`gpu`"):
        assert word in tests, word
    read_more = text.split("## Read more", 1)[1]
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in read_more, doc.name
    assert "https://proceedings.mlr.press/v202/ro23a.html" in text


def api_doc_calls() -> dict[str, str | None]:
    """docs/API.md's signature block: each `lipt.NAME(...)` shown, with its parameter list as
    written (None: the name shown without a call)."""
    (block,) = [b for b in blocks(ROOT / "docs" / "API.md") if b.lang == "text"]
    text = re.sub(r"#[^\n]*", "", block.text)
    calls: dict[str, str | None] = {}
    at = 0
    while found := re.compile(r"lipt\.(\w+)").search(text, at):
        at = found.end()
        if text[at : at + 1] != "(":
            calls.setdefault(found[1], None)
            continue
        depth, end = 0, at
        while True:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
            if depth == 0:
                break
        calls[found[1]] = text[at:end]
        at = end
    return calls


def test_api_doc_shows_each_name_with_the_codes_signature():
    """docs/API.md's block of signatures is the code's: every name of `lipt.__all__` shown, each
    call with the parameters in the code's order, keyword-only where the code's are, and their
    defaults (`...` ends a list shown in part). A parameter added first, or a default changed,
    fails here."""
    import ast
    import inspect

    import lipt

    calls = api_doc_calls()
    (block,) = [b for b in blocks(ROOT / "docs" / "API.md") if b.lang == "text"]
    missing = [n for n in lipt.__all__ if not re.search(rf"\b{n}\b", block.text)]
    assert not missing, f"docs/API.md's signatures do not show {missing}"
    for name, args in calls.items():
        assert name in lipt.__all__, f"docs/API.md shows lipt.{name}, which lipt does not export"
        if args is None:
            continue
        partial = ", ..." in args
        tree = ast.parse(f"def f{args.replace(', ...', '')}: pass").body[0].args  # type: ignore[attr-defined]
        positional = tree.posonlyargs + tree.args
        defaults = [None] * (len(positional) - len(tree.defaults)) + list(tree.defaults)
        shown = [(a.arg, False, d) for a, d in zip(positional, defaults, strict=True)]
        shown += [(a.arg, True, d) for a, d in zip(tree.kwonlyargs, tree.kw_defaults, strict=True)]
        params = list(inspect.signature(getattr(lipt, name)).parameters.values())
        if partial:
            params = params[: len(shown)]
        code = [
            (p.name, p.kind == p.KEYWORD_ONLY, None if p.default is p.empty else p.default)
            for p in params
        ]
        doc = [(n, kw, None if d is None else ast.literal_eval(d)) for n, kw, d in shown]
        assert doc == code, f"docs/API.md: lipt.{name}{args}, but the code has {code}"


def test_design_doc_says_where_each_api_name_lives():
    """DESIGN.md's table of the Python API names, for every name `import lipt` gives, the module
    that defines it."""
    import lipt

    design = (ROOT / "docs" / "DESIGN.md").read_text()
    table = design.split("## The Python API", 1)[1].split("\n\n", 3)[2]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    for name in lipt.__all__:
        module = lipt._API[name].replace(".", "/")
        row = [r for r in rows if f"`{name}`" in r.split(" | ")[0]]
        assert row, f"DESIGN.md's Python API table has no row for {name}"
        where = row[0].split(" | ")[1].strip("`")
        assert f"{module}.py" == where or module.startswith(where.rstrip("/")), (name, where)


# docs/RELIABILITY.md quotes these refusals word for word: (stage, overrides, multirun, quote)
RELIABILITY_QUOTES = [
    (
        "train",
        ["selector=glister", "selector.greedy=sometimes"],
        False,
        "selector=glister: selector.greedy='sometimes' is invalid: input should be 'stochastic' "
        "or 'naive'",
    ),
    ("train", ["fraction=0"], False, "fraction=0 is invalid: input should be greater than 0"),
    (
        "train",
        ["+clean.action=drop"],
        False,
        "clean.action=drop is ignored: clean=none takes no settings; choose a clean option that "
        "takes clean.action, or drop it",
    ),
    (
        "train",
        ["reselect_every=2"],
        False,
        "budget=lipt trains the whole pool, so reselect_every=2 has no subset to re-select; "
        "choose a selector, ",
    ),
    (
        "train",
        ["selector=coverage", "reselect_every=15"],
        False,
        "reselect_every=15 re-selects after every 15 epochs, but trainer.max_epochs=15 ends the "
        "run first, so the subset is never re-selected; ",
    ),
    (
        "train",
        ["+dataset.num_train=100"],
        False,
        "dataset.num_train=100 is ignored: dataset=fashion_mnist's reader "
        "(lipt.data.sources.load_fashion_mnist) takes no num_train; drop it",
    ),
    (
        "select",
        ["clean=lipt", "clean.action=relabel"],
        False,
        "clean.action=relabel changes labels, which select.py's subset.npz does not keep; run "
        "train.py clean=lipt clean.action=relabel (it cleans, selects and trains), or use "
        "clean.action=drop",
    ),
    (
        "train",
        ["hparams_search=lr_wd", "optimizer.lr=tag(log, interval(0.5, 0.01))"],
        True,
        "optimizer.lr=tag(log, interval(0.5, 0.01)): an interval goes from its low end to its "
        "high end; give interval(0.01, 0.5)",
    ),
    (
        "train",
        ["seed=[0,1"],
        False,
        "seed=[0,1 cannot be read: no viable alternative at input '[0,1' (Hydra's override "
        "grammar: ",
    ),
    (
        "train",
        ["optimizer.lr=${nope}"],
        False,
        "optimizer.lr=${nope}: Interpolation key 'nope' not found",
    ),
    (
        "train",
        ["~dataset.flip"],
        False,
        "dataset.flip must be set; pass +dataset.flip=..., or add it to the config file",
    ),
    ("train", ["optim.lr=0.05"], False, "Could not override 'optim.lr'"),
    (
        "train",
        ["seed=0,1"],
        False,
        "seed=0,1 sweeps 2 values: add -m to run a job for each, or give one value (a list is "
        "seed=[0,1])",
    ),
    (
        "train",
        ["budget=full_schedule", "+trainer.min_epochs=6"],
        False,
        "trainer.min_epochs=6 may keep training past the optimiser steps budget=full_schedule "
        "stops at (Lightning ignores a stop before it), beyond the schedule's end; drop "
        "trainer.min_epochs",
    ),
    (
        "train",
        ["callbacks.model_checkpoint.monitor=val/loss"],
        False,
        "callbacks.model_checkpoint.monitor=val/loss with mode=max takes the highest val/loss "
        "for the best; set callbacks.model_checkpoint.mode=min",
    ),
    (
        "train",
        [
            "optimized_metric=val_accuracy",
            "budget=infobatch",
            "fraction=0.1",
            "trainer.max_epochs=15",
            "+trainer.check_val_every_n_epoch=5",
        ],
        False,
        "trainer.check_val_every_n_epoch=5 validates nothing in the 2 epochs budget=infobatch "
        "trains; ",
    ),
    (
        "train",
        ["dataset.data_dir=data/fmnist"],
        False,
        "dataset.data_dir=data/fmnist does not exist; point it at the fashion_mnist data, or "
        "create it (mkdir -p data/fmnist) to download the data into it",
    ),
]


@pytest.mark.parametrize(
    ("stage", "overrides", "multirun", "quote"),
    RELIABILITY_QUOTES,
    ids=[" ".join(case[1]) for case in RELIABILITY_QUOTES],
)
def test_reliability_doc_quotes_the_refusals_as_the_code_words_them(
    stage, overrides, multirun, quote, tmp_path, monkeypatch, capsys
):
    """A refusal RELIABILITY.md quotes is the line the stage prints, word for word (checked as
    the entry script checks a command line, before Hydra starts)."""
    from lipt.run.precheck import precheck

    text = re.sub(r"\s+", " ", (ROOT / "docs" / "RELIABILITY.md").read_text())
    assert quote in text, f"RELIABILITY.md no longer quotes: {quote}"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        precheck(stage, overrides, multirun=multirun)
    assert stopped.value.code == 2
    assert quote in capsys.readouterr().err
