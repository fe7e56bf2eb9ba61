#!/bin/bash
# reduce at 1-16 MiB: single-copy reads from 1 MiB (RUSTCCL_SHM_ATTACH_MIN_BYTES=1048576: the root's pool reads the reduced parts) vs the default (two-copy below 16 MiB), fin = 9b0606c, 8 and 4 ranks, alternating twice.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/fin .carry/fin/*.whl
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
for W in 8 4; do
 for rep in 1 2; do
  for v in def a1m; do
   st w$W-$v-r$rep
   if [ $v = a1m ]; then export RUSTCCL_SHM_ATTACH_MIN_BYTES=1048576; else unset RUSTCCL_SHM_ATTACH_MIN_BYTES; fi
   PYTHONPATH=/tmp/fin timeout 60 python3 -m rustccl.bench --device cpu --world $W --min-bytes 1048576 --max-bytes 16777216 --factor 2 --repeats 3 --ops reduce,all_reduce --no-pp --no-progress --check --machine h100host --out $R --name w$W-$v-r$rep > $R/log-w$W-$v-r$rep.txt 2>&1
   echo "exit $?" >> $R/log-w$W-$v-r$rep.txt
  done
 done
done
unset RUSTCCL_SHM_ATTACH_MIN_BYTES
st end
cd $OUT && tar czf res.tgz res && rm -rf res
