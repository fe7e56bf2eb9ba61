#!/usr/bin/env bash
# Runs the CPU test subset that covers registration, every collective, DDP
# and hooks against each torch release given (default 2.11 - 2.15), one
# virtual environment at a time, with the same rustccl wheel:
#
#   scripts/torch_releases.sh dist/rustccl-*.whl [2.12.0 2.15.0 ...]
#
# Each environment (torch with its CUDA libraries: about 5 GB) is removed
# before the next one is made. Prints one summary line per release.
set -uo pipefail
cd "$(dirname "$0")/.."
wheel=$1
shift
releases=("$@")
[ ${#releases[@]} -gt 0 ] || releases=(2.11.0 2.12.0 2.13.0 2.14.0 2.15.0)
SUBSET=(tests/python/test_collectives.py tests/python/test_ddp.py tests/python/test_process_groups.py
        "tests/python/test_hooks.py::test_hooks_match_local_references"
        "tests/python/test_hooks.py::test_torchs_own_powersgd_hook_trains")
export PIP_NO_CACHE_DIR=1
for v in "${releases[@]}"; do
  env_dir=$(mktemp -d /tmp/rustccl-torch-XXXX)
  python3 -m venv "$env_dir"
  if ! "$env_dir/bin/pip" install -q "torch==$v" numpy pytest "$wheel"; then
    echo "torch $v: install failed"
    rm -rf "$env_dir"
    continue
  fi
  cache=$(mktemp -d)
  start=$(date +%s)
  RUSTCCL_BUILD_CACHE_DIR=$cache "$env_dir/bin/python" -c "import rustccl, json; print(json.dumps(rustccl.info()['versions']['shim']))"
  RUSTCCL_BUILD_CACHE_DIR=$cache "$env_dir/bin/python" -m pytest -q "${SUBSET[@]}" 2>&1 | tail -n 1 | sed "s/^/torch $v: /"
  echo "torch $v: $(( $(date +%s) - start )) s"
  rm -rf "$env_dir" "$cache"
done
