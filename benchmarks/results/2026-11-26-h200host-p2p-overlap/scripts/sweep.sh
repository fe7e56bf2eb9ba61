#!/bin/bash
# Full A/B sweeps (rustccl vs gloo alternating in one process, --check) of this session's final build.
# MACH: label; WORLDS: rank counts, largest first.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/fin .carry/fin/*.whl
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
(lscpu; echo; cat /sys/kernel/mm/transparent_hugepage/enabled; ls /sys/devices/system/node; free -g; df -h /dev/shm) > $R/host.txt 2>&1
for W in $WORLDS; do
 st sweep-$W
 PYTHONPATH=/tmp/fin timeout ${T:-330} python3 -m rustccl.bench --device cpu --world $W --check --no-progress --machine $MACH --out $R --name $MACH-cpu-${W}rank > $R/log-$W.txt 2>&1
 echo "exit $?" >> $R/log-$W.txt
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
