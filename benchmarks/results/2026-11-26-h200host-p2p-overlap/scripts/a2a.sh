#!/bin/bash
# all_to_all / scatter blocks of 256 KiB - 4 MiB: read from the sender's tensor (d: default, > 256 KiB read)
# or copied through the sender's slots (m1: up to 1 MiB; m4: up to 4 MiB, slots of 1 MiB per thread), alternating.
# (The ninth session's attempt at this raised the single-reader setting, which then also sent every
# all_to_all through the rings: Attach::all_blocks followed it. Fixed in this build.)
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/ov .carry/ov/*.whl
export PYTHONPATH=/tmp/ov
MACH=${MACH:-h100host}
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
for W in 4 8; do
for rep in 1 2; do
 for v in "d:X=0" "m1:RUSTCCL_SHM_SINGLE_READER_MIN_BYTES=1048576" "m4:RUSTCCL_SHM_SINGLE_READER_MIN_BYTES=4194304 RUSTCCL_SHM_SEGMENT_BYTES=1048576"; do
  name=${v%%:*}; envs=${v#*:}
  st $W $name rep$rep
  env $envs timeout 70 python3 -m rustccl.bench --device cpu --world $W --min-bytes 524288 --max-bytes 16777216 --factor 2 --repeats 3 --no-pp --no-progress --ops all_to_all,scatter --machine $MACH --out $R --name $MACH-${W}rank-$name-r$rep > $R/log-$W-$name-r$rep.txt 2>&1
  echo "exit $?" >> $R/log-$W-$name-r$rep.txt
 done
done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
