# wavetrain: every target sets itself up from a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# One compute thread: on 2-vCPU machines two BLAS/OpenMP threads are many times slower than one.
export OMP_NUM_THREADS ?= 1
export OPENBLAS_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1

.PHONY: setup demo test test-slow test-all check bench bench-quick clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

demo: setup
	$(BIN)/wavetrain demo

test: setup
	$(BIN)/python -m pytest

# lint, types (mypy, unreachable code included) and the one-way import layers
check: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_import_layers.py

# the slow-marked tests (Spark jobs, longer trainings, the manual's Spark blocks): CI runs them after `make test`
test-slow: setup
	$(BIN)/python -m pytest -m slow

test-all: setup
	$(BIN)/python -m pytest -m ''

bench: setup
	$(BIN)/python benchmarks/run_all.py

# every benchmark at small sizes (about a minute): they still run; no number is judged
bench-quick: setup
	$(BIN)/python benchmarks/run_all.py --quick

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
