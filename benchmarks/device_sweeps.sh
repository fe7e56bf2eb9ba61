#!/bin/bash
# A/B sweeps on a device machine (CPU only), for the `run` tool: carry the wheels in .carry/st*/
# (built with scripts/build_wheel.sh; `python scripts/strip_wheel.py wheelhouse/*.whl .carry/st1/` drops their
# debug information, 8 MB -> 1.3 MB a wheel, so the working tree stays under the tool's 64 MiB), then e.g.
#   MACH=h100x2host OPS=all_reduce,send_recv MINB=8 MAXB=2M SPECS="2:0:a:X=1 2:0:b:X=0,Y=2" bash benchmarks/device_sweeps.sh
# Each SPEC "W:V:NAME[:VAR=VALUE[,VAR=VALUE...]]" runs one A/B sweep (rustccl vs gloo alternating)
# with W ranks, RUSTCCL_SHM_TENSORS=V and the settings given;
# a setting PYTHONPATH=/tmp/st0 runs the build carried in .carry/st0 (st1 otherwise);
# a NAME starting with "pp" runs the pipeline step (4 stages, 1 MiB micro-batches) instead.
# OPS: only these ops (all when unset); FACTOR: size step (4 when unset); MINB / MAXB: smallest (256K) and
# largest size (32M); ITERS (10); T: seconds per sweep (100); BENCH_ARGS: more options for every sweep (e.g.
# "--backends rustccl --variant s:RUSTCCL_SHM_SLOT_MIN_BYTES=1M --repeats 5"). Results (and the host's cumulative steal time
# at the start of each sweep, steal.txt) are tarred into $OUT/res.tgz after each SPEC.
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
R=$OUT/res; mkdir -p $R
for d in .carry/st*/; do rm -rf /tmp/$(basename $d); python3 -m pip install -q --no-deps --target /tmp/$(basename $d) $d*.whl; done
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
(lscpu; free -g; df -h /dev/shm; cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/shmem_enabled) > $R/host.txt 2>&1
for SPEC in $SPECS; do
 IFS=: read W V NAME EXTRA <<< "$SPEC"
 st $NAME
 if [[ $NAME == pp* ]]; then
  ARGS="--ops send_recv --min-bytes 1M --max-bytes 1M ${BENCH_ARGS:-}"
 else
  ARGS="--check --no-pp ${OPS:+--ops $OPS} --min-bytes ${MINB:-256K} --max-bytes ${MAXB:-32M} --iters ${ITERS:-10} ${FACTOR:+--factor $FACTOR} ${BENCH_ARGS:-}"
 fi
 env RUSTCCL_SHM_TENSORS=$V PYTHONPATH=/tmp/st1 ${EXTRA//,/ } timeout ${T:-100} python3 -m rustccl.bench --device cpu --world $W --no-progress $ARGS --machine $MACH --out $R --name $MACH-${W}r-$NAME > $R/log-$W-$NAME.txt 2>&1
 echo "exit $?" >> $R/log-$W-$NAME.txt
 (cd $OUT && tar czf res.tgz res)
done
st end
cd $OUT && tar czf res.tgz res && rm -rf res
