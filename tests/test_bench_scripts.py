"""The benchmark scripts under benchmarks/: their resumed runs stand only for runs with the same
settings, and bad arguments end in one line before any measuring."""

from __future__ import annotations

import argparse
import json
import re
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

from lipt.core.errors import EXIT_USER_ERROR, UserError
from lipt.run.config import validate

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["dataset=synthetic", "model.width=8", "batch_size=32", "trainer.accelerator=cpu"]


def script(name: str) -> dict[str, Any]:
    """The globals of benchmarks/<name>.py, loaded as the doc checker loads it (not run)."""
    return runpy.run_path(str(ROOT / "benchmarks" / f"{name}.py"), run_name="bench_test")


def quality_args(out: Path, epochs: int) -> argparse.Namespace:
    return argparse.Namespace(
        out=str(out),
        epochs=epochs,
        pretrain="none",
        override=SMALL,
        reselect_every=0,
        cached_only=False,
    )


def test_selector_quality_refuses_a_finished_run_of_other_settings(tmp_path: Path) -> None:
    """A run finished with --epochs 1 in the same --out stood for --epochs 3's, silently: the
    table headed "3 epochs" showed the 1-epoch accuracy. It is refused in one line now, and
    still reused where the settings are the same."""
    sq = script("selector_quality")
    out = tmp_path / "random" / "f0.1" / "seed0"
    earlier = quality_args(tmp_path, epochs=1)
    overrides = [f"paths.output_dir={out}", "selector=random", "fraction=0.1"]
    run = validate(sq["compose_config"]("train", [*overrides, *sq["common"](earlier, 0)]))
    out.mkdir(parents=True)
    summary = {"config": dict(run.config), "test_accuracy": 0.5, "stages": {"train": {}}}
    (out / "summary.json").write_text(json.dumps(summary, default=str))

    assert sq["run_one"]("random", 0.1, 0, earlier)["test_accuracy"] == 0.5  # same settings
    # early stopping's patience follows the epochs (callbacks/default.yaml)
    was = "trainer.max_epochs=1, callbacks.early_stopping.patience=1"
    with pytest.raises(UserError, match=re.escape(f"{was}, this run has trainer.max_epochs=3")):
        sq["run_one"]("random", 0.1, 0, quality_args(tmp_path, epochs=3))


def test_selector_quality_checks_every_run_before_training(tmp_path: Path) -> None:
    sq = script("selector_quality")
    args = quality_args(tmp_path, epochs=1)
    args.selectors, args.fractions = ["random"], [0.1, 1.5]
    with pytest.raises(UserError, match=re.escape("fraction=1.5")):
        sq["check_settings"](args)
    assert not list(tmp_path.iterdir())  # nothing ran


def test_a_bad_override_ends_a_benchmark_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sq = script("selector_quality")
    argv = ["selector_quality.py", "--selectors", "nosuch", "--out", "/nonexistent/out"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as ended, sq["user_errors"]():
        sq["main"]()
    assert ended.value.code == EXIT_USER_ERROR
    assert capsys.readouterr().err.strip() == "error: In 'train': Could not find 'selector/nosuch'"


@pytest.mark.parametrize("bad", [["--repeats", "0"], ["--images", "0"], ["--eval-batches", "0"]])
def test_throughput_refuses_counts_below_one(
    bad: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--repeats 0` ended in a traceback (min() of no timings) after loading the data."""
    monkeypatch.setattr(sys, "argv", ["throughput.py", *bad])
    with pytest.raises(SystemExit) as ended:
        script("throughput")["main"]()
    assert ended.value.code == 2
    assert f"{bad[0]} " in capsys.readouterr().err


def test_a_result_file_of_other_settings_is_refused_not_overwritten(tmp_path: Path) -> None:
    """A re-run with other arguments (one more seed) rewrote --json with its first row: every
    row the earlier run had measured was lost, without a word."""
    measure = script("measure")
    path = tmp_path / "rows.json"
    first = measure["ResultFile"](path, {"seeds": [0, 1]})
    first.measure({"seed": 0}, lambda: {"seed": 0, "seconds": 1.0})
    with pytest.raises(UserError, match=r"seeds=\[0, 1\], this run has seeds=\[0, 1, 2\]"):
        measure["ResultFile"](path, {"seeds": [0, 1, 2]})
    assert json.loads(path.read_text())["rows"][0]["seconds"] == 1.0  # kept
    again = measure["ResultFile"](path, {"seeds": [0, 1]})  # the same arguments resume
    assert again.measure({"seed": 0}, pytest.fail)["seconds"] == 1.0


def tax_row(strategy: str, variant: str, seed: int, accuracy: float, seconds: float) -> dict:
    return {
        "strategy": strategy,
        "variant": variant,
        "seed": seed,
        "seconds": seconds,
        "samples": 10,
        "unique_samples": 10,
        "test_accuracy": accuracy,
    }


def test_pretrain_tax_gives_each_jigsaw_variant_its_own_accuracy() -> None:
    """With two --variant runs the jigsaw line showed the last variant's seconds beside the
    mean accuracy of both variants' runs pooled."""
    tax = script("pretrain_tax")
    args = tax["parse_args"](["--seeds", "2", "--variant", "a:", "--variant", "b:x=1"])
    rows = [
        tax_row(strategy, variant, seed, accuracy + seed / 100, seconds)
        for seed in (0, 1)
        for strategy, variant, accuracy, seconds in (
            ("full", "", 0.80, 100.0),
            ("jigsaw", "a", 0.60, 10.0),
            ("jigsaw", "b", 0.70, 12.0),
            ("random", "", 0.75, 0.0),
        )
    ]
    text = tax["table"](args, rows)
    assert "| jigsaw (defaults) [a] | 10.0 | - | 10 | 10 | 60.50 ± 0.71 |" in text
    assert "| jigsaw (defaults) [b] | 12.0 | - | 10 | 10 | 70.50 ± 0.71 |" in text
    assert "full / jigsaw [a]: wall time 10.00x" in text


def test_pretrain_tax_prints_each_seeds_ratio_beside_the_mean() -> None:
    tax = script("pretrain_tax")
    args = tax["parse_args"](["--tax-only", "--seeds", "2"])
    rows = [tax_row("full", "", s, 0.0, 100.0 + 20 * s) for s in (0, 1)]
    rows += [tax_row("jigsaw", "", s, 0.0, 10.0) for s in (0, 1)]
    assert "| 11.0x (10.0, 12.0) |" in tax["tax_table"](args, rows)


def test_label_issues_refuses_a_bad_noise_before_measuring(tmp_path: Path) -> None:
    li = script("label_issues")
    with pytest.raises(UserError, match=re.escape("--noise 'symmetric0.3': give kind:rate")):
        li["config_of"]("lipt", "symmetric0.3", 11, 0, tmp_path, [])


def test_label_issues_imports_cleanlab_before_the_first_row_is_timed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first row measured paid cleanlab's import in its detection seconds, the others not."""
    main = script("label_issues")["main"]
    imported = []

    def detect(*args: Any) -> dict[str, Any]:
        imported.append("cleanlab.filter" in sys.modules)
        raise KeyboardInterrupt  # one row is enough

    monkeypatch.setitem(main.__globals__, "detect", detect)
    monkeypatch.delitem(sys.modules, "cleanlab.filter", raising=False)
    argv = ["label_issues.py", "--noise", "pairs:0.25", "--seeds", "0", "--methods", "lipt"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path), "--threads", "0"])
    with pytest.raises(KeyboardInterrupt):
        main()
    assert imported == [True]


@pytest.mark.parametrize(
    ("name", "argv", "says"),
    [
        ("cords_compare", ["--selectors", "random"], "invalid choice: 'random'"),
        ("slurm_jigsaw", ["--per-task", "0"], "--per-task [0]"),
        ("selection_cost", ["--repeats", "0"], "--repeats 0"),
        ("cords_compare", ["--repeats", "0"], "--repeats 0"),
    ],
)
def test_bad_arguments_end_in_one_line(
    name: str,
    argv: list[str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`cords_compare.py --selectors random` timed CORDS' CRAIG against lipt's random under the
    name random; the others ended in a traceback after their first measurements."""
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    with pytest.raises(SystemExit) as ended:
        script(name)["main"]()
    assert ended.value.code == 2
    assert says in capsys.readouterr().err


def test_datalab_markdown_names_the_command_that_made_it() -> None:
    """The --markdown file said `nice -n 10` and "shared with other work", and a fixed command,
    whatever the run's own were."""
    header = script("datalab_issues")["markdown_header"]("host: X", ["--seeds", "0"])
    assert header.endswith("python benchmarks/datalab_issues.py --seeds 0")
    assert "shared with other work" not in header


def test_threads_zero_is_torchs_count_and_a_negative_one_is_refused() -> None:
    """`label_issues.py --threads 0` ended in set_num_threads' RuntimeError traceback."""
    import torch

    pinned = script("measure")["pinned"]
    before = torch.get_num_threads()
    with pinned(0):
        assert torch.get_num_threads() == before
    with pytest.raises(SystemExit, match="--threads -1"), pinned(-1):
        pass


def test_throughput_times_the_plain_loop_in_the_layout_of_lipts_batches_too() -> None:
    """lipt's resident crop hands grey batches channels_last strides, which pick faster CPU
    kernels: against a plain loop in NCHW alone, the layout read as lipt's lead (1.15-1.45x)."""
    import torch
    from torch import nn

    strides = []
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.LazyLinear(10))
    model[0].register_forward_pre_hook(lambda _, args: strides.append(args[0].stride()))
    x, y = torch.randn(8, 1, 6, 6), torch.randint(0, 10, (8,))
    plain_epoch = script("throughput")["plain_epoch"]
    plain_epoch(model, x, y, False)
    plain_epoch(model, x, y, False, channels_last=True)
    assert strides == [(36, 36, 6, 1), (36, 1, 6, 1)]
