#!/bin/bash
# Small-op latency breakdown (lat.py) on the 16-core host: 8 ranks default / attach off, 4 ranks default.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/h0 .carry/h0/*.whl
export PYTHONPATH=/tmp/h0
nproc > $R/nproc.txt; lscpu > $R/lscpu.txt 2>&1
OPS=all_reduce,broadcast,barrier,scatter,gather,all_to_all,all_gather,reduce,send_recv
for run in 8-default 8-off 4-default 8-default2; do
  w=${run%-*}; v=${run#*-}
  grep '^cpu ' /proc/stat >> $R/steal.txt
  if [ "$v" = off ]; then export RUSTCCL_SHM_ATTACH_MIN_BYTES=off; else unset RUSTCCL_SHM_ATTACH_MIN_BYTES; fi
  timeout 150 torchrun --nproc-per-node $w --master-port 29511 .carry/scripts/lat.py $OPS > $R/lat-$run.txt 2>&1
  echo "exit $?" >> $R/lat-$run.txt
done
grep '^cpu ' /proc/stat >> $R/steal.txt
cd $OUT && tar czf res.tgz res && rm -rf res
