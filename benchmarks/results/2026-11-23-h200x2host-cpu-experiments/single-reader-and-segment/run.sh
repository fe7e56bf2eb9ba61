#!/bin/bash
# 32-core host: (A) single-reader threshold for p2p/gather/scatter at 8 ranks, default vs 16 MiB;
# (B) all_reduce 8 ranks 512K-8M, shm segment 256K (default) vs 1M vs 64K. rustccl vs gloo A/B each run.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/head .carry/head/*.whl
export PYTHONPATH=/tmp/head
nproc > $R/info.txt; date >> $R/info.txt
B="python3 -m rustccl.bench --device cpu --no-progress --machine h200x2host --out $R --no-pp --repeats 3"
for i in 1 2; do
  for v in default 16777216; do
    grep '^cpu ' /proc/stat >> $R/steal.txt
    if [ $v = default ]; then unset RUSTCCL_SHM_SINGLE_READER_MIN_BYTES; else export RUSTCCL_SHM_SINGLE_READER_MIN_BYTES=$v; fi
    timeout 100 $B --world 8 --ops send_recv,gather,scatter --min-bytes 128K --max-bytes 8M --name single-$v-r$i > $R/log-single-$v-$i.txt 2>&1
  done
done
unset RUSTCCL_SHM_SINGLE_READER_MIN_BYTES
for i in 1 2; do
  for v in 262144 1048576 65536; do
    grep '^cpu ' /proc/stat >> $R/steal.txt
    RUSTCCL_SHM_SEGMENT_BYTES=$v timeout 80 $B --world 8 --ops all_reduce,reduce --min-bytes 512K --max-bytes 8M --factor 2 --name seg-$v-r$i > $R/log-seg-$v-$i.txt 2>&1
  done
done
grep '^cpu ' /proc/stat >> $R/steal.txt
rm -f $R/*.png $R/*.md
cd $OUT && tar czf res.tgz res && rm -rf res
