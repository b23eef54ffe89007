# Tessera's entry points. On a fresh clone `make run` and `make test` create .venv and install everything first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OUT ?= .tessera/fgd-default

.DEFAULT_GOAL := help
.PHONY: help run test lint bench clean distclean

help:
	@echo "make run    - simulate the FGD study on the embedded synthetic cluster (report in $(OUT))"
	@echo "make test   - ruff, mypy, import-linter contracts and the test suite"
	@echo "make lint   - ruff, mypy and import-linter only"
	@echo "make bench  - placement speed of fgd and bestfit (openb trace when ../shared is there)"
	@echo "make clean  - remove reports and caches (make distclean also removes $(VENV))"

# The virtualenv, (re)installed whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/tessera simulate fgd --out $(OUT)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -n 2

bench: $(STAMP)
	$(BIN)/python bench/bench_placement.py

clean:
	rm -rf .tessera .hypothesis .pytest_cache .mypy_cache .ruff_cache .import_linter_cache build dist src/*.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
