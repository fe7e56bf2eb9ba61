#!/bin/bash
# 64-core host, build 1701c97: (1) all_reduce / reduce 8-32 MiB with single-copy reads from 16 MiB (default) vs
# never for collectives (RUSTCCL_SHM_ATTACH_MIN_BYTES=1 GiB), 16 and 8 ranks; (2) staged sends on/off, send_recv
# 1-4 MiB, 16 and 2 ranks. Settings alternate, two rounds each.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/h2 .carry/h2/*.whl
export PYTHONPATH=/tmp/h2
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
B="python3 -m rustccl.bench --device cpu --check --no-progress --machine h200x4host --out $R"
for rep in 1 2; do
 for W in 16 8; do
  for A in auto 1073741824; do
   st ar-r$rep-w$W-a$A
   RUSTCCL_SHM_ATTACH_MIN_BYTES=$A timeout 90 $B --world $W --ops all_reduce,reduce --min-bytes 8388608 --max-bytes 33554432 --factor 2 --no-pp --name ar-w$W-a$A-r$rep > $R/log-ar-w$W-a$A-r$rep.txt 2>&1
  done
 done
done
for rep in 1 2; do
 for W in 16 2; do
  for S in 0 4194304; do
   st sr-r$rep-w$W-s$S
   RUSTCCL_SHM_STAGED_SEND_MAX_BYTES=$S timeout 60 $B --world $W --ops send_recv --min-bytes 1048576 --max-bytes 4194304 --factor 2 --name sr-w$W-s$S-r$rep > $R/log-sr-w$W-s$S-r$rep.txt 2>&1
  done
 done
done
st end
rm -f $R/*.png
cd $OUT && tar czf res.tgz res && rm -rf res
