#!/bin/bash
# 64-core host: the 16-rank full A/B sweep of this session's final build (--check), then all_reduce
# 8-64 MiB with 16 ranks reading peers from 16 MiB (the old default, a16) vs the new host rule (4 MiB per
# local rank: 64 MiB, auto), alternating.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/fin .carry/fin/*.whl
export PYTHONPATH=/tmp/fin
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
(lscpu; echo; cat /sys/kernel/mm/transparent_hugepage/enabled; free -g; df -h /dev/shm) > $R/host.txt 2>&1
st sweep-16
timeout 300 python3 -m rustccl.bench --device cpu --world 16 --check --no-progress --machine h200x4host --out $R --name h200x4host-cpu-16rank > $R/log-16.txt 2>&1
echo "exit $?" >> $R/log-16.txt
cd $OUT && tar czf res.tgz res
for rep in 1 2; do
 for v in "a16:16777216" "auto:auto"; do
  name=${v%%:*}; A=${v#*:}
  st ar-$name-r$rep
  RUSTCCL_SHM_ATTACH_MIN_BYTES=$A timeout 60 python3 -m rustccl.bench --device cpu --world 16 --min-bytes 8388608 --max-bytes 67108864 --factor 2 --repeats 3 --no-pp --no-progress --ops all_reduce --machine h200x4host --out $R --name h200x4host-16rank-ar-$name-r$rep > $R/log-ar-$name-r$rep.txt 2>&1
  echo "exit $?" >> $R/log-ar-$name-r$rep.txt
  cd $OUT && tar czf res.tgz res; cd - > /dev/null
 done
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
