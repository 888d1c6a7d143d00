# `make test` runs every check (it creates .venv and installs the project when needed).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# mpirun (from the mpich wheel) and the console scripts come from the venv.
export PATH := $(abspath $(BIN)):$(PATH)
export OMP_NUM_THREADS ?= 1

.PHONY: test lint typecheck docs pytest clean

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q -c constraints-cpu.txt -e '.[all,dev]'
	touch $(STAMP)

test: lint typecheck docs pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy optuna_hpcnas qubo

# The documentation site into site/; a warning (a broken link, anchor or API reference) fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Three workers on two cores: many tests wait on subprocesses, servers and MPI ranks. One
# worker per test file (--dist loadfile) keeps each module's servers and fixtures shared.
PYTEST_WORKERS ?= 3
pytest: $(STAMP)
	$(BIN)/python -m pytest tests -n $(PYTEST_WORKERS) --dist loadfile --durations=25

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache

# A complete weight-sharing search on digits (about 3 minutes on 2 CPU cores), into a SQLite file.
.PHONY: demo
demo: $(STAMP)
	$(BIN)/python -m optuna_hpcnas.demo
