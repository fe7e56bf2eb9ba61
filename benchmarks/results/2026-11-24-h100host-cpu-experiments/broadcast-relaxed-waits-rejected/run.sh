#!/bin/bash
# Pipelined broadcast: readers wait only for the root (rw) vs everyone waiting for everyone each step (fin = 9b0606c), 512 KiB - 32 MiB, 8 and 4 ranks, alternating twice.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
for b in fin rw; do python3 -m pip install -q --no-deps --target /tmp/$b .carry/$b/*.whl; done
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
for W in 8 4; do
 for rep in 1 2; do
  for b in fin rw; do
   st w$W-$b-r$rep
   PYTHONPATH=/tmp/$b timeout 60 python3 -m rustccl.bench --device cpu --world $W --min-bytes 524288 --max-bytes 33554432 --factor 2 --repeats 3 --ops broadcast --no-pp --no-progress --check --machine h100host --out $R --name w$W-$b-r$rep > $R/log-w$W-$b-r$rep.txt 2>&1
   echo "exit $?" >> $R/log-w$W-$b-r$rep.txt
  done
 done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
