#!/bin/bash
# Shared tensors A/B: rustccl with RUSTCCL_SHM_TENSORS=1 and =0, each against gloo alternating, W ranks.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
python3 -m pip install -q --no-deps --target /tmp/st1 .carry/st1/*.whl
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
(lscpu; free -g; df -h /dev/shm; cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/shmem_enabled) > $R/host.txt 2>&1
for K in ${KS:-a}; do for W in $WORLDS; do for V in ${VS:-1 0}; do
 st w$W-t$V
 RUSTCCL_SHM_TENSORS=$V PYTHONPATH=/tmp/st1 timeout ${T:-140} python3 -m rustccl.bench --device cpu --world $W --check --no-progress --no-pp --min-bytes 256K --max-bytes 32M --iters ${ITERS:-10} --machine $MACH --out $R --name $MACH-w$W-t$V-$K > $R/log-w$W-t$V-$K.txt 2>&1
 echo "exit $?" >> $R/log-w$W-t$V-$K.txt
done; done; done
for V in ${PPV:-}; do
 st pp-t$V
 RUSTCCL_SHM_TENSORS=$V PYTHONPATH=/tmp/st1 timeout 90 python3 -m rustccl.bench --device cpu --world 4 --no-progress --ops send_recv --min-bytes 1M --max-bytes 1M --machine $MACH --out $R --name $MACH-pp-t$V > $R/log-pp-t$V.txt 2>&1
 echo "exit $?" >> $R/log-pp-t$V.txt
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
