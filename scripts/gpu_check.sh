#!/usr/bin/env bash
# Runs on a GPU machine (the `device` tool) from the repository root, with
# wheelhouse/ carried from the development machine (scripts/build_wheel.sh):
#   installs the wheel, writes `python -m rustccl.info` to $OUT/info.json,
#   runs the CUDA tests, then the benchmark given in
#   BENCH (a command line; default: none). Logs go to $OUT when set.
#   NCCL_NVLS_ENABLE=0 as the GPU hosts require.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/rustccl-out}
mkdir -p "$OUT"
nvidia-smi -L
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
python3 -m pip install -q --no-deps --force-reinstall wheelhouse/rustccl-*.whl || exit 1
python3 -m rustccl.info > "$OUT/info.json" || echo "python -m rustccl.info failed"
rc=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-900}" python3 -m pytest -q -x -p no:cacheprovider tests/python/test_cuda.py \
    tests/python/test_packaging.py::test_info_on_cuda_matches_torch_and_the_driver ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log"
  rc=${PIPESTATUS[0]}
fi
if [ -n "${BENCH:-}" ]; then
  bash -c "$BENCH" 2>&1 | tee "$OUT/bench.log"
fi
exit $rc
