#!/bin/bash
# 4-rank all_gather 128 KiB - 1 MiB: fin (9b0606c) vs rt (2df0636), alternating 3 times (the 512 KiB row of sweep-9b0606c took 389 us against 108).
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
for b in rt fin; do python3 -m pip install -q --no-deps --target /tmp/$b .carry/$b/*.whl; done
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
for rep in 1 2 3; do
 for b in rt fin; do
  st $b-r$rep
  PYTHONPATH=/tmp/$b timeout 60 python3 -m rustccl.bench --device cpu --world 4 --min-bytes 131072 --max-bytes 2097152 --factor 2 --repeats 3 --ops all_gather,broadcast --no-pp --no-progress --check --machine h100host --out $R --name w4-$b-r$rep > $R/log-$b-r$rep.txt 2>&1
  echo "exit $?" >> $R/log-$b-r$rep.txt
 done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
