#!/usr/bin/env bash
# Measures rustccl's NVLink kernels against torch's nccl on N GPUs of one
# host, the runs that set the auto limits (README, "Small and medium CUDA
# collectives"): cuda_probe.py with the default limits and the host-path
# breakdown, with the two-shot and the one-shot kernel forced up to 64 MiB
# (their crossovers with NCCL), with the all_gather / reduce_scatter copy
# kernels forced up to 16 MiB, then the A/B bench sweep with the DDP step.
# Run from the repository root on a GPU machine with the rustccl wheel
# installed (scripts/gpu_check.sh shows how):
#     N=4 OUT=/tmp/peer-sweep benchmarks/cuda_peer_sweep.sh
# Every file lands in $OUT/w and is packed into $OUT/results.tgz after each
# step (the device tool brings back only a few files per call). Takes about
# 2 minutes on 2 H200.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=${N:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
OUT=${OUT:-peer-sweep}
MACHINE=${MACHINE:-h200x$N}
W=$OUT/w
mkdir -p "$W"
HERE=$(cd "$(dirname "$0")" && pwd)
T0=$(date +%s)
pack() { tar -C "$OUT" -czf "$OUT/results.tgz.tmp" w && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"; }
step() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$W/timeline.txt"; pack; }
P="python3 -m torch.distributed.run --nproc_per_node=$N --master_port"
S=1048576,2097152,4194304,8388608,16777216,33554432,67108864
RUSTCCL_HOST_PROFILE=1 PROBE_HOST=1 timeout 90 $P 29531 "$HERE/cuda_probe.py" > "$W/probe_default.jsonl" 2> "$W/probe_default.err"
step "probe default rc=$?"
RUSTCCL_ONE_SHOT_MAX_BYTES=16 RUSTCCL_CUSTOM_ALLREDUCE_MAX_BYTES=64M PROBE_SIZES=65536,262144,$S PROBE_GRAPH=0 \
  timeout 60 $P 29532 "$HERE/cuda_probe.py" > "$W/probe_twoshot.jsonl" 2> "$W/probe_twoshot.err"
step "probe two-shot forced rc=$?"
RUSTCCL_ONE_SHOT_MAX_BYTES=64M RUSTCCL_CUSTOM_ALLREDUCE_MAX_BYTES=64M PROBE_SIZES=262144,$S PROBE_GRAPH=0 \
  timeout 60 $P 29533 "$HERE/cuda_probe.py" > "$W/probe_oneshot.jsonl" 2> "$W/probe_oneshot.err"
step "probe one-shot forced rc=$?"
RUSTCCL_CUSTOM_GATHER_MAX_BYTES=16M PROBE_OPS=all_gather,reduce_scatter PROBE_SIZES=8192,65536,262144,1048576,4194304,16777216 \
  timeout 60 $P 29534 "$HERE/cuda_probe.py" > "$W/probe_gather.jsonl" 2> "$W/probe_gather.err"
step "probe gather forced rc=$?"
timeout 180 python3 -m rustccl.bench --device cuda --world "$N" --ops all_reduce,all_gather,reduce_scatter,broadcast,all_to_all --ddp \
  --machine "$MACHINE" --out "$W/bench" --no-progress > "$W/bench.log" 2>&1
step "bench rc=$?"
