# wavetrain: every target sets itself up from a fresh clone.
#   make setup (make demo)   the runtime core: features, the statistical families, plots, the demo
#   make setup-EXTRA         adds one extra (requirements-EXTRA.txt): networks (PyTorch), spark, serve,
#                            export, speech, sklearn, fast-fft (Intel MKL's FFT), or all of them
#   make setup-dev           every extra and the development tools (make test, check, bench and CI use it)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := networks spark serve export speech sklearn fast-fft all dev
# One compute thread: on 2-vCPU machines two BLAS/OpenMP threads are many times slower than one.
export OMP_NUM_THREADS ?= 1
export OPENBLAS_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1

.PRECIOUS: $(VENV)/.installed-%
.PHONY: setup $(addprefix setup-,$(EXTRAS)) demo test test-slow test-all check bench bench-quick clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

$(addprefix setup-,$(EXTRAS)): setup-%: $(VENV)/.installed-%

# an extra's stamp: its requirements (and those they include) on top of the core
$(VENV)/.installed-%: requirements-%.txt $(wildcard requirements*.txt) $(STAMP)
	$(BIN)/pip install -q -r $<
	touch $@

demo: setup
	$(BIN)/wavetrain demo

test: setup-dev
	$(BIN)/python -m pytest

# lint, types (mypy, unreachable code included) and the one-way import layers
check: setup-dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_import_layers.py

# the slow-marked tests (Spark jobs, longer trainings, the manual's Spark blocks): CI runs them after `make test`
test-slow: setup-dev
	$(BIN)/python -m pytest -m slow

test-all: setup-dev
	$(BIN)/python -m pytest -m ''

bench: setup-dev
	$(BIN)/python benchmarks/run_all.py

# every benchmark at small sizes (about a minute): they still run; no number is judged
bench-quick: setup-dev
	$(BIN)/python benchmarks/run_all.py --quick

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
