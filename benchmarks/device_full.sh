#!/bin/bash
# The default A/B sweep (every op 8 B - 32 MiB, the pipeline step, --check) on a device machine (CPU only), for
# the `run` tool: carry the build in .carry/st1/ (scripts/build_wheel.sh, then scripts/strip_wheel.py), then e.g.
#   bash benchmarks/device_full.sh h200x4host 4 8 16
# One sweep per rank count (at most 280 s each), the host's cumulative steal time at each start (steal.txt),
# everything tarred into $OUT/full.tgz after each sweep (the run tool brings back at most 8 files, and
# what a call cut off at its time limit left there).
set -u
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
M=$1; shift
rm -rf /tmp/st1 /tmp/full && mkdir -p /tmp/full
python3 -m pip install -q --no-deps --target /tmp/st1 .carry/st1/*.whl
export PYTHONPATH=/tmp/st1
R=/tmp/full
(lscpu; free -g; cat /sys/kernel/mm/transparent_hugepage/enabled) > $R/host.txt 2>&1
st() { echo "$(date +%T) $* $(grep '^cpu ' /proc/stat | awk '{print $9}')" >> $R/steal.txt; }
for w in "$@"; do
  st w$w
  timeout 280 python3 -m rustccl.bench --device cpu --world $w --check --no-progress --machine $M --out $R --name $M-cpu-${w}rank > $R/log-$w.txt 2>&1
  echo "exit $?" >> $R/log-$w.txt; tail -2 $R/log-$w.txt
  rm -f $R/*.png; (cd /tmp && tar czf $OUT/full.tgz full)
done
st end
cd /tmp && tar czf $OUT/full.tgz full
