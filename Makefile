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

demo: $(STAMP) ## train the demo (digits CNN) in fp32 and amp, then print the comparison table
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

test: $(STAMP) lint ## lint, then the test suite (CPU; under 10 minutes)
	$(BIN)/python -m pytest -m "not slow and not gpu" -q

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

# ARGS: more options of scripts/reproduce_claims.py (--docs docs/claims.md, --claims a,b, --tiny)
reproduce-claims: $(STAMP) ## the paper's claims on this CPU: the runs of conf/claims/, then their verdicts (results/claims; ~1 h)
	$(BIN)/python scripts/reproduce_claims.py $(ARGS)

# OUT BATCH DRY_RUN: set on the make command line; defaults and meanings in scripts/gpu_check.sh
gpu-check: $(STAMP) ## on a GPU machine: mpt-bench ResNet-50, every smoke run, DDP over NCCL (docs/performance.md)
	VENV=$(VENV) scripts/gpu_check.sh

report: $(STAMP) ## rebuild results/report (tables, CSV, LaTeX, plots) from results/runs
	$(BIN)/mpt-report results/runs --out results/report

tensorboard: $(STAMP) ## TensorBoard over results/runs (every run of every sweep, side by side)
	$(BIN)/tensorboard --logdir results/runs

clean-runs: ## delete results/runs and results/report
	rm -rf results/runs results/report

.PHONY: help install wheel lint format demo test test-full shape mutants clean-runs reproduce-table reproduce-claims report tensorboard ddp gpu-check
