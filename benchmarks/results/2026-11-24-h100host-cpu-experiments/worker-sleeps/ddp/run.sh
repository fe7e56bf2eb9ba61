#!/bin/bash
# 16-core host: DDP toy step (async all_reduce through the comm hook path, run by the engine's worker),
# h0 (06ee8d0) vs h2b (worker sleeps through blocking calls), 8 ranks, alternating twice.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
for v in h0 h2b; do python3 -m pip install -q --no-deps --target /tmp/$v .carry/$v/*.whl; done
for i in 1 2; do
  for v in h0 h2b; do
    grep '^cpu ' /proc/stat >> $R/steal.txt
    PYTHONPATH=/tmp/$v timeout 150 python3 -m rustccl.bench --device cpu --world 8 --ops all_reduce --max-bytes 2K --ddp --no-pp --no-progress --machine h100host --out $R --name ddp-$v-$i > $R/log-$v-$i.txt 2>&1
    echo "exit $?" >> $R/log-$v-$i.txt
  done
done
grep '^cpu ' /proc/stat >> $R/steal.txt
rm -f $R/*.png
cd $OUT && tar czf res.tgz res && rm -rf res
