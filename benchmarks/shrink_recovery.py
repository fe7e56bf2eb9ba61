"""Recovery from a dead rank on CPU: rustccl's shrink_group against torchrun's
restart from a checkpoint, on the same toy DDP job (examples/train_survive.py).

    python benchmarks/shrink_recovery.py --nproc 4 --out benchmarks/results/<date>-<machine>-cpu-shrink-recovery.json

Runs, each under torchrun on this machine:
1. shrink: 4 ranks, rank 3 vanishes at --fail-step; the survivors shrink and
   go on (repeated --repeats times: recovery time = death -> first completed
   step on the shrunk group);
2. reference: a 3-rank job started from the state the survivors saved right
   after the shrink, for the same remaining steps: its final loss against the
   survivors' final loss;
3. restart: the same job with torchrun --max-restarts=1; rank 3 SIGKILLs
   itself, torchrun restarts every rank, the job resumes from the checkpoint
   written each step (recovery time = death -> first completed step after
   the restart).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "train_survive.py")


def torchrun(nproc: int, args: list[str], workdir: str, restarts: int = 0) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--max-restarts={restarts}",
           "--monitor-interval=0.1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", EXAMPLE, *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", SURVIVE_DIR=workdir)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


def run(nproc: int, steps: int, fail_step: int, size: int, mode: str, extra: list[str], restarts: int = 0) -> dict:
    work = tempfile.mkdtemp(prefix=f"rustccl-survive-{mode}-")
    out = os.path.join(work, "result.json")
    args = ["--steps", str(steps), "--fail-step", str(fail_step), "--size", str(size), "--mode", mode,
            "--result", out, "--workdir", work, *extra]
    torchrun(nproc, args, work, restarts)
    with open(out) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--fail-step", type=int, default=8)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--machine", default=platform.node())
    p.add_argument("--out", default=None)
    a = p.parse_args()
    victim = a.nproc - 1
    shrinks = []
    for i in range(a.repeats):
        state = os.path.join(tempfile.mkdtemp(prefix="rustccl-state-"), "state.pt")
        extra = ["--fail-rank", str(victim), "--save-state", state]
        r = run(a.nproc, a.steps, a.fail_step, a.size, "shrink", extra)
        r["state"] = state
        shrinks.append(r)
        print(f"shrink {i}: recovery {r['recovery_s']:.3f} s, final loss {r['final_loss']:.6f}", flush=True)
    ref = run(a.nproc - 1, a.steps, a.fail_step, a.size, "shrink", ["--resume", shrinks[0]["state"]])
    restart = run(a.nproc, a.steps, a.fail_step, a.size, "restart", ["--fail-rank", str(victim)], restarts=1)
    print(f"restart: recovery {restart['recovery_s']:.3f} s", flush=True)
    rel = abs(ref["final_loss"] - shrinks[0]["final_loss"]) / abs(ref["final_loss"])
    summary = {
        "machine": a.machine, "cpus": os.cpu_count(), "nproc": a.nproc, "size": a.size, "steps": a.steps,
        "fail_step": a.fail_step,
        "shrink_recovery_s": [r["recovery_s"] for r in shrinks],
        "shrink_recovery_median_s": statistics.median(r["recovery_s"] for r in shrinks),
        "shrink_and_rebuild_s": [r["shrink_and_rebuild_s"] for r in shrinks],
        "restart_recovery_s": restart["recovery_s"],
        "survivors_final_loss": shrinks[0]["final_loss"], "reference_final_loss": ref["final_loss"],
        "final_loss_rel_diff": rel, "restart_final_loss": restart["final_loss"],
    }
    print(json.dumps(summary, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
