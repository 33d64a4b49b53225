"""The sweeps the paper's experiment configs give in their comments run the sweep they
describe: figure 3's M and K sweeps vary their own knob alone, around n=10 learners."""

from __future__ import annotations

import importlib
import re

import pytest
from hydra import compose, initialize_config_dir

from tests.helpers import CONFIGS
from tests.test_experiments import sweep_jobs

FIGURE3 = ("figure3", "figure3_cpu")
KNOBS = ("pretrain.batches_per_learner", "pretrain.local_epochs")  # M and K


def commented_sweeps(name: str) -> list[str]:
    """Each `'++hydra.sweeper.params={...}'` an experiment's comments give, unquoted."""
    text = (CONFIGS / "experiment" / f"{name}.yaml").read_text()
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    return re.findall(r"'(\+\+hydra\.sweeper\.params=\{[^']*\})'", comments)


def values_of(jobs: list[list[str]], key: str) -> set[str]:
    return {o.split("=", 1)[1] for job in jobs for o in job if o.startswith(f"{key}=")}


@pytest.mark.parametrize("name", FIGURE3)
def test_figure3_m_and_k_sweeps_vary_one_knob_at_n_10(name):
    """Each commented sweep keeps n at 10 and varies its own knob over 3 seeds: with the
    experiment's n sweep left in its params, n would be crossed with it (4 n x its values)."""
    sweeps = commented_sweeps(name)
    varied: list[str] = []
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        for sweep in sweeps:
            jobs = sweep_jobs([f"+experiment={name}", sweep])
            assert values_of(jobs, "pretrain.num_learners") == {"10"}, sweep
            (knob,) = [k for k in KNOBS if len(values_of(jobs, k)) > 1]
            values = values_of(jobs, knob)
            assert len(values) >= 3 and len(jobs) == 3 * len(values), (sweep, len(jobs))
            cfg = compose("train", overrides=jobs[-1])
            assert cfg.approach == "lipt" and cfg.pretrain.num_learners == 10
            varied.append(knob)
    assert sorted(varied) == sorted(KNOBS), sweeps  # one sweep of M, one of K


def resolves(dotted: str) -> bool:
    """Whether `lipt.a.b.C.f` names a module, or an attribute chain below one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_code_the_paper_configs_comments_name_exists():
    """A comment naming lipt's code names code that is there (a renamed module left the
    GradMatch preset pointing at lipt.stages.pretrain.warmup_epochs)."""
    files = [*(CONFIGS / "approach").glob("*.yaml"), *(CONFIGS / "experiment").glob("*.yaml")]
    named = {
        (path.name, dotted.rstrip("."))
        for path in files
        for line in path.read_text().splitlines()
        if line.lstrip().startswith("#") or " # " in line
        for dotted in re.findall(r"\blipt(?:\.\w+)+", line)
    }
    assert named
    assert not [n for n in sorted(named) if not resolves(n[1])]
