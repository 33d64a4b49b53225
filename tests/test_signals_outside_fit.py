"""SIGTERM and Ctrl-C outside Lightning's fits: between the jigsaw learners, while the command
line is checked, in Hydra's start. The run ends with one line on how to resume and the shell's
exit code for the signal, leaves no temporary file, and the resume it names reuses its work."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from lipt.run import cli
from tests.helpers import FAST, run_entry

# Runs an entry script with one of lipt's functions patched to signal this process once it
# returned `after` times: a stop at a known point outside a fit, as `kill` would send it there.
STOPPER = """
import os, signal, sys
import importlib
# Ctrl-C as in a terminal: a shell's background job (`cmd &`) inherits SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
module, name, after, signame, script = sys.argv[1:6]
sys.argv = [script, *sys.argv[6:]]
owner = importlib.import_module(module)
real = getattr(owner, name)
calls = []

def stopped_after(*args, **kwargs):
    out = real(*args, **kwargs)
    calls.append(1)
    if len(calls) == int(after):
        os.kill(os.getpid(), getattr(signal, signame))
    return out

setattr(owner, name, stopped_after)
from lipt.run import cli
main = {"train.py": cli.train_main, "pretrain.py": cli.pretrain_main, "select.py": cli.select_main}
main[script]()
"""


def stop_at(
    module: str, name: str, after: int, signame: str, script: str, args: list[str], where: Path
) -> subprocess.CompletedProcess:
    """`script` run with `module.name` patched to send `signame` to its process once it returned
    `after` times (STOPPER, written into `where`), in a process of its own forked from the
    preloaded Python (run_entry): the signal reaches that process alone. The patch rebinds the
    module's attribute, which its callers look up at each call, imported already or not."""
    stopper = where / "stopper.py"
    stopper.write_text(STOPPER)
    return run_entry(str(stopper), [module, name, str(after), signame, script, *args], timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_stop_between_jigsaw_learners_says_how_to_resume_and_the_resume_reuses_them(
    tmp_path: Path, signame: str
):
    # SIGTERM between two learners' fits killed pretrain.py without a word (exit -15)
    run = tmp_path / "run"
    # a fourth learner to train after the stop: as many as needed to stop between learners
    jigsaw = ["pretrain=jigsaw", "pretrain.num_learners=4", "pretrain.local_epochs=2"]
    args = [*FAST, *jigsaw, f"hydra.run.dir={run}"]
    done = stop_at(
        "lipt.jigsaw.strategy", "train_or_reuse", 3, signame, "pretrain.py", args, tmp_path
    )
    signum = getattr(signal, signame)
    assert done.returncode == 128 + signum, done.stderr
    assert done.stderr.splitlines()[-1:] == [
        f"stopped by {signame}; resume with hydra.run.dir={run}"
    ]
    assert "Traceback" not in done.stderr
    assert not list(run.rglob("*.tmp"))
    assert sorted(p.name for p in (run / "learners").glob("*.ckpt")) == [
        f"learner_{i}.ckpt" for i in range(3)
    ]
    again = run_entry("pretrain.py", args)
    assert again.returncode == 0, again.stderr
    log = (run / "pretrain.log").read_text()
    assert all(f"jigsaw learner {i} (ok) reused from" in log for i in range(3)), log


@pytest.mark.slow
@pytest.mark.parametrize("point", ["training_set_of", "fit_and_test"])
def test_sigterm_in_train_py_outside_its_fit_names_a_resume_that_works(tmp_path: Path, point: str):
    # the subset selected and written (before main training), or the test pass over (before
    # summary.json): SIGTERM there killed train.py without a word
    run = tmp_path / "run"
    args = [*FAST, "selector=el2n", "budget=subset", f"hydra.run.dir={run}"]
    done = stop_at("lipt.stages.train", point, 1, "SIGTERM", "train.py", args, tmp_path)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    hint = f"stopped by SIGTERM; resume with ckpt_path=last hydra.run.dir={run}"
    assert done.stderr.splitlines()[-1:] == [hint]
    assert not list(run.rglob("*.tmp")) and not (run / "summary.json").exists()
    again = run_entry("train.py", [*args, "ckpt_path=last"])
    assert again.returncode == 0, again.stderr
    assert (run / "summary.json").is_file()


@pytest.mark.slow
def test_sigterm_to_a_sweep_job_run_in_the_sweeps_process_outside_its_fit(tmp_path: Path):
    # the basic launcher runs the jobs in the sweep's own process: SIGTERM while the first job
    # selected killed the sweep without a word
    sweep = tmp_path / "sweep"
    args = ["-m", *FAST, "selector=el2n", "budget=subset", "seed=0,1", f"hydra.sweep.dir={sweep}"]
    done = stop_at("lipt.stages.train", "training_set_of", 1, "SIGTERM", "train.py", args, tmp_path)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    hint = f"stopped by SIGTERM; resume with ckpt_path=last hydra.sweep.dir={sweep}"
    assert done.stderr.splitlines()[-1:] == [hint]
    assert not (sweep / "1").exists()
    again = run_entry("train.py", [*args, "ckpt_path=last"])
    assert again.returncode == 0, again.stderr
    assert (sweep / "0" / "summary.json").is_file() and (sweep / "1" / "summary.json").is_file()


def test_sigterm_while_checking_is_one_line_and_exit_143(tmp_path: Path):
    # a dry run reads the data and builds every job: SIGTERM there killed it without a word
    args = [*FAST, "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}"]
    done = stop_at("lipt.run.cli", "precheck", 1, "SIGTERM", "train.py", args, tmp_path)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert done.stderr == "stopped by SIGTERM before the run started; nothing was written\n"


def test_inside_a_fit_the_run_handler_leaves_sigterm_to_lightning():
    # Lightning's handler calls the one it replaced after its own, then ends the fit at its
    # next step: the run's handler raising there would cut a step short
    with cli.sigterm_stops_the_run():
        assert signal.getsignal(signal.SIGTERM) is cli.stage_sigterm
        signal.signal(signal.SIGTERM, lambda signum, frame: cli.stage_sigterm(signum, frame))
        cli.stage_sigterm(signal.SIGTERM, None)  # composed: no RunStopped
        signal.signal(signal.SIGTERM, cli.stage_sigterm)
        with pytest.raises(cli.RunStopped):
            cli.stage_sigterm(signal.SIGTERM, None)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_handler_another_library_set_is_kept():
    # submitit's in a cluster job, for one: it answers SIGTERM its own way
    def theirs(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, theirs)
    try:
        with cli.sigterm_stops_the_run():
            assert signal.getsignal(signal.SIGTERM) is theirs
    finally:
        signal.signal(signal.SIGTERM, before)
