"""Smoke test of ``python -m benchmarks aggregation``: the quick mode's plan-level part.

Runs the script as a user would (a subprocess, ``--json``) on Cora and a tiny synthetic graph,
without training processes, and checks that its JSON is self-consistent.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "benchmarks", "aggregation"]  # run from the repository root (cwd=REPO)


def test_gcn_epoch_bytes_formula(load_benchmark):
    bench = load_benchmark("aggregation")
    counts = {"post_send": 10, "post_recv": 7, "pre_send": 3, "pre_recv": 5}
    b = bench.gcn_epoch_bytes(counts, [16, 7])
    W = 16 + 7
    assert b == {"forward_bytes_sent": 4 * W * 13, "forward_bytes_received": 4 * W * 12,
                 "backward_bytes_sent": 4 * W * 12, "backward_bytes_received": 4 * W * 13}
    d = bench.gcn_epoch_bytes(counts, [16, 7], degrees=True)
    assert d["forward_bytes_sent"] == 4 * (W * 13 + 2 * (10 + 5))
    assert d["forward_bytes_received"] == 4 * (W * 12 + 2 * (7 + 3))
    assert d["backward_bytes_sent"] == b["backward_bytes_sent"]
    # SAGE: layer 1 moves the raw features forward only (no gradient).
    dims = {"in": 32, "hidden": 16, "classes": 7}
    sage = bench.exchange_model("sage", False, dims)
    s = bench.epoch_bytes(counts, sage["layers"], sage["degree_layers"])
    assert s["forward_bytes_sent"] == 4 * (32 + 16) * 13
    assert s["backward_bytes_sent"] == 4 * 16 * 12
    assert bench.exchange_model("gcn", True, dims) == {"layers": [(7, True)],
                                                      "degree_layers": 0}


def test_quick_partition_only(tmp_path):
    out = tmp_path / "aggregation.json"
    proc = subprocess.run(
        [sys.executable, *SCRIPT, "--quick", "--partition-only", "--json",
         "--nodes", "3000", "--parts", "2,4", "--cache-dir", str(tmp_path / "cache"),
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)  # only JSON on stdout
    assert json.loads(out.read_text())["plan"] == res["plan"]
    assert "measured" not in res and "static_cache" not in res
    assert "1a. Rows per exchange" in proc.stderr  # the table went to stderr

    for name in ("cora", "synthetic"):
        g = res["plan"]["datasets"][name]
        widths = g["gcn_widths"]
        for P in ("2", "4"):
            e = g["partitions"][P]
            m = e["modes"]
            assert e["hybrid_le_min_per_pair"]
            assert e["cover_s"] >= 0.0
            for mode in ("post", "pre", "hybrid"):
                assert m[mode]["rows_consistent"], (name, P, mode)
                assert len(m[mode]["rows_sent_per_rank"]) == int(P)
                assert m[mode]["rows_max_sent"] <= m[mode]["rows_sum"]
                # Summed over ranks every row is sent once forward and its gradient once
                # backward, plus one degree per row and layer (uncached):
                # rows x 4 bytes x (2 (hidden + classes) + 2); cached: layer 2 only.
                rows = m[mode]["rows_sum"]
                assert m[mode]["gcn_bytes"]["epoch_bytes"] == rows * 4 * (2 * sum(widths) + 2)
                assert m[mode]["gcn_bytes_cached"]["epoch_bytes"] == rows * 4 * 2 * widths[1]
            assert m["hybrid"]["rows_sum"] <= min(m["post"]["rows_sum"], m["pre"]["rows_sum"])
            r = e["ratios"]
            assert r["bytes_post_over_hybrid"] == pytest.approx(
                m["post"]["gcn_bytes"]["epoch_bytes"] / m["hybrid"]["gcn_bytes"]["epoch_bytes"])
            assert r["bytes_post_over_hybrid"] >= 1.0
    assert "bytes_cora_P4" in res["targets"] and "bytes_synthetic_P4" in res["targets"]
