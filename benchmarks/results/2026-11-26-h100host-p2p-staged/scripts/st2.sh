#!/bin/bash
# Staged sends: ping-pong A/B (trace build with tracing off; staging off vs on, alternating), then traces.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/tr2 .carry/tr2/*.whl
export PYTHONPATH=/tmp/tr2
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
for rep in 1 2 3; do
 for S in 0 4194304; do
  for W in 2 4; do
   st pp-r$rep-s$S-w$W
   RUSTCCL_SHM_STAGED_SEND_MAX_BYTES=$S timeout 60 torchrun --nproc-per-node $W .carry/scripts/pp2.py 1048576,2097152,3145728,4194304 10 30 2>&1 | grep one-way | sed "s/^/w$W s$S r$rep /" >> $R/pp.txt
  done
 done
done
for W in 2 4; do
 RUSTCCL_TMP_TRACE=1 timeout 60 torchrun --nproc-per-node $W .carry/scripts/pp2.py 2097152,4194304 3 2 > $R/trace-w$W.txt 2>&1
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
