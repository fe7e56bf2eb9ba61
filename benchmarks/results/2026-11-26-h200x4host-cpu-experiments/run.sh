#!/bin/bash
# 64-core host: full A/B sweeps of 2d8def9 against gloo, 16 then 8 ranks, --check.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/h .carry/h/*.whl
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
(lscpu; echo; cat /sys/kernel/mm/transparent_hugepage/enabled; ls /sys/devices/system/node; free -g) > $R/host.txt 2>&1
for W in 16 8; do
 st sweep-$W
 if [ $W = 16 ]; then T=330; else T=200; fi
 PYTHONPATH=/tmp/h timeout $T python3 -m rustccl.bench --device cpu --world $W --check --no-progress --machine h200x4host --out $R --name h200x4host-cpu-${W}rank > $R/log-$W.txt 2>&1
 echo "exit $?" >> $R/log-$W.txt
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
