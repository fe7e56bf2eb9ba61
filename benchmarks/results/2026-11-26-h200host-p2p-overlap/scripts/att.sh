#!/bin/bash
# Single-copy reads for the buffer-wide collectives: from 16 MiB (the default where a rank has 2+ threads)
# vs from 4 MiB per local rank (32 MiB with 8 ranks, 16 with 4) vs off (RUSTCCL_SHM_ATTACH_MIN_BYTES),
# 8-64 MiB, alternating. WORLDS: rank counts.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/fin .carry/fin/*.whl
export PYTHONPATH=/tmp/fin
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
for W in $WORLDS; do
for rep in 1 2; do
 for v in "a16:16777216" "aslice:$((W * 4194304))" "aoff:1099511627776"; do
  name=${v%%:*}; A=${v#*:}
  st $W $name rep$rep
  RUSTCCL_SHM_ATTACH_MIN_BYTES=$A timeout 120 python3 -m rustccl.bench --device cpu --world $W --min-bytes 8388608 --max-bytes 67108864 --factor 2 --repeats 3 --no-pp --no-progress --ops all_reduce,reduce,reduce_scatter,all_gather --machine $MACH --out $R --name $MACH-${W}rank-$name-r$rep > $R/log-$W-$name-r$rep.txt 2>&1
  echo "exit $?" >> $R/log-$W-$name-r$rep.txt
 done
done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
