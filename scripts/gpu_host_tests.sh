#!/usr/bin/env bash
# The tests on a GPU machine against its preinstalled torch, offline (no
# package registry there): installs the carried wheels (rustccl from
# wheelhouse/, pytest and its dependencies from .devwheels/) without an
# index, then runs the CPU subset of scripts/torch_releases.sh and the CUDA
# tests (which need a GPU) with this tree's tests.
#   run(command="bash scripts/gpu_host_tests.sh", carry=["wheelhouse", ".devwheels"])
set -uo pipefail
py=$(command -v python3)
$py -m pip install -q --no-index --no-deps --force-reinstall wheelhouse/rustccl-*.whl
$py -c "import pytest" 2>/dev/null || $py -m pip install -q --no-index --no-deps .devwheels/{pytest,iniconfig,pluggy,packaging,pygments}-*.whl
$py -c "import json, torch, rustccl; print(torch.__version__, json.dumps(rustccl.info()['versions']['shim']))"
cd tests/python
timeout ${SUBSET_S:-400} $py -m pytest -q -p no:cacheprovider test_collectives.py test_ddp.py test_process_groups.py \
  "test_hooks.py::test_hooks_match_local_references" 2>&1 | tail -n 3
timeout ${CUDA_S:-150} $py -m pytest -q -p no:cacheprovider -k cuda 2>&1 | tail -n 3
