#!/bin/bash
# Single-reader threshold A/B: blocks of all_to_all / gather / scatter read from the sender's tensor (default: > 256 KiB) or copied through its slot (up to 1 MiB / 4 MiB), variants alternating.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
MACH=${MACH:-h100host}; T=${T:-60}
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/mf .carry/mf/*.whl
export PYTHONPATH=/tmp/mf
for W in 4 8; do
for rep in 1 2; do
 for v in "d:RUSTCCL_SHM_SINGLE_READER_MIN_BYTES=0" "m1:RUSTCCL_SHM_SINGLE_READER_MIN_BYTES=1048576" "m4:RUSTCCL_SHM_SINGLE_READER_MIN_BYTES=4194304"; do
  name=${v%%:*}; envs=${v#*:}
  echo "$(date +%T) $W $name rep$rep $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
  env $envs timeout $T python3 -m rustccl.bench --device cpu --world $W --min-bytes 262144 --max-bytes 33554432 --factor 2 --repeats 3 --no-pp --no-progress --ops scatter,all_to_all,gather --machine $MACH --out $R --name $MACH-${W}rank-$name-r$rep > $R/log-$W-$name-r$rep.txt 2>&1
  echo "exit $?" >> $R/log-$W-$name-r$rep.txt
 done
done
done
echo "$(date +%T) end $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
cd $OUT && tar czf res.tgz res && rm -rf res
