#!/bin/bash
# Pipelined shm broadcast (bp, RUSTCCL_X_BCAST_STEPS) vs 9ee81b1-equivalent (rt), then slots vs attach at 8-64 MiB.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
for b in rt bp; do python3 -m pip install -q --no-deps --target /tmp/$b .carry/$b/*.whl; done
nproc > $R/nproc.txt; lscpu > $R/lscpu.txt 2>&1
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
one() { # name wheel minb maxb envs...
  local name=$1 b=$2 lo=$3 hi=$4; shift 4
  st $name
  env "$@" PYTHONPATH=/tmp/$b timeout 70 python3 -m rustccl.bench --device cpu --world $W --min-bytes $lo --max-bytes $hi --factor 2 --repeats 3 --ops broadcast --no-pp --no-progress --check --machine h100host --out $R --name $name > $R/log-$name.txt 2>&1
  echo "exit $?" >> $R/log-$name.txt
}
for W in 8 4; do
 for rep in 1 2; do
  one w$W-rt-r$rep rt 262144 8388608 X=1
  for s in 2 4 8; do one w$W-bp$s-r$rep bp 262144 8388608 RUSTCCL_X_BCAST_STEPS=$s; done
 done
done
for W in 8 4; do
 for rep in 1 2; do
  one w$W-big-rt-r$rep rt 8388608 67108864 X=1
  one w$W-big-bp4off-r$rep bp 8388608 67108864 RUSTCCL_X_BCAST_STEPS=4 RUSTCCL_SHM_ATTACH_MIN_BYTES=off
 done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
