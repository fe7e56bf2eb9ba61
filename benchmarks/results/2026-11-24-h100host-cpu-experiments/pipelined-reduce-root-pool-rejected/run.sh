#!/bin/bash
# Pipelined reduce with the root's copy-out on its solo-phase threads (rp = 9b0606c + that) vs rt (2df0636), 512 KiB - 8 MiB; then full A/B sweeps of rp, 8 and 4 ranks, --check.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R/ab $R/sweep
for b in rt rp; do python3 -m pip install -q --no-deps --target /tmp/$b .carry/$b/*.whl; done
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
for W in 8 4; do
 for rep in 1 2; do
  for b in rt rp; do
   st ab-w$W-$b-r$rep
   PYTHONPATH=/tmp/$b timeout 60 python3 -m rustccl.bench --device cpu --world $W --min-bytes 524288 --max-bytes 8388608 --factor 2 --repeats 3 --ops reduce --no-pp --no-progress --check --machine h100host --out $R/ab --name w$W-$b-r$rep > $R/ab/log-w$W-$b-r$rep.txt 2>&1
   echo "exit $?" >> $R/ab/log-w$W-$b-r$rep.txt
  done
 done
done
for W in 8 4; do
 st sweep-$W
 PYTHONPATH=/tmp/rp timeout 230 python3 -m rustccl.bench --device cpu --world $W --check --no-progress --machine h100host --out $R/sweep --name h100host-cpu-${W}rank > $R/sweep/log-$W.txt 2>&1
 echo "exit $?" >> $R/sweep/log-$W.txt
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
