#!/bin/bash
# Call 4: the final build (team with auto spin; rayon's pool where the host is crowded) against c0ec894, 2 and 8 ranks, one pass each.
set -u
export MACH=h100x4host64
O="PYTHONPATH=/tmp/st0"
SPECS="2:0:fin2-old-a:$O 2:0:fin2-new-a 8:0:fin8-old-a:$O 8:0:fin8-new-a" \
 MINB=512K MAXB=8M T=80 bash benchmarks/device_sweeps.sh
