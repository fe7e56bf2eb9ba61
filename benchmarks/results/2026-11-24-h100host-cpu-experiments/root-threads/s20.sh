#!/bin/bash
# Root solo-phase threads A/B: RUSTCCL_SHM_ROOT_THREADS = the rank's own threads (as before) vs the default (up to 8), gather / scatter / broadcast / reduce, variants alternating.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
MACH=${MACH:-h100host}; T=${T:-70}
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/rt .carry/rt/*.whl
export PYTHONPATH=/tmp/rt
N=$(nproc)
for W in ${WS:-8 4}; do
 own=$(( N / W )); [ $own -gt 8 ] && own=8; [ $own -lt 1 ] && own=1
 for rep in 1 2; do
  for v in "own:RUSTCCL_SHM_ROOT_THREADS=$own" "wide:RUSTCCL_SHM_ROOT_THREADS=0"; do
   name=${v%%:*}; envs=${v#*:}
   echo "$(date +%T) $W $name rep$rep $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
   env $envs timeout $T python3 -m rustccl.bench --device cpu --world $W --min-bytes 131072 --max-bytes 33554432 --factor 2 --repeats 3 --no-pp --no-progress --ops ${OPS:-gather,scatter,broadcast,reduce} --machine $MACH --out $R --name $MACH-${W}rank-$name-r$rep > $R/log-$W-$name-r$rep.txt 2>&1
   echo "exit $?" >> $R/log-$W-$name-r$rep.txt
  done
 done
done
echo "$(date +%T) end $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
cd $OUT && tar czf res.tgz res && rm -rf res
