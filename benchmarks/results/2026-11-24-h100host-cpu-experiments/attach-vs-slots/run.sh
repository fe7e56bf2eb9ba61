#!/bin/bash
# >= 16 MiB reducing ops and all_gather: attach (rt = 9ee81b1 equivalent) vs attach with 256 KiB read blocks (bp X_BLOCK) vs no attach (two-copy slots).
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
for b in rt bp; do python3 -m pip install -q --no-deps --target /tmp/$b .carry/$b/*.whl; done
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
one() { # name wheel envs...
  local name=$1 b=$2; shift 2
  st $name
  env "$@" PYTHONPATH=/tmp/$b timeout 100 python3 -m rustccl.bench --device cpu --world $W --min-bytes 16777216 --max-bytes 67108864 --factor 2 --repeats 3 --iters 5 --warmup 2 --ops all_reduce,reduce,reduce_scatter,all_gather --no-pp --no-progress --machine h100host --out $R --name $name > $R/log-$name.txt 2>&1
  echo "exit $?" >> $R/log-$name.txt
}
for W in 8 4; do
 for rep in 1 2; do
  one w$W-rt-r$rep rt X=1
  one w$W-b256-r$rep bp RUSTCCL_X_BLOCK=262144
  one w$W-off-r$rep bp RUSTCCL_SHM_ATTACH_MIN_BYTES=off
 done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
