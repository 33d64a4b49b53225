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
from tests.doc_check import Session, blocks, check_doc, check_python, check_shell
from tests.helpers import CONFIGS, ROOT

README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
USER_DOCS = [*DOCS, *sorted((ROOT / "src" / "lipt").rglob("README.md"))]


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


@pytest.mark.first
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_in_the_doc_runs(doc, tmp_path):
    elsewhere = {"RESULTS.md": prechecked_by_test_experiments}.get(doc.name, run_by_test_api)
    problems = check_doc(doc, tmp_path, elsewhere)
    assert not problems, "\n".join(problems)


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
