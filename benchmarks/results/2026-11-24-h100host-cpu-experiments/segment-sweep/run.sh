#!/bin/bash
# RUSTCCL_SHM_SEGMENT_BYTES sweep (the two-copy all_reduce / reduce / reduce_scatter rounds), fin = 9b0606c, 512 KiB - 8 MiB, 8 and 4 ranks, variants alternating twice.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/fin .carry/fin/*.whl
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
for W in 8 4; do
 for rep in 1 2; do
  for seg in 262144 131072 524288 1048576; do
   st w$W-s$seg-r$rep
   RUSTCCL_SHM_SEGMENT_BYTES=$seg PYTHONPATH=/tmp/fin timeout 60 python3 -m rustccl.bench --device cpu --world $W --min-bytes 524288 --max-bytes 8388608 --factor 2 --repeats 3 --ops all_reduce,reduce,reduce_scatter --no-pp --no-progress --check --machine h100host --out $R --name w$W-s$seg-r$rep > $R/log-w$W-s$seg-r$rep.txt 2>&1
   echo "exit $?" >> $R/log-w$W-s$seg-r$rep.txt
  done
 done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
