#!/bin/bash
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0 PYTHONPATH=/tmp/st1 RUSTCCL_HOST_PROFILE=1
rm -rf /tmp/st1; python3 -m pip install -q --no-deps --target /tmp/st1 .carry/st1/*.whl
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $OUT/steal.txt; }
for v in "d5:ELEMS=524288" "d1:ELEMS=1048576" "d2:ELEMS=2097152" "sp:ELEMS=1048576,RUSTCCL_SHM_SPIN_US=2000" "pc:ELEMS=1048576,RUSTCCL_SHM_MIN_PIECE_BYTES=1048576" "d1b:ELEMS=1048576"; do
  n=${v%%:*}; x=${v#*:}
  st $n
  env ${x//,/ } CALLS=100 OPS=scatter timeout 40 torchrun --nproc_per_node=2 .carry/lat.py 2>&1 | grep -v Warn > $OUT/q-$n.txt
  python3 -c "import rustccl" 2>/dev/null
done
st end
PYTHONPATH=/tmp/st1 python3 -c "
import os; os.environ['RUSTCCL_HOST_PROFILE']='0'
" ; grep -h "^{" $OUT/q-*.txt
