#!/bin/bash
# Overlapped staged sends, second run: which sizes to stage. Ping-pong one-way us with the
# staging bounds (min exclusive, max inclusive) at 1 MiB / 4 MiB (the build's default) vs
# 256 KiB / 8 MiB, 2, 4 and 8 ranks (1, 2, 4 pairs at once), alternating.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/ov .carry/ov/*.whl
export PYTHONPATH=/tmp/ov
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
SIZES=262144,524288,1048576,2097152,4194304,8388608
for rep in 1 2; do
 for v in "1048576:4194304" "262144:8388608"; do
  MIN=${v%%:*}; MAX=${v#*:}
  for W in 2 4 8; do
   st pp-r$rep-min$MIN-max$MAX-w$W
   RUSTCCL_SHM_STAGED_SEND_MIN_BYTES=$MIN RUSTCCL_SHM_STAGED_SEND_MAX_BYTES=$MAX timeout 90 torchrun --nproc-per-node $W .carry/scripts/pp2.py $SIZES 10 30 2>&1 | grep -E "one-way|Error|error" | sed "s/^/w$W min$MIN max$MAX r$rep /" >> $R/pp.txt
  done
 done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
