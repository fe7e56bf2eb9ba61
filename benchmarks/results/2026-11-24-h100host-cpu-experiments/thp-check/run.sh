#!/bin/bash
# Do transparent huge pages slow the single-copy reads? fin (9b0606c), broadcast (reads of the root forced on), scatter, all_reduce at 2-32 MiB, THP on (host default) vs off for the rank processes (prctl PR_SET_THP_DISABLE via sitecustomize), alternating twice, 8 and 4 ranks.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/fin .carry/fin/*.whl
for f in enabled defrag shmem_enabled; do echo "$f: $(cat /sys/kernel/mm/transparent_hugepage/$f 2>&1)"; done > $R/thp.txt
uname -r >> $R/thp.txt
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
for W in 8 4; do
 for rep in 1 2; do
  for thp in on off; do
   st w$W-thp$thp-r$rep
   X_THP_DISABLE=$([ $thp = off ] && echo 1 || echo 0) RUSTCCL_SHM_BROADCAST_ATTACH_MIN_BYTES=0 PYTHONPATH=/tmp/fin:.carry/thp timeout 80 python3 -m rustccl.bench --device cpu --world $W --min-bytes 2097152 --max-bytes 33554432 --factor 4 --repeats 3 --ops broadcast,scatter,all_reduce --no-pp --no-progress --check --machine h100host --out $R --name w$W-thp$thp-r$rep > $R/log-w$W-thp$thp-r$rep.txt 2>&1
   echo "exit $?" >> $R/log-w$W-thp$thp-r$rep.txt
   grep AnonHugePages /proc/meminfo >> $R/log-w$W-thp$thp-r$rep.txt
  done
 done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
