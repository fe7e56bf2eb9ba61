#!/bin/bash
# Trace of rendezvous send/recv ping-pong (temporary trace build), 2 ranks.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/tr .carry/tr/*.whl
export PYTHONPATH=/tmp/tr
nproc > $R/nproc.txt
for k in 1 2; do
 torchrun --nproc-per-node 2 .carry/scripts/pp2.py 131072,524288,1048576,2097152,4194304,8388608 20 50 > $R/time-$k.txt 2>&1
done
RUSTCCL_TMP_TRACE=1 torchrun --nproc-per-node 2 .carry/scripts/pp2.py 524288,2097152,8388608 3 2 > $R/trace.txt 2>&1
RUSTCCL_TMP_TRACE=1 torchrun --nproc-per-node 4 .carry/scripts/pp2.py 2097152 3 2 > $R/trace4.txt 2>&1
cd $OUT && tar czf res.tgz res && rm -rf res
