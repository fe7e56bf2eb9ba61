#!/bin/bash
# 32-core host of the 2x H200 machine: full A/B sweeps against gloo (with torch's floor at <= 64 KiB), 8 then 4 ranks, --check, this session's build.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/h2b .carry/h2b/*.whl
export PYTHONPATH=/tmp/h2b
for w in 8; do
  grep '^cpu ' /proc/stat >> $R/steal.txt
  timeout 280 python3 -m rustccl.bench --device cpu --world $w --check --no-progress --machine h200x2host --out $R --name h200x2host-cpu-${w}rank-run2 > $R/sweep-$w.log 2>&1
  echo "exit $?" >> $R/sweep-$w.log
done
grep '^cpu ' /proc/stat >> $R/steal.txt
cd $OUT && tar czf res.tgz res && rm -rf res
