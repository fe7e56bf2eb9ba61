#!/bin/bash
# Call 1: wake-up probe (idle worker threads) and 795ad3c (own parts on the threads) old vs new.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
P=.carry/probe/wake_probe
nproc > $R/nproc.txt
$P 8 128 > $R/probe-1x8-128k.txt 2>&1
$P 8 32 > $R/probe-1x8-32k.txt 2>&1
$P 4 256 > $R/probe-1x4-256k.txt 2>&1
for i in $(seq 8); do $P 8 64 > $R/probe-8x8-64k-$i.txt 2>&1 & done; wait
for i in $(seq 16); do $P 4 64 > $R/probe-16x4-64k-$i.txt 2>&1 & done; wait
(cd $OUT && tar czf res.tgz res)
export MACH=h100x4host64
O="PYTHONPATH=/tmp/st0"
SPECS="2:0:own2-old-a:$O 2:0:own2-new-a 2:0:own2-old-b:$O 2:0:own2-new-b 4:0:own4-old-a:$O 4:0:own4-new-a 4:0:own4-old-b:$O 4:0:own4-new-b" \
 OPS=gather,scatter,all_to_all,reduce_scatter,all_gather MAXB=16M T=90 bash .carry/st3.sh
