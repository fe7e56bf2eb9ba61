#!/bin/bash
# 16-core host: p2p loop thread naps while a waiting thread drives (h3) vs polls (h2b = 242d067):
# bench send_recv (all sizes) + pipeline step, A/B against gloo, 8 ranks twice, 4 ranks once per build, alternating.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
for v in h2b h3; do python3 -m pip install -q --no-deps --target /tmp/$v .carry/$v/*.whl; done
for run in 8-1 4-1 8-2; do
  w=${run%-*}
  for v in h2b h3; do
    grep '^cpu ' /proc/stat >> $R/steal.txt
    PYTHONPATH=/tmp/$v timeout 150 python3 -m rustccl.bench --device cpu --world $w --ops send_recv --no-progress --machine h100host --out $R --name p2p-$v-$run > $R/log-$v-$run.txt 2>&1
    echo "exit $?" >> $R/log-$v-$run.txt
  done
done
grep '^cpu ' /proc/stat >> $R/steal.txt
rm -f $R/*.png
cd $OUT && tar czf res.tgz res && rm -rf res
