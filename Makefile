# mpt-repro: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The stamp is rebuilt when the package's dependencies change.
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch and torchvision resolve together from the registry (lower bounds only; a GPU
	# environment that already has matching versions keeps them).
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

install: $(STAMP) ## build .venv and install mpt-repro (editable, with test extras)

demo: $(STAMP) ## train the demo (digits CNN) in fp32, amp and mixed (budget=short), then print the comparison table
	$(BIN)/python scripts/demo.py

# The wheel carries the configs (mpt_repro/conf): `pip install dist/mpt_repro-*.whl`, or
# `pipx install dist/mpt_repro-*.whl`, works from any folder (tests/test_cli_packaging.py).
wheel: $(STAMP) ## build the installable wheel into dist/ (configs included)
	$(BIN)/python -m pip wheel --no-deps --no-build-isolation -w dist .
	rm -rf build

lint: $(STAMP) ## ruff: formatting, lint, import order (configured in pyproject.toml)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: $(STAMP) ## ruff: rewrite the code in the house format and sort the imports
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The suite runs in TEST_JOBS processes (pytest-xdist; a test file stays in one process, so its
# module fixtures run once), one thread each: on a few cores, threads of one process only hand
# tiny tensors to each other. TEST_JOBS=1 runs it in one process.
TEST_JOBS ?= $(shell $(PYTHON) -c 'import os; print(min(4, len(os.sched_getaffinity(0))))')
test: $(STAMP) lint ## lint, then the test suite (CPU; about 7-8 minutes on 2 cores)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m "not slow and not gpu" -q $(if $(filter-out 1,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadfile)

shape: $(STAMP) ## the code's shape against the house targets: long functions, repeated blocks, import cycles
	$(BIN)/python scripts/shape.py

# MAX (a seeded sample of that many) and ARGS (more options: --list, --json PATH, --files ...);
# the mutant kinds, the files and their tests: docs/mutants.md
mutants: $(STAMP) ## mutation check of precision/, the step, trainer, run files, report (MAX=40: a sample; slow)
	$(BIN)/python scripts/mutants.py $(if $(MAX),--max $(MAX)) $(ARGS)

test-full: $(STAMP) ## every test, the slow ones included
	$(BIN)/python -m pytest -m "not gpu" -q

NPROC ?=
ddp: $(STAMP) ## one run over NPROC processes (default: every GPU): make ddp NPROC=2 ARGS="experiment=demo"
	NPROC=$(NPROC) VENV=$(VENV) scripts/torchrun.sh $(ARGS)

# BUDGET DATA DATA_ROOT SEEDS EXPERIMENTS PRECISIONS OTHERS: set on the make command line (make
# exports them); defaults and meanings in scripts/reproduce_table.sh and docs/report.md.
reproduce-table: $(STAMP) ## the paper's tables: sweep + report (DATA_ROOT=/path/to/imagenet, or BUDGET=smoke DATA=synthetic)
	scripts/reproduce_table.sh

# ARGS: more options of scripts/reproduce_claims.py (--docs docs/claims.md, --claims a,b, --tiny,
# --seed-offset N: other seeds, --claims-dir DIR: other claims files)
reproduce-claims: $(STAMP) ## the paper's claims on this CPU: the runs of conf/claims/, then their verdicts (results/claims; ~1 h)
	$(BIN)/python scripts/reproduce_claims.py $(ARGS)

# ARGS: more options of scripts/verify_claims.py (--sample N, a page other than docs/claims.md)
verify-claims: $(STAMP) ## re-run the runs docs/claims.md rests on: bit-identical to its digests? (ARGS='--sample 3': a quick check)
	$(BIN)/python scripts/verify_claims.py $(ARGS)

# OUT WORK BUDGET STEPS BATCH DRY_RUN: set on the make command line (make exports them); defaults
# and meanings in scripts/gpu_check.sh. On the GPU machine itself, without make: docs/performance.md
gpu-check: $(STAMP) ## on a GPU machine with .venv: bench, a smoke run of every experiment, report (docs/performance.md)
	PYTHON=$(BIN)/python WHEELS= scripts/gpu_check.sh

GPU_WHEELS := .gpu-wheels
gpu-wheels: $(STAMP) ## fetch here the wheels the GPU machine lacks (Python 3.12) into .gpu-wheels/, to carry there
	$(BIN)/python scripts/gpu_wheels.py --dest $(GPU_WHEELS)

# The GPU check as the GPU machine runs it (python3 of a venv without mpt-repro, the carried wheels
# installed with pip --target), with trainer.device=cpu at tiny sizes; its venv and wheels are kept
# in .gpu-rehearsal/ (the first call fetches the wheels for this Python)
REHEARSAL_DIR := .gpu-rehearsal
gpu-check-rehearsal: $(STAMP) ## the GPU check's plan on this CPU at tiny sizes, the GPU machine's way (under 5 min)
	$(if $(filter 1,$(DRY_RUN)),,$(BIN)/python scripts/gpu_rehearsal_env.py $(REHEARSAL_DIR))
	REHEARSAL=1 PYTHON=$(REHEARSAL_DIR)/venv/bin/python3 WHEELS=$(REHEARSAL_DIR)/wheels \
		DRY_RUN_PYTHON=$(BIN)/python scripts/gpu_check.sh

# The lowest supported torch (pyproject.toml's bounds): the fast suite in a venv of its own
# (COMPAT_VENV, built on the first call: torch's CUDA wheels are about 5 GB)
COMPAT_VENV ?= .venv-torch211
COMPAT_PYTHON ?= $(PYTHON)
COMPAT_PINS := torch==2.11.0 torchvision==0.26.0
$(COMPAT_VENV)/.installed: pyproject.toml
	@test -x $(COMPAT_VENV)/bin/python || $(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet $(COMPAT_PINS) -e '.[test]'
	@touch $@

compat: $(COMPAT_VENV)/.installed ## the fast suite under torch 2.11.0 and torchvision 0.26, the lowest supported
	$(COMPAT_VENV)/bin/python -m pytest -m "not slow and not gpu" -q

report: $(STAMP) ## rebuild results/report (tables, CSV, LaTeX, plots) from results/runs
	$(BIN)/mpt-report results/runs --out results/report

tensorboard: $(STAMP) ## TensorBoard over results/runs (every run of every sweep, side by side)
	$(BIN)/tensorboard --logdir results/runs

clean-runs: ## delete results/runs and results/report
	rm -rf results/runs results/report

.PHONY: help install wheel lint format demo test test-full shape mutants clean-runs reproduce-table reproduce-claims verify-claims report tensorboard ddp gpu-check
.PHONY: help install wheel lint format demo test test-full shape mutants clean-runs reproduce-table report tensorboard ddp gpu-check gpu-wheels gpu-check-rehearsal compat
