#!/usr/bin/env bash
# Builds the abi3 wheel (engine + C++ shim) into wheelhouse/, against the
# torch of .venv (set up by `make setup`). The wheel installs on the GPU
# machines (Python 3.12, torch 2.11.0+cu130) with `pip install --no-deps`.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf wheelhouse
.venv/bin/maturin build --release --compatibility linux -i .venv/bin/python --out wheelhouse
ls -l wheelhouse
