#!/bin/bash
# A/B of the engine worker: h0 (06ee8d0: worker polls 50 us after every submission, grace 20 us) vs
# h1 (worker sleeps through blocking calls, grace 10 ms, hand-off on sleeping waits), lat.py small ops,
# 8 ranks twice and 4 ranks once per build, alternating; then the h1 bench at small sizes (floor column).
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
for v in h0 h1; do python3 -m pip install -q --no-deps --target /tmp/$v .carry/$v/*.whl; done
OPS=all_reduce,broadcast,barrier,scatter,gather,all_to_all,all_gather,reduce,send_recv
for run in 8-1 4-1 8-2; do
  w=${run%-*}
  for v in h0 h1; do
    grep '^cpu ' /proc/stat >> $R/steal.txt
    PYTHONPATH=/tmp/$v N=300 timeout 150 torchrun --nproc-per-node $w --master-port 29511 .carry/scripts/lat.py $OPS > $R/lat-$v-$run.txt 2>&1
    echo "exit $?" >> $R/lat-$v-$run.txt
  done
done
grep '^cpu ' /proc/stat >> $R/steal.txt
PYTHONPATH=/tmp/h1 timeout 200 python3 -m rustccl.bench --device cpu --world 8 --max-bytes 32K --no-pp --no-progress --machine h100host --out $R --name small-h1-8rank > $R/bench8.log 2>&1
grep '^cpu ' /proc/stat >> $R/steal.txt
rm -f $R/*.png
cd $OUT && tar czf res.tgz res && rm -rf res
