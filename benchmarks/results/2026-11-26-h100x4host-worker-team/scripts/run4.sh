#!/bin/bash
# Call 3: the workers' team with RUSTCCL_SHM_SPIN_US=auto (st1; spins only where the local ranks' threads take <= 1/4 of the cores) against rayon's pool (st0 = c0ec894), default path.
set -u
export MACH=h100x4host64
O="PYTHONPATH=/tmp/st0"
SPECS="8:0:auto8-old-a:$O 8:0:auto8-new-a 4:0:auto4-old-a:$O 4:0:auto4-new-a 2:0:auto2-old-a:$O 2:0:auto2-new-a 8:0:auto8-old-b:$O 8:0:auto8-new-b 4:0:auto4-old-b:$O 4:0:auto4-new-b 2:0:auto2-old-b:$O 2:0:auto2-new-b 16:0:auto16-old-a:$O 16:0:auto16-new-a 16:0:auto16-old-b:$O 16:0:auto16-new-b" \
 MINB=512K MAXB=8M T=100 bash benchmarks/device_sweeps.sh
