# make run: the main job on Fashion-MNIST (installs first). make test: the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
FMNIST := /usr/share/datasets/fashion-mnist
ARGS ?=

.PHONY: install data run test test-slow test-all test-slurm slurm-up slurm-down lint format report clean

install: $(STAMP)

# What lipt's stages, reports and tests import beside torch's stack (install compiles it)
IMPORTED := import hydra, omegaconf, pydantic, rich, scipy.optimize, sklearn.cluster, pandas, \
	matplotlib.pyplot, cleanlab.datalab.datalab, datasets, wandb, optuna, tensorboard, submitit, \
	joblib, hydra_plugins.hydra_joblib_launcher.joblib_launcher, \
	hydra_plugins.hydra_submitit_launcher.submitit_launcher, \
	hydra_plugins.hydra_optuna_sweeper.optuna_sweeper, lipt.run.cli

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	@# uv installs what pip would, in half pip's time (it downloads and unpacks in parallel);
	@# pip installs where uv cannot
	$(PY) -m pip install --quiet uv && $(VENV)/bin/uv pip install --quiet --python $(PY) -e ".[dev]" \
		|| { $(PY) -m pip install --quiet --upgrade pip && $(PY) -m pip install --quiet --no-compile -e ".[dev]"; }
	@# Byte-code for what lipt and its tests import (about 5,000 of the 12,700 modules installed),
	@# written by importing it, in two processes at once: in 60% of compileall's CPU
	env -u PYTHONDONTWRITEBYTECODE $(PY) -c "import torch, lightning, torchvision, torchmetrics" & torch=$$!; \
	env -u PYTHONDONTWRITEBYTECODE $(PY) -c "$(IMPORTED)" && wait $$torch
	touch $(STAMP)

# The original Fashion-MNIST files from Debian, where apt is there and we are root; otherwise
# lipt looks in dataset.data_dir and downloads with torchvision where the internet is reachable.
data:
	@if [ ! -d $(FMNIST) ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; \
	fi

run: install data
	$(PY) train.py $(ARGS)

# One pytest worker per core (pytest-xdist); worksteal evens out tests of unequal length.
XDIST := -n auto --dist worksteal

# make test: the default suite. MARKS="not slurm" adds the slow end-to-end tests to the same
# pytest (one start, and its long tests begin first: what CI runs beside the SLURM suite).
MARKS ?= not slow and not slurm
test: install
	$(PY) -m pytest -m "$(MARKS)" $(XDIST) $(ARGS)

test-slow: install data
	$(PY) -m pytest -m "slow and not slurm" $(XDIST) $(ARGS)

# A one-node SLURM cluster on this machine (Debian's packages, as root; state in .slurm/), and
# the tests that run lipt against it: make slurm-up && make test-slurm; make slurm-down (they all
# live in tests/test_slurm.py, conftest checks: collecting the others would cost 11 s of CPU)
slurm-up:
	bash scripts/slurm.sh up

slurm-down:
	bash scripts/slurm.sh down

test-slurm: install data
	$(PY) -m pytest -m slurm tests/test_slurm.py $(ARGS)

test-all: install data
	$(PY) -m pytest $(XDIST) $(ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Tables (Markdown, CSV) and plots of every summary.json under a sweep: make report SWEEP=multirun/<exp>/<time>
report: install
	@test -n "$(SWEEP)" || { echo "error: set SWEEP=<sweep folder>, e.g. make report SWEEP=multirun/table2_cpu/<time>" >&2; exit 2; }
	$(PY) -m lipt.report.sweep "$(SWEEP)" $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache .mypy_cache
