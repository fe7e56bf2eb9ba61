#!/bin/bash
# Call 2b: the workers' team (st1, spinning 200 us, and 50 us) against rayon's pool (st0 = c0ec894), default path, 8 and 16 ranks.
set -u
export MACH=h100x4host64
O="PYTHONPATH=/tmp/st0"
F="RUSTCCL_SHM_SPIN_US=50"
SPECS="8:0:team8-old-a:$O 8:0:team8-new-a 8:0:team8-s50-a:$F 16:0:team16-old-a:$O 16:0:team16-new-a 16:0:team16-s50-a:$F 8:0:team8-old-b:$O 8:0:team8-new-b 8:0:team8-s50-b:$F 16:0:team16-old-b:$O 16:0:team16-new-b 16:0:team16-s50-b:$F" \
 MINB=512K MAXB=8M T=100 bash benchmarks/device_sweeps.sh
