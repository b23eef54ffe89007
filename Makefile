# Tessera's entry points. On a fresh clone `make run` and `make test` create .venv and install everything first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OUT ?= .tessera/fgd-default
PORT ?= 8470

.DEFAULT_GOAL := help
.PHONY: help run simulate test lint bench clean distclean

help:
	@echo "make run      - start the control plane (tessera up) on 127.0.0.1:$(PORT) with a demo mix; Ctrl-C stops it"
	@echo "make simulate - simulate the FGD study on the embedded synthetic cluster (report in $(OUT))"
	@echo "make test   - ruff, mypy, import-linter contracts and the test suite"
	@echo "make lint   - ruff (lint and format check), mypy and import-linter only"
	@echo "make bench  - placement speed of fgd and bestfit (openb trace when ../shared is there)"
	@echo "make clean  - remove reports and caches (make distclean also removes $(VENV))"

# The virtualenv, (re)installed whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/tessera up --demo --port $(PORT)

simulate: $(STAMP)
	$(BIN)/tessera simulate fgd --out $(OUT)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# The suite runs against a throw-away PostgreSQL server (scripts/test-postgres.sh installs it with apt-get when
# missing), whose URL reaches the tests in TESSERA_TEST_PG_URL; it is stopped and removed however pytest ends.
# `make test TESSERA_TEST_PG=skip` runs without it (the PostgreSQL tests then skip).
TESSERA_TEST_PG ?=

test: lint
	@if [ "$(TESSERA_TEST_PG)" = skip ]; then \
	    echo "TESSERA_TEST_PG=skip: no PostgreSQL test server, the PostgreSQL tests will be skipped"; \
	    echo "$(BIN)/pytest -n 2"; exec $(BIN)/pytest -n 2; \
	fi; \
	pgdir=$$(mktemp -d /tmp/tessera-test-pg.XXXXXX) || exit 1; \
	trap 'bash scripts/test-postgres.sh stop "$$pgdir"' EXIT; \
	trap 'exit 130' INT; trap 'exit 143' TERM; \
	bash scripts/test-postgres.sh start "$$pgdir" || { echo "make test: could not start the PostgreSQL test server" \
	    "(make test TESSERA_TEST_PG=skip runs without it)" >&2; exit 1; }; \
	TESSERA_TEST_PG_URL=$$(bash scripts/test-postgres.sh url "$$pgdir") || exit 1; \
	export TESSERA_TEST_PG_URL; \
	echo "TESSERA_TEST_PG_URL=$$TESSERA_TEST_PG_URL $(BIN)/pytest -n 2"; \
	$(BIN)/pytest -n 2

bench: $(STAMP)
	$(BIN)/python bench/bench_placement.py

clean:
	rm -rf .tessera .hypothesis .pytest_cache .mypy_cache .ruff_cache .import_linter_cache build dist src/*.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
