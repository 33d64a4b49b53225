"""What a user sees: stage lines, bars on a terminal only, the closing block, one line per
multirun job, run folders named after the stage, --help, subset.png, wandb extras."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from lipt.core import console
from lipt.jigsaw.learner import Learner, learner_shards, state_digest
from lipt.jigsaw.merge import HeldOut, bn_positions, merge_learners
from lipt.report.pictures import sample_grid, write_subset_picture
from lipt.run.config import run_of, validate
from lipt.selection import PoolOutputs, SelectionInputs, select_balanced, select_glister
from lipt.stages.build import build_datamodule, build_model, build_part, build_parts
from tests.helpers import CONFIGS, ROOT, run_entry
from tests.test_jigsaw import JIGSAW

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RUN_FOLDER = re.compile(r"\d{4}-\d{2}-\d{2}/\d{2}-\d{2}-\d{2}")
# Tiny end-to-end settings: three learners, three ratios, 50 of 500 images.
BASE = [
    "dataset=synthetic",
    "model.width=8",
    "batch_size=32",
    "trainer.max_epochs=2",
    "logger=none",
]
TINY = [*BASE, "pretrain.num_learners=3", "pretrain.local_epochs=2", "merge.ratios=3"]
STAGE_LINES = {
    "train": (
        "pre-training: jigsaw, 3 learners x 1 batch x 2 passes",
        "selecting 50 of 500 with coverage",
        "training: ConvNet, 2 epochs on 50 images (10% of the pool)",
    ),
    "select": ("pre-training: none", "selecting 50 of 500 with el2n"),
    "pretrain": ("pre-training: jigsaw, 3 learners x 1 batch x 2 passes", "  soup: held-out"),
}
STAGE_ARGS = {
    "train": [*TINY, "selector=coverage"],  # the subset pipeline: every stage shows
    "select": [*BASE, "pretrain=none", "selector=el2n"],
    "pretrain": TINY,
}


# --------------------------------------------------------------------------- running


def run_script(
    script: str, args: Sequence[str], cwd: Path, terminal: bool, timeout: float = 600
) -> tuple[int, str]:
    """Run an entry script as a user would, its output on a pseudo-terminal or a pipe; returns
    (exit code, everything it printed, stdout and stderr together)."""
    command = [sys.executable, str(ROOT / script), *args]
    env = {"TERM": "xterm", "COLUMNS": "120"}
    if not terminal:  # forked from the preloaded Python (tests.helpers.run_entry)
        out = run_entry(str(ROOT / script), args, cwd, timeout, env, stderr_to_stdout=True)
        return out.returncode, out.stdout
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    import fcntl
    import pty
    import struct
    import termios

    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdin=child_fd, stdout=child_fd, stderr=child_fd
    )
    os.close(child_fd)
    chunks = []
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main_fd)
    return proc.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")


def screen_lines(raw: str) -> list[str]:
    """The lines as they stay on screen: escape sequences dropped, a line redrawn with carriage
    returns read as its last frame, progress-bar frames (drawn with ━) left out."""
    lines = []
    for line in ANSI.sub("", raw).split("\n"):
        frames = [f for f in line.split("\r") if f.strip()]
        if frames and "━" not in frames[-1]:
            lines.append(frames[-1].rstrip())
    return lines


def only_run_folder(cwd: Path, stage: str) -> Path:
    folders = [p for p in (cwd / "outputs").glob("*/*/*") if p.is_dir()]
    assert len(folders) == 1, folders
    relative = folders[0].relative_to(cwd / "outputs").as_posix()
    assert relative.startswith(f"{stage}/") and RUN_FOLDER.fullmatch(relative.split("/", 1)[1])
    return folders[0]


def check_stage_run(stage: str, raw: str, cwd: Path) -> Path:
    lines = screen_lines(raw)
    for needle in STAGE_LINES[stage]:
        hits = [line for line in lines if line.startswith(needle)]
        assert len(hits) == 1, (needle, lines)
    repeated = {line for line in lines if line.strip() and lines.count(line) > 1}
    assert not repeated, repeated
    for notice in ("litlogger", "_pytree", "LeafSpec", "GPU available", "[HYDRA]"):
        assert notice not in raw, notice
    folder = only_run_folder(cwd, stage)
    summary = json.loads((folder / "summary.json").read_text())
    block = lines[lines.index("done.") :]
    path_of = {line.split()[0]: line.split()[-1] for line in block[1:]}
    assert (cwd / path_of["summary.json"]).resolve() == (folder / "summary.json").resolve()
    if summary["test_accuracy"] is not None:
        assert f"  test accuracy     {summary['test_accuracy']:.4f}" in block
    if summary["subset_size"] is not None:
        assert (cwd / path_of["subset.npz"]).resolve() == (folder / "subset.npz").resolve()
        assert (folder / "subset.png").is_file()
    log = (folder / f"{stage}.log").read_text()  # the notices are kept in the run's log file
    assert STAGE_LINES[stage][0] in log
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("terminal", [True, False], ids=["pty", "piped"])
def test_train_shows_each_stage_once_and_closes_with_the_result(tmp_path, terminal):
    code, raw = run_script("train.py", STAGE_ARGS["train"], tmp_path, terminal)
    assert code == 0, raw[-3000:]
    folder = check_stage_run("train", raw, tmp_path)
    assert "litlogger" in (folder / "train.log").read_text()
    assert "checkpoints/last.ckpt" in raw
    if terminal:  # rich bars for the learners, the merge, the selection and Lightning's
        for bar in ("pre-training: learners", "merging: candidates", "rows scored", "Epoch 1/1"):
            assert bar in raw, bar
        assert re.search(r"learner 2: held-out 0\.\d{3}", raw)
    else:
        assert "\x1b[" not in raw and "━" not in raw


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["select", "pretrain"])
def test_stage_scripts_piped(tmp_path, stage):
    code, raw = run_script(f"{stage}.py", STAGE_ARGS[stage], tmp_path, terminal=False)
    assert code == 0, raw[-3000:]
    check_stage_run(stage, raw, tmp_path)
    assert "\x1b[" not in raw


@pytest.mark.slow
def test_multirun_prints_one_line_per_job_and_a_table(tmp_path):
    args = ["-m", "selector=random,el2n", "pretrain=none", *BASE]
    code, raw = run_script("train.py", args, tmp_path, terminal=False)
    assert code == 0, raw[-3000:]
    lines = screen_lines(raw)
    jobs = [line for line in lines if re.match(r"#\d ", line)]
    assert [j.split()[0] for j in jobs] == ["#0", "#1"], lines
    assert all(re.search(r"test 0\.\d{4}  subset 50 ", j) for j in jobs)
    assert not any(line.startswith(("training:", "selecting ", "done.")) for line in lines)
    table = lines.index(next(line for line in lines if line.startswith("sweep of 2 runs")))
    rows = {line.split()[0] for line in lines[table + 2 : table + 4]}
    assert rows == {"random", "el2n"}, lines
    assert len(lines) == len(set(lines)) and "\x1b[" not in raw


# --------------------------------------------------------------------------- quick checks


@pytest.mark.parametrize("stage", ["train", "select", "pretrain"])
def test_run_folder_log_file_and_help_are_named_after_the_stage(stage):
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose(stage, return_hydra_config=True)
    assert cfg.hydra.job.name == stage
    run_dir = str(cfg.hydra.run.dir)
    assert run_dir.startswith(f"outputs/{stage}/") and RUN_FOLDER.fullmatch(
        run_dir[9 + len(stage) :]
    )
    assert str(cfg.hydra.sweep.dir).startswith(f"multirun/{stage}/")
    assert cfg.hydra.help.header.startswith(f"{stage}: ")


@pytest.mark.parametrize("stage", ["train", "select"])
def test_help_opens_with_the_stage_and_what_it_does(stage):
    out = subprocess.run(
        [sys.executable, str(ROOT / f"{stage}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith(f"{stage}: ") and "subset" in first
    assert "powered by Hydra" not in out.stdout


def test_terminal_filter_keeps_lipt_lines_and_warnings_not_third_party_notices():
    keep = console.TerminalFilter().filter

    def record(name: str, level: int, msg: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, msg, None, None)

    assert keep(record("lipt", logging.INFO, "selecting 5,500 of 55,000 with glister"))
    assert keep(record("lipt.jigsaw", logging.WARNING, "jigsaw learner 3 diverged"))
    assert keep(record("lightning.pytorch.core", logging.WARNING, "a real problem"))
    assert not keep(
        record("lightning.pytorch.utilities.rank_zero", logging.INFO, "💡 Tip: litlogger")
    )
    assert not keep(record("lipt.detail", logging.INFO, "learner 1/10: held-out 0.41"))
    site = "/venv/lib/python3.11/site-packages/lightning/pytorch/utilities/_pytree.py:21: "
    assert not keep(record("py.warnings", logging.WARNING, site + "LeafSpec is deprecated"))
    # A checkout named lipt/ holds its venv: a library's warning from there is still a library's.
    checkout = "/home/me/lipt/.venv/lib/python3.11/site-packages/lightning/pytorch/x.py:1: "
    assert not keep(record("py.warnings", logging.WARNING, checkout + "deprecated"))
    own = f"{console.PACKAGE_DIR}stages{os.sep}train.py:3: mind this"
    assert keep(record("py.warnings", logging.WARNING, own))


def test_lightning_lines_reach_the_terminal_once_after_setup():
    import lightning  # noqa: F401  (its import adds its own console handler)

    logger = logging.getLogger("lightning")
    logger.addHandler(logging.StreamHandler())
    try:
        console.setup(multirun_job=False)
        assert logger.handlers == [] and logger.propagate  # only the root's handlers print it
        assert not console.bars_enabled()  # pytest's stdout is not a terminal
    finally:
        logging.captureWarnings(False)


def _pool(n: int, classes: int, dim: int, seed: int) -> PoolOutputs:
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(classes, dim, generator=g)
    targets = torch.randint(classes, (n,), generator=g)
    h = torch.randn(n, dim, generator=g).relu() + 0.5 * weight[targets].clamp_min(0)  # [n, D]
    return PoolOutputs(h @ weight.T, h, targets, torch.arange(n))


def test_pick_progress_counts_the_budget_and_changes_nothing():
    # D=128 ReLU features, 10 classes, budget 1,000 of 10,000: GLISTER, balanced, as in lipt.
    pool, val = _pool(10_000, 10, 128, 0), _pool(1_000, 10, 128, 1)
    g = torch.Generator().manual_seed(2)
    inputs = SelectionInputs(pool, val, classifier_weight=torch.randn(10, 128, generator=g))
    fn = partial(select_glister)
    plain = select_balanced(fn, inputs, 1_000, generator=torch.Generator().manual_seed(7))
    steps: list[int] = []
    rng = torch.get_rng_state()
    counted = select_balanced(
        console.counting_selector(fn, steps.append),
        inputs,
        1_000,
        generator=torch.Generator().manual_seed(7),
    )
    assert torch.equal(torch.get_rng_state(), rng)  # the bar draws no random numbers
    assert len(steps) == 10 and sum(steps) == 1_000  # a step per class, the whole budget
    assert torch.equal(plain.rows, counted.rows) and torch.equal(plain.weights, counted.weights)
    rows: list[int] = []
    batches = [(torch.zeros(256), torch.zeros(256, dtype=torch.long))] * 3
    assert list(console.counted(batches, rows.append)) == batches and rows == [256] * 3


def test_learners_scored_as_they_finish_give_the_same_soup(make_cfg):
    cfg = make_cfg([*JIGSAW, "merge.ratios=5"], config_name="pretrain")
    dm = build_datamodule(run_of(cfg))
    init = build_model(run_of(cfg), 0)
    digest = state_digest(init.state_dict())
    ctx, settings = (
        build_parts(run_of(cfg), dm).context,
        build_part(run_of(cfg).node("pretrain")),
    )
    shards = learner_shards(settings, dm, 0)

    def learners() -> list[Learner]:
        out = []
        for i, shard in enumerate(shards):  # the init, moved a seeded step: distinct scores
            g = torch.Generator().manual_seed(i)
            state = {
                k: v + 0.3 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
                for k, v in init.state_dict().items()
            }
            out.append(Learner(i, shard, state_dict=state, init_digest=digest))
        return out

    model_a, report_a = merge_learners(ctx, settings, dm, init, 0, learners())
    scored = learners()
    positions = bn_positions(settings, ctx.merge, dm, 0)
    evaluate = HeldOut(ctx.merge, ctx.device, dm, init, 0, positions)
    scores = [evaluate.score_learner(le) for le in scored]
    model_b, report_b = merge_learners(ctx, settings, dm, init, 0, scored, evaluate)
    report_a.pop("merge_seconds"), report_b.pop("merge_seconds")
    assert report_a == report_b  # same kept, ratios, scores and number of evaluations
    assert scores == [le["accuracy"] for le in report_a["learners"]]
    assert len(set(scores)) > 1
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


def test_subset_picture_shows_subset_images_by_class(make_cfg, tmp_path):
    from PIL import Image

    dm = build_datamodule(run_of(make_cfg(["dataset=synthetic"])))
    indices = dm.pool_indices[::5].sort().values  # 100 of the pool of 500
    present, grid = sample_grid(dm, indices)
    labels = dm.train_source.labels
    assert present == list(range(dm.num_classes)) and len(grid) == dm.num_classes
    for c, row in enumerate(grid):
        members = [int(i) for i in indices if int(labels[i]) == c]
        assert 0 < len(row) <= 8
        assert all(any(torch.equal(img, dm.train_source.image(i)) for i in members) for img in row)
    write_subset_picture(dm, indices, tmp_path / "subset.png")
    with Image.open(tmp_path / "subset.png") as picture:
        assert picture.size == (1200, 500)


@pytest.mark.slow
def test_wandb_run_gets_the_merge_table_class_histogram_and_picture(
    make_cfg, tmp_path, monkeypatch
):
    import wandb

    from lipt.stages import train as train_stage

    monkeypatch.setenv("WANDB_SILENT", "true")
    overrides = [o for o in TINY if o != "logger=none"] + [
        "logger=wandb",
        "pretrain=jigsaw",
        "selector=coverage",
    ]
    train_stage.run(validate(make_cfg(overrides)))
    wandb.finish()  # as at the end of the process: the run's records are written out
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    media = {p.relative_to(run / "files" / "media").as_posix() for p in run.rglob("media/**/*.*")}
    for prefix in (
        "table/merge/learners_",
        "table/subset/classes_",
        "images/subset/picture_",
    ):
        assert any(m.startswith(prefix) for m in media), (prefix, media)
    # the bar charts, over those tables; wandb's writer is a separate process that can still be
    # flushing the records file when finish() returns on a loaded machine, so wait for it
    records_file = next(run.glob("run-*.wandb"))
    deadline = time.monotonic() + 60
    while b"subset/class_histogram" not in records_file.read_bytes():
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    records = records_file.read_bytes()
    assert b"merge/held_out_accuracy" in records and b"subset/class_histogram" in records
    table = next((run / "files" / "media" / "table" / "merge").glob("learners_*.json"))
    rows = json.loads(table.read_text())["data"]
    report = json.loads((tmp_path / "merge_report.json").read_text())
    assert [r[3] for r in rows] == [le["accuracy"] for le in report["learners"]]


@pytest.mark.slow
def test_wandb_sweep_logs_the_report_tables_and_plots(tmp_path, monkeypatch):
    # a run of this process (an earlier test's) leaves wandb's service here for children to use
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    args = ["-m", "selector=random,el2n", "pretrain=none", *BASE[:-1], "logger=wandb"]
    code, raw = run_script("train.py", args, tmp_path, terminal=False)
    assert code == 0, raw[-3000:]
    (sweep,) = (tmp_path / "multirun" / "train").glob("*/*")
    for name in ("results.md", "results.csv", "accuracy_vs_data.png", "stage_times.png"):
        assert (sweep / "report" / name).is_file(), name
    runs = list((sweep / "wandb").glob("offline-run-*"))  # the sweep's own "report" run
    media = {p.name.split("_")[0] for run in runs for p in run.rglob("media/**/*.*")}
    assert media >= {"accuracy", "stage", "results"}, media
    assert f"(tables and plots in {sweep.relative_to(tmp_path)}/report)" in raw
    assert "anonymous setting" not in raw  # wandb's notice about Lightning's anonymous=None
    # wandb's service (its debug logs) started anew in each job's folder, where job 1's were
    # job 0's, and the report's in the sweep's
    for folder in (sweep / "0", sweep / "1", sweep):
        logs = list((folder / ".cache" / "wandb").rglob("core-debug-*.log"))
        assert len(logs) == 1, (folder, logs)


def test_the_end_of_a_run_says_what_its_budget_bought(tmp_path):
    """Dynamic pruning trains on the whole pool: the closing block shows no subset of 100% but
    the samples trained against the whole pool's run, and so does a multirun job's line."""
    dynamic = {
        "test_accuracy": 0.8342,
        "train_size": 55000,
        "subset_size": 55000,
        "config": {"trainer": {"max_epochs": 12}},
        "stages": {"train": {"seconds": 40.0, "samples": 65850}},
    }
    block = console.closing_block(dynamic, tmp_path)
    assert "subset" not in block
    assert (
        "trained           65,850 samples, 10.0% of the whole pool's 12 epochs (660,000)" in block
    )
    line = console.job_line(dynamic, tmp_path, "#0 budget=lipt:")
    assert "subset" not in line and "trained 10.0%" in line
    subset = {
        **dynamic,
        "subset_size": 5500,
        "stages": {"train": {"seconds": 40.0, "samples": 66000}},
    }
    assert "subset            5,500 of 55,000 (10.0%)" in console.closing_block(subset, tmp_path)
    assert "subset 5,500  trained 10.0%" in console.job_line(subset, tmp_path, "#1")


def test_an_optimized_metric_the_run_would_not_produce_is_one_line_before_training(tmp_path):
    """Validation every 2 epochs of a 1-epoch run would give no val_accuracy for the sweeper:
    refused in one line before any work, not after the training."""
    from tests.helpers import FAST

    folder = tmp_path / "run"
    args = [*FAST, "optimized_metric=val_accuracy", "+trainer.check_val_every_n_epoch=2"]
    out = run_entry("train.py", [*args, f"hydra.run.dir={folder}"], timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "error: optimized_metric=val_accuracy needs a validation result, but "
        "trainer.check_val_every_n_epoch=2 validates nothing; set a smaller "
        "trainer.check_val_every_n_epoch"
    ]
    assert not folder.exists()


def test_a_summary_without_the_optimized_metric_is_one_line_not_a_traceback():
    """Where a run still ends without the number (a validation Lightning skipped), the task
    says so in one line rather than hand the sweeper None."""
    from omegaconf import OmegaConf

    from lipt.core.errors import UserError
    from lipt.run.cli import task_result

    cfg = OmegaConf.create({"optimized_metric": "val_accuracy"})
    assert task_result(cfg, {"val_accuracy": 0.5}) == 0.5
    with pytest.raises(UserError, match=r"^optimized_metric=val_accuracy: this run's summary"):
        task_result(cfg, {"val_accuracy": None})


@pytest.mark.parametrize(
    "rank",
    [
        {"LOCAL_RANK": "1"},
        {"SLURM_PROCID": "1"},
        {"RANK": "4", "LOCAL_RANK": "0"},
        {"JSM_NAMESPACE_RANK": "2"},
    ],
)
def test_an_extra_rank_prints_no_stage_lines_nor_closing_block(monkeypatch, rank):
    """srun starts every task of a job itself: its tasks after the first are extra ranks as
    Lightning's own launcher's are, and printed every stage line and the closing block again.
    So did torchrun's first rank on a second node (RANK=4, LOCAL_RANK=0), which also wrote the
    run's files beside node 0's."""
    for key in ("LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "RANK", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in rank.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setitem(console._state, "extra_rank", False)
    console.setup(multirun_job=False)
    assert console._state["extra_rank"] and not console._state["bars"]
    for key in rank:
        monkeypatch.delenv(key)
    console.setup(multirun_job=False)
    assert not console._state["extra_rank"]
