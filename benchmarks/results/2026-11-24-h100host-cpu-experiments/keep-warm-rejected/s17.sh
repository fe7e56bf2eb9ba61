#!/bin/bash
# Host memory: aggregate copy bandwidth with 1..all cores; then 8 ranks keep-warm A/B (spin 0 / 100), two alternations.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/sp .carry/sp/*.whl
export PYTHONPATH=/tmp/sp
N=$(nproc); echo $N > $R/nproc.txt
echo "$(date +%T) membw $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
timeout 150 python3 .carry/scripts/membw.py 1,2,4,8,$((N/2)),$N > $R/membw.txt 2>&1
W=8
for rep in 1 2; do
 for v in "s0:RUSTCCL_SHM_SPIN_US=0" "s100:RUSTCCL_SHM_SPIN_US=100"; do
  name=${v%%:*}; envs=${v#*:}
  echo "$(date +%T) $W $name rep$rep $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
  env $envs timeout 80 python3 -m rustccl.bench --device cpu --world $W --min-bytes 131072 --max-bytes 8388608 --factor 2 --repeats 3 --no-pp --no-progress --ops all_reduce,broadcast,all_to_all,scatter,gather,reduce,all_gather --machine h100host --out $R --name h100host-${W}rank-$name-r$rep > $R/log-$W-$name-r$rep.txt 2>&1
  echo "exit $?" >> $R/log-$W-$name-r$rep.txt
 done
done
echo "$(date +%T) end $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
cd $OUT && tar czf res.tgz res && rm -rf res
