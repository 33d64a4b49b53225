# make run: the main job on Fashion-MNIST (installs first). make test: the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
FMNIST := /usr/share/datasets/fashion-mnist
ARGS ?=

.PHONY: install data run test test-slow test-all test-slurm slurm-up slurm-down lint format report clean

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e ".[dev]"
	@# pip compiles one file after another; compileall on every core, leaving out the packages'
	@# own test suites, which nothing imports (a file written for a newer Python, which pip also
	@# skips, fails to compile: its status is not ours)
	$(PY) -m compileall -q -j 0 -x '/tests?/' $(VENV)/lib > /dev/null || true
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
# the tests that run lipt against it: make slurm-up && make test-slurm; make slurm-down
slurm-up:
	bash scripts/slurm.sh up

slurm-down:
	bash scripts/slurm.sh down

test-slurm: install data
	$(PY) -m pytest -m slurm $(ARGS)

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
	$(PY) -m lipt.report.sweep $(SWEEP) $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache .mypy_cache
