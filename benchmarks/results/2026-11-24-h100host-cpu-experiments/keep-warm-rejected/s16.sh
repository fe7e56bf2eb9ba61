#!/bin/bash
# Keep-warm worker threads: A/B of RUSTCCL_SHM_SPIN_US and the smallest piece at 128 KiB - 8 MiB, variants alternating, each run rustccl vs gloo in one process.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
W=${W:-4}; REPS=${REPS:-2}; MACH=${MACH:-h100host}; T=${T:-60}
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/sp .carry/sp/*.whl
export PYTHONPATH=/tmp/sp
nproc > $R/nproc.txt
for rep in $(seq 1 $REPS); do
 for v in "s0:RUSTCCL_SHM_SPIN_US=0" "s100:RUSTCCL_SHM_SPIN_US=100" "s100p64:RUSTCCL_SHM_SPIN_US=100 RUSTCCL_SHM_MIN_PIECE_BYTES=65536" "s0p64:RUSTCCL_SHM_SPIN_US=0 RUSTCCL_SHM_MIN_PIECE_BYTES=65536"; do
  name=${v%%:*}; envs=${v#*:}
  echo "$(date +%T) $W $name rep$rep $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
  env $envs timeout $T python3 -m rustccl.bench --device cpu --world $W --min-bytes 131072 --max-bytes 8388608 --factor 2 --repeats 3 --no-pp --no-progress --machine $MACH --out $R --name $MACH-${W}rank-$name-r$rep > $R/log-$W-$name-r$rep.txt 2>&1
  echo "exit $?" >> $R/log-$W-$name-r$rep.txt
 done
done
echo "$(date +%T) end $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt
cd $OUT && tar czf res.tgz res && rm -rf res
