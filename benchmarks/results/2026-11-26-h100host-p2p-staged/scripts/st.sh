#!/bin/bash
# Staged sends A/B (same build, RUSTCCL_SHM_STAGED_SEND_MAX_BYTES 0 vs default 4 MiB, alternating), send_recv vs gloo + pipeline step.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/st .carry/st/*.whl
export PYTHONPATH=/tmp/st
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
for rep in 1 2; do
 for S in 0 4194304; do
  for W in 2 4; do
   st r$rep-s$S-w$W
   RUSTCCL_SHM_STAGED_SEND_MAX_BYTES=$S timeout 100 python3 -m rustccl.bench --device cpu --world $W --ops send_recv --min-bytes 131072 --max-bytes 33554432 --check --no-progress --machine $1 --out $R --name $1-w$W-s$S-r$rep > $R/log-w$W-s$S-r$rep.txt 2>&1
   echo "exit $?" >> $R/log-w$W-s$S-r$rep.txt
  done
 done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
