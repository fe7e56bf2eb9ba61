#!/bin/bash
# 32-core host: reductions in pieces of min_piece/n (sp) vs 128 KiB (h2), alternating, 8, 4 then 16 ranks, A/B against gloo.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
for v in h2 sp; do python3 -m pip install -q --no-deps --target /tmp/$v .carry/$v/*.whl; done
date > $R/info.txt
for w in 8 4 16; do
  for i in $( [ $w = 16 ] && echo 1 || echo 1 2 ); do
    for v in h2 sp; do
      grep '^cpu ' /proc/stat >> $R/steal.txt
      PYTHONPATH=/tmp/$v timeout 90 python3 -m rustccl.bench --device cpu --world $w --ops all_reduce,reduce,reduce_scatter --min-bytes 128K --max-bytes 8M --factor 2 --no-pp --no-progress --machine h200x2host --out $R --name $v-${w}rank-r$i > $R/log-$v-$w-$i.txt 2>&1
    done
  done
done
grep '^cpu ' /proc/stat >> $R/steal.txt
rm -f $R/*.png $R/*.md
cd $OUT && tar czf res.tgz res && rm -rf res
