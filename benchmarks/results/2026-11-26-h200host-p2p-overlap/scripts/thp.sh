#!/bin/bash
# Do cross-memory reads of peers' tensors get faster when torch puts large CPU tensors on
# transparent huge pages (THP_MEM_ALLOC_ENABLE=1: fewer pages to pin and walk per read)?
# Ops that read peers' tensors at 4-64 MiB, 8 and 4 ranks, off / on alternating.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/fin .carry/fin/*.whl
export PYTHONPATH=/tmp/fin
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}') thp=$(grep -E 'AnonHugePages' /proc/meminfo | awk '{print $2}')kB" >> $R/steal.txt; }
cat /sys/kernel/mm/transparent_hugepage/enabled > $R/host.txt
for W in 8 4; do
for rep in 1 2; do
 for v in off on; do
  st $W $v rep$rep
  if [ $v = on ]; then E="THP_MEM_ALLOC_ENABLE=1"; else E="X=0"; fi
  env $E timeout 100 python3 -m rustccl.bench --device cpu --world $W --min-bytes 4194304 --max-bytes 67108864 --factor 4 --repeats 3 --no-pp --no-progress --ops all_reduce,all_to_all,reduce,send_recv,gather --machine h200host --out $R --name h200host-${W}rank-thp$v-r$rep > $R/log-$W-$v-r$rep.txt 2>&1
  echo "exit $?" >> $R/log-$W-$v-r$rep.txt
 done
done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
