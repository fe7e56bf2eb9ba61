#!/bin/bash
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0 PYTHONPATH=/tmp/st1
rm -rf /tmp/st1; python3 -m pip install -q --no-deps --target /tmp/st1 .carry/st1/*.whl
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $OUT/steal.txt; }
nproc > $OUT/host.txt
for w in 16 8; do for e in 524288 2097152; do
  st $w-$e
  RUSTCCL_HOST_PROFILE=1 ELEMS=$e CALLS=100 OPS=reduce,all_reduce timeout 60 torchrun --nproc_per_node=$w .carry/lat.py > $OUT/p-$w-$e.txt 2>&1
  st $w-$e-twocopy
  RUSTCCL_SHM_ATTACH_MIN_BYTES=1G RUSTCCL_HOST_PROFILE=1 ELEMS=$e CALLS=100 OPS=reduce timeout 60 torchrun --nproc_per_node=$w .carry/lat.py > $OUT/p-$w-$e-twocopy.txt 2>&1
done; done
st end
