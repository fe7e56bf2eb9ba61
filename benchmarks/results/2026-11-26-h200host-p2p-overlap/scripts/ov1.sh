#!/bin/bash
# Overlapped staged sends: ping-pong one-way us, old build (h2: staged, copies in turn) vs new (ov: chunked, overlapped) at 4 MiB staging, and new with 16 MiB; alternating.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
for w in h2 ov; do python3 -m pip install -q --no-deps --target /tmp/$w .carry/$w/*.whl; done
nproc > $R/host.txt; lscpu | grep -E "Model name|^CPU\(s\)|L3" >> $R/host.txt
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
SIZES=1048576,2097152,3145728,4194304,6291456,8388608,16777216
for rep in 1 2; do
 for v in "h2:4194304" "ov:4194304" "ov:16777216"; do
  w=${v%%:*}; S=${v#*:}
  for W in 2 4; do
   st pp-r$rep-$w-s$S-w$W
   PYTHONPATH=/tmp/$w RUSTCCL_SHM_STAGED_SEND_MAX_BYTES=$S timeout 90 torchrun --nproc-per-node $W .carry/scripts/pp2.py $SIZES 10 30 2>&1 | grep -E "one-way|Error|error" | sed "s/^/w$W $w s$S r$rep /" >> $R/pp.txt
  done
 done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
