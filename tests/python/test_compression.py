"""In-engine compression between hosts through torch.distributed: two
simulated hosts (RUSTCCL_HOST_ID) of 2 ranks each, results equal to a
reference of the same quantisation computed in torch, identical on every
rank; other ops and dtypes exact; DDP with rustccl.hooks.engine_compression
trains like DDP's own all-reduce."""

import pytest

import launch


def test_set_compression_codecs_and_fallbacks():
    res = launch.run("w_compression:all_reduce", 4, init="none")
    launch.expect_ok(res)
    for r in range(4):
        out = res[r][2]
        bad = {k: v for k, v in out.items() if v is False}
        assert not bad, (r, bad)
        for codec in ("int8", "bf16", "fp16"):
            assert tuple(out[f"{codec}_stats"]) == ("hierarchical_compressed", codec), out
        assert "unknown codec" in out["bad_codec"] and "rustccl" in out["bad_codec"], out["bad_codec"]


def test_ddp_engine_compression_hook():
    res = launch.run("w_compression:ddp", 4, 150, init="none", timeout=300)
    launch.expect_ok(res)
    outs = [res[r][2] for r in range(4)]
    assert all(o["params"] == outs[0]["params"] for o in outs), "ranks disagree on the model"
    losses = outs[0]["losses"]
    for name in ("int8", "bf16"):
        assert losses[name] == pytest.approx(losses["none"], rel=0.01), losses
    # leaders (ranks 0 and 2) send about a quarter (int8) / half (bf16) of
    # what DDP's plain all-reduce sends between hosts; the others send none
    for r in (0, 2):
        b = outs[r]["between"]
        assert b["none"][0] > 0 and b["none"][2] == ""
        assert b["int8"][2] == "int8" and b["int8"][0] < 0.3 * b["none"][0], b
        assert b["bf16"][2] == "bf16" and b["bf16"][0] < 0.55 * b["none"][0], b
    for r in (1, 3):
        assert all(v[0] == 0 for v in outs[r]["between"].values()), outs[r]["between"]
