# kcoord: the two commands are `make up` (start a local cluster) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The default suite: everything but the long suites (they have their own targets).
PYTEST_ARGS ?= -m "not slow and not chaos"

.PHONY: help venv check lint format typecheck imports test test-all up bench bench-storage clean

help:
	@echo "make up             set up and start the local cluster (see README)"
	@echo "make test           set up, run the checks and the default test suite"
	@echo "make check          ruff, ruff format --check, mypy --strict, import-linter"
	@echo "make bench-storage  storage engine benchmark (prints and writes bench/results/)"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "kcoord needs Python 3.11+")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: $(STAMP)
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports --no-cache

check: lint typecheck imports

test: check
	bash scripts/run-pytest.sh $(PYTEST_ARGS)

test-all: check
	bash scripts/run-pytest.sh

up: $(STAMP)
	@echo "kcoord: the node process and cluster launcher are not built yet (issue 3)."
	@echo "kcoord: what exists today is the storage engine; try 'make bench-storage' or"
	@echo "kcoord: '$(BIN)/kcoord dump-log FILE'."

bench: bench-storage

bench-storage: $(STAMP)
	$(BIN)/python bench/storage.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis bench/results
