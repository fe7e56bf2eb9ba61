"""The tuner (``python -m rustccl.tune``) and the tables it caches: what it
measures and keeps, and that every rank of a group applies rank 0's table
(settings given by hand win; ``RUSTCCL_TUNE=off`` keeps the rules)."""

import json
import os
import subprocess
import sys

import launch
from rustccl import tune
from rustccl.tune import measure
from rustccl.bench import schema

SMALL, BCAST = "RUSTCCL_SHM_SMALL_BYTES", "RUSTCCL_SHM_BROADCAST_ATTACH_MIN_BYTES"
ATTACH, GATHER = "RUSTCCL_SHM_ATTACH_MIN_BYTES", "RUSTCCL_SHM_ALL_GATHER_ATTACH_MIN_BYTES"


def test_the_tuner_keeps_only_what_beat_the_rules_where_it_checked(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, RUSTCCL_TUNE_DIR=str(tmp_path / "tables"))
    r = subprocess.run([sys.executable, "-m", "rustccl.tune", "--world", "2", "--only", f"{SMALL},{BCAST}",
                        "--rounds", "3", "--round-ms", "2", "--out", str(out), "--machine", "test"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    path = tmp_path / "tables" / f"{tune.host_key()}-2rank.json"
    table = json.loads(path.read_text())
    assert table["kind"] == tune.TABLE_KIND and table["local_ranks"] == 2 and table["host_key"] == tune.host_key()
    rules = {rule.name: rule for rule in measure.rules(2, 1)}
    for name, value in table["settings"].items():
        assert name in (SMALL, BCAST) and value in rules[name].candidates, table["settings"]
    # every cell of both rules was checked against the rules, and a kept
    # choice is nowhere below the floor in that check
    cells = {(c["rule"], c["op"], c["bytes"]) for c in table["cells"]}
    want = {(name, op, b) for name in (SMALL, BCAST) for op, b in rules[name].cells}
    if table["settings"]:
        assert cells == want, cells ^ want
    for c in table["cells"]:
        assert c["rules_us"] > 0 and c["tuned_us"] > 0
        assert c["kept"] == (c["rule"] in table["settings"])
        if c["kept"]:
            assert c["speedup"] >= 0.95, c
    # the results rows follow the schema
    rows = [json.loads(line) for line in (out / "tune-2rank.jsonl").read_text().splitlines()]
    assert rows[0]["kind"] == "header"
    for row in rows[1:]:
        assert schema.missing(row) == [] and row["backend"] in ("rustccl", "rustccl:tuned"), row


def test_the_fastest_candidate_slower_on_no_cell_replaces_the_rule():
    # the fastest mean loses on one small cell: the next one, slower on
    # none, wins
    ratios = {"rules": [1, 1, 1], "65536": [1.4, 0.5, 0.5], "4194304": [1.0, 0.7, 0.6], "off": [1.0, 1.0, 1.02]}
    assert measure.choose(ratios) == "4194304"
    # no fair candidate fast enough (mean above WIN): the rules
    assert measure.choose({"rules": [1, 1], "a": [0.99, 0.97], "b": [0.5, 1.2]}) == "rules"
    assert measure.choose({"rules": [1, 1], "a": [0.9, 0.9], "b": [0.8, 1.0]}) == "b"


def _table(where, settings):
    tune.save(tune.new_table(2, settings, []), str(where))


def _run(tmp_path, env):
    dirs = [str(tmp_path / "t0"), str(tmp_path / "t1")]
    _table(dirs[0], {SMALL: "16384", BCAST: "65536", GATHER: "262144"})
    _table(dirs[1], {BCAST: "4194304"})
    return launch.run("w_tune:settings_in_force", 2, dirs, env, init="none", timeout=150)


def test_every_rank_applies_rank_0s_table_in_every_group(tmp_path):
    res = _run(tmp_path, {})
    for r in range(2):
        for g in ("default", "new_group"):
            assert res[r][g] == {SMALL: "16384", BCAST: "65536", ATTACH: "auto", GATHER: "262144"}, (r, g, res[r])


def test_a_setting_given_by_hand_wins_over_the_table(tmp_path):
    res = _run(tmp_path, {SMALL: "8192"})
    for r in range(2):
        assert res[r]["default"] == {SMALL: "8192", BCAST: "65536", ATTACH: "auto", GATHER: "262144"}, res[r]


def test_a_shared_read_threshold_given_by_hand_also_keeps_the_tables_per_collective_ones_out(tmp_path):
    res = _run(tmp_path, {ATTACH: "4194304"})
    for r in range(2):
        assert res[r]["default"] == {SMALL: "16384", BCAST: "65536", ATTACH: "4194304", GATHER: "auto"}, res[r]


def test_tune_off_keeps_the_rules(tmp_path):
    res = _run(tmp_path, {"RUSTCCL_TUNE": "off"})
    for r in range(2):
        assert res[r]["default"][BCAST] != "65536" and res[r]["default"][SMALL] != "16384", res[r]
