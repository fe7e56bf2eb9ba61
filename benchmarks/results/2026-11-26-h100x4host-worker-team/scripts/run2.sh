#!/bin/bash
# Call 2a: the workers' team (st1) against rayon's pool (st0 = c0ec894), default path, 2 and 4 ranks, plus the pipeline step.
set -u
export MACH=h100x4host64
O="PYTHONPATH=/tmp/st0"
SPECS="2:0:team2-old-a:$O 2:0:team2-new-a 2:0:team2-old-b:$O 2:0:team2-new-b 4:0:team4-old-a:$O 4:0:team4-new-a 4:0:team4-old-b:$O 4:0:team4-new-b 4:0:pp4-old-a:$O 4:0:pp4-new-a 4:0:pp4-old-b:$O 4:0:pp4-new-b" \
 MINB=128K MAXB=8M T=80 bash benchmarks/device_sweeps.sh
