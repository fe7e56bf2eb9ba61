#!/bin/bash
# Full A/B sweeps (rustccl vs gloo, torch floor, memory floor) of this build, --check; then large sizes for the memory floor.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
MACH=${MACH:-h200x2host}; WS=${WS:-"4 8"}; BIG=${BIG:-""}; T=${T:-280}
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/mf .carry/mf/*.whl
export PYTHONPATH=/tmp/mf
lscpu > $R/lscpu.txt; cat /sys/devices/system/cpu/cpu0/cache/index*/size > $R/cache.txt 2>&1
for w in $WS; do
  echo "$(date +%T) full $w $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
  timeout $T python3 -m rustccl.bench --device cpu --world $w --check --no-progress --machine $MACH --out $R --name $MACH-cpu-${w}rank > $R/sweep-$w.log 2>&1
  echo "exit $?" >> $R/sweep-$w.log
done
for w in $BIG; do
  echo "$(date +%T) big $w $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
  timeout $T python3 -m rustccl.bench --device cpu --world $w --min-bytes 33554432 --max-bytes 134217728 --factor 2 --no-pp --ops all_reduce,all_gather,reduce_scatter,broadcast,all_to_all,reduce,gather,scatter --no-progress --machine $MACH --out $R --name $MACH-cpu-${w}rank-large > $R/big-$w.log 2>&1
  echo "exit $?" >> $R/big-$w.log
done
echo "$(date +%T) end $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
cd $OUT && tar czf res.tgz res && rm -rf res
