#!/bin/bash
# Final build: root-pool A/B (gather, scatter, reduce), then full A/B sweeps with --check, 8 and 4 ranks.
set -u
OPS=gather,scatter,reduce T=60 bash .carry/scripts/s20.sh
mkdir -p $OUT/ab && (cd $OUT && tar xzf res.tgz && mv res ab/ && rm res.tgz)
WHL=rt MACH=h100host WS="4 8" T=150 bash .carry/scripts/s18.sh
