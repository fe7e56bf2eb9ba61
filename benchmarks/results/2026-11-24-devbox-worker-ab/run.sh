#!/bin/bash
# Development machine (2 cores): engine worker A/B, h0 (06ee8d0: polls 50 us after every submission,
# 20 us grace) vs h1 (sleeps through blocking calls, 10 ms grace), lat.py with 2 ranks, alternating 4 times.
set -u
R=${R:-/tmp/dv}; mkdir -p $R
for v in h0 h1; do [ -d /tmp/$v ] || python3 -m pip install -q --no-deps --target /tmp/$v .carry/$v/*.whl; done
for i in 1 2 3 4; do
  for v in h0 h1; do
    PYTHONPATH=/tmp/$v OMP_NUM_THREADS=1 N=300 timeout 150 .venv/bin/torchrun --nproc-per-node 2 --master-port 29533 \
      .carry/scripts/lat.py all_reduce,broadcast,barrier,scatter,gather,all_to_all,reduce,send_recv > $R/lat-$v-$i.txt 2>&1
    echo "exit $?" >> $R/lat-$v-$i.txt
  done
done
