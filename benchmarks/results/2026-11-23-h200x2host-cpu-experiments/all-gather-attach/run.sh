#!/bin/bash
# 32-core host: all_gather with single-copy reads at the default threshold (on the gathered total, 16 MiB) vs off
# (two-copy at every size), A/B against gloo, 8 ranks twice, 4 ranks once, alternating; commit in .carry/h2/COMMIT.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/h2 .carry/h2/*.whl
export PYTHONPATH=/tmp/h2
for run in 8-1 8-2 4-1; do
  w=${run%-*}
  for v in default off; do
    grep '^cpu ' /proc/stat >> $R/steal.txt
    if [ $v = off ]; then export RUSTCCL_SHM_ATTACH_MIN_BYTES=off; else unset RUSTCCL_SHM_ATTACH_MIN_BYTES; fi
    timeout 60 python3 -m rustccl.bench --device cpu --world $w --ops all_gather --min-bytes 512K --max-bytes 32M --iters 10 --no-pp --no-progress --machine h200x2host --out $R --name ag-$v-${run} > $R/log-$v-$run.txt 2>&1
  done
done
unset RUSTCCL_SHM_ATTACH_MIN_BYTES
grep '^cpu ' /proc/stat >> $R/steal.txt
rm -f $R/*.png $R/*.md
cd $OUT && tar czf res.tgz res && rm -rf res
