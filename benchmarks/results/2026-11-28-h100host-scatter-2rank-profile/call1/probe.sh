#!/bin/bash
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0 PYTHONPATH=/tmp/st1 RUSTCCL_HOST_PROFILE=1
rm -rf /tmp/st1; python3 -m pip install -q --no-deps --target /tmp/st1 .carry/st1/*.whl
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $OUT/steal.txt; }
nproc > $OUT/host.txt
for e in 262144 1048576 4194304; do
  for v in d "l:RUSTCCL_SHM_QUICK_LEADS=0" "s:RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES=16777216"; do
    n=${v%%:*}; x=${v#*:}; [ "$n" = d ] && x=
    st $e-$n
    env $x ELEMS=$e CALLS=100 OPS=scatter,gather timeout 60 torchrun --nproc_per_node=2 .carry/lat.py 2>&1 | grep -v Warn >> $OUT/p-$n.txt
  done
done
st end
