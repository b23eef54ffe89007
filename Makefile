# Tessera's entry points. On a fresh clone `make run` and `make test` create .venv and install everything first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OUT ?= .tessera/fgd-default
PORT ?= 8470
PROMETHEUS ?=
PROMETHEUS_PORT ?= 9090

.DEFAULT_GOAL := help
.PHONY: help run simulate test test-engines lint bench clean distclean

help:
	@echo "make run      - start the control plane (tessera up) on 127.0.0.1:$(PORT) with a demo mix; Ctrl-C stops it"
	@echo "               (make run PROMETHEUS=1 also starts Prometheus on 127.0.0.1:$(PROMETHEUS_PORT), scraping it)"
	@echo "make simulate - simulate the FGD study on the embedded synthetic cluster (report in $(OUT))"
	@echo "make test   - ruff, mypy, import-linter contracts, the test suite and the core coverage gate"
	@echo "               (the dashboard's browser tests keep their screenshots in .tessera/test-screenshots/)"
	@echo "make test-engines - real engines on the CPU: makes .venv-vllm (scripts/engines.sh), runs their e2e tests"
	@echo "make lint   - ruff (lint and format check), mypy and import-linter only"
	@echo "make bench  - placement speed of fgd and bestfit (openb trace when ../shared is there)"
	@echo "make clean  - remove reports and caches (make distclean also removes $(VENV))"

# The virtualenv, (re)installed whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev,ray]'
	touch $(STAMP)

# PROMETHEUS=1: deploy/prometheus/run-local.sh also starts a local Prometheus that scrapes the demo with the admin token.
run: $(STAMP)
	@if [ -n "$(PROMETHEUS)" ] && [ "$(PROMETHEUS)" != 0 ]; then \
	    echo "bash deploy/prometheus/run-local.sh $(BIN)/tessera $(PORT) $(PROMETHEUS_PORT) .tessera"; \
	    PYTHON=$(BIN)/python bash deploy/prometheus/run-local.sh $(BIN)/tessera $(PORT) $(PROMETHEUS_PORT) .tessera; \
	else echo "$(BIN)/tessera up --demo --port $(PORT)"; $(BIN)/tessera up --demo --port $(PORT); fi

simulate: $(STAMP)
	$(BIN)/tessera simulate fgd --out $(OUT)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

# The dashboard's browser tests (tests/server/test_e2e_dashboard.py) write their screenshots to
# .tessera/test-screenshots/ (git-ignored; TESSERA_SCREENSHOTS=DIR picks another folder), replacing the last run's;
# the run ends with a line naming the folder and the files.
# scripts/test-packages.sh installs the Debian packages some tests use (the MPS control daemon); without them those
# tests skip and say why.
# The suite runs against a throw-away PostgreSQL server (scripts/test-postgres.sh installs it with apt-get when
# missing), whose URL reaches the tests in TESSERA_TEST_PG_URL; it is stopped and removed however pytest ends.
# `make test TESSERA_TEST_PG=skip` runs without it (the PostgreSQL tests then skip).
TESSERA_TEST_PG ?=

# Coverage: pytest measures all of tessera (line coverage, reported per module), then the gate fails the run when
# tessera.core is under CORE_COVERAGE_MIN percent (measured under the full suite: see docs/architecture.md section 2).
CORE_COVERAGE_MIN := 95
PYTEST := $(BIN)/pytest -n 2 --cov --cov-report=term -m "not ray and not engines"
# The `ray` tests start a real local Ray cluster (one per test module, so one process: no -n) and run inside a network
# namespace that has only loopback, because Ray otherwise moves off 127.0.0.1 (docs/ray.md). Without unshare (not
# root) they run as they are and skip, saying why (and a line says so first); under CI=true such a skip fails
# instead (tests/backends/ray/ray_skip.py). Their coverage is appended to the main run's for the gate.
RAY_PYTEST := $(BIN)/pytest -p no:cacheprovider --cov --cov-append --cov-report=term -m ray tests/backends/ray
RAY_TESTS := if unshare --net true 2>/dev/null; then unshare --net sh -c 'ip link set lo up && $(RAY_PYTEST)'; \
    else echo "make test: unshare --net is not available (not root?): the ray tests will skip (with CI=true: fail)"; \
    $(RAY_PYTEST); fi
# The real engines (vLLM on the CPU, transformers serve, SmolLM2) run last, alone (two cores: one engine at a time),
# from their own virtualenv (.venv-vllm, made by scripts/engines.sh: about 5 minutes and 3.5 GB the first time, then
# nothing); `make test TESSERA_TEST_ENGINES=skip` leaves them out. See docs/serving.md section 10.
TESSERA_TEST_ENGINES ?=
ENGINE_TESTS := if [ "$(TESSERA_TEST_ENGINES)" = skip ]; then \
    echo "TESSERA_TEST_ENGINES=skip: the real-engine tests (make test-engines) are left out"; \
    else $(MAKE) --no-print-directory test-engines; fi
CORE_GATE := echo "tessera.core line coverage, in percent (the gate: $(CORE_COVERAGE_MIN)):" && \
    $(BIN)/coverage report --include='*/tessera/core/*' --format=total --fail-under=$(CORE_COVERAGE_MIN)

test: lint
	@bash scripts/test-packages.sh
	@if [ "$(TESSERA_TEST_PG)" = skip ]; then \
	    echo "TESSERA_TEST_PG=skip: no PostgreSQL test server, the PostgreSQL tests will be skipped"; \
	    echo "$(PYTEST)"; $(PYTEST) && $(RAY_TESTS) && $(CORE_GATE) && $(ENGINE_TESTS); exit; \
	fi; \
	pgdir=$$(mktemp -d /tmp/tessera-test-pg.XXXXXX) || exit 1; \
	trap 'bash scripts/test-postgres.sh stop "$$pgdir"' EXIT; \
	trap 'exit 130' INT; trap 'exit 143' TERM; \
	bash scripts/test-postgres.sh start "$$pgdir" || { echo "make test: could not start the PostgreSQL test server" \
	    "(make test TESSERA_TEST_PG=skip runs without it)" >&2; exit 1; }; \
	TESSERA_TEST_PG_URL=$$(bash scripts/test-postgres.sh url "$$pgdir") || exit 1; \
	export TESSERA_TEST_PG_URL; \
	echo "TESSERA_TEST_PG_URL=$$TESSERA_TEST_PG_URL $(PYTEST)"; \
	$(PYTEST) && $(RAY_TESTS) && $(CORE_GATE) && $(ENGINE_TESTS)

test-engines: $(STAMP)
	bash scripts/engines.sh
	$(BIN)/pytest -p no:cacheprovider -s -m engines tests/server/test_e2e_real_engines.py tests/serving/test_e2e_model_switching.py

bench: $(STAMP)
	$(BIN)/python bench/bench_placement.py

clean:
	rm -rf .tessera .hypothesis .coverage .coverage.* .pytest_cache .mypy_cache .ruff_cache .import_linter_cache build dist src/*.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .venv-vllm
