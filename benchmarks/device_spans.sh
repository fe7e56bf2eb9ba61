#!/bin/bash
# Per-call spans of mid-size CPU collectives on a device machine (benchmarks/cpu_small_latency.py with
# RUSTCCL_HOST_PROFILE=1), for the `run` tool: carry the build in .carry/st1/, then e.g.
#   OPS=scatter,all_to_all,reduce bash benchmarks/device_spans.sh 8:262144:100 4:65536:200:RUSTCCL_SHM_THREADS=2
# Each spec "W:ELEMS:CALLS[:VAR=VALUE[,VAR=VALUE...]]" runs W ranks with ELEMS float32 elements a tensor and
# CALLS calls per loop; every rank's spans go to $OUT/spans.txt, whole.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0 RUSTCCL_HOST_PROFILE=1
rm -rf /tmp/st1
python3 -m pip install -q --no-deps --target /tmp/st1 .carry/st1/*.whl
export PYTHONPATH=/tmp/st1
mkdir -p $OUT
O=${OPS:-all_reduce,reduce,reduce_scatter,broadcast,scatter,all_to_all}
for spec in "$@"; do
  IFS=: read W E C EXTRA <<< "$spec"
  echo "=== ranks $W elems $E calls $C ${EXTRA:-}" >> $OUT/spans.txt
  env ELEMS=$E CALLS=$C OPS=$O ${EXTRA//,/ } timeout 120 torchrun --nproc_per_node=$W benchmarks/cpu_small_latency.py 2>&1 \
    | grep -v "^W11\|OMP_NUM\|^\*\*\*\*" >> $OUT/spans.txt
done
tail -3 $OUT/spans.txt
