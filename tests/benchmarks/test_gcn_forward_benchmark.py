"""Smoke test of ``python -m benchmarks gcn_forward`` on a tiny graph: the forwards run on the same
modules, give the same outputs and gradients (bit for bit, or within reassociation where the
kernels' forward aggregates first), and are reported."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "benchmarks", "gcn_forward"]  # run from the repository root (cwd=REPO)


def test_tiny_run():
    proc = subprocess.run([sys.executable, *SCRIPT, "--layer-nodes", "500", "--layer-edges",
                           "4000", "--model-nodes", "600", "--model-edges", "5000",
                           "--features", "16", "--hidden", "16", "--classes", "4",
                           "--rounds", "2", "--profile"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, _, table = proc.stdout.rpartition("]\n")
    rows = json.loads(head + "]")
    assert [r["case"] for r in rows] == ["layer", "model"]
    layer, model = rows
    assert layer["max_abs_diff"] == 0.0  # the same kernels, the same order: bit-identical
    assert "ours_pyg_order" not in layer and layer["kept_aggregate_bytes"] == 0
    # The model's first layer reads the features (no gradient): aggregated first and kept,
    # equal within reassociation; timed against the kernels' forward in PyG's order too.
    assert 0 < model["max_abs_diff"] < 1e-4
    assert model["kept_aggregate_bytes"] == 600 * 16 * 4
    assert model["reorder_gain_median"] == (model["ours_pyg_order"]["median"]
                                            / model["ours"]["median"])
    for row in rows:
        assert 0 < row["ours"]["min"] <= row["ours"]["median"]
        assert row["speedup_median"] == row["pyg_forward"]["median"] / row["ours"]["median"]
        assert row["memo_bytes"] > 0  # the normalization really was kept
        assert set(row["profile"]) == {"ours", "pyg_forward"}
        assert all(p["self_total_s"] > 0 and p["top"] for p in row["profile"].values())
    assert "| 2-layer GCN step (hidden 16) | 600 / 5,000 |" in table
    assert "# profile model pyg_forward: self CPU" in table


def test_tiny_run_of_the_other_normalizing_layers():
    proc = subprocess.run([sys.executable, *SCRIPT, "--cases", "appnp", "tag", "sg", "gcn2",
                           "--layer-nodes", "500", "--layer-edges", "4000", "--features", "16",
                           "--rounds", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, _, table = proc.stdout.rpartition("]\n")
    rows = json.loads(head + "]")
    assert [r["case"] for r in rows] == ["appnp", "tag", "sg", "gcn2"]
    for row in rows:
        assert row["max_abs_diff"] == 0.0  # PyG's forward with the memo: bit-identical
        assert row["memo_bytes"] > 0
    assert "| APPNP(K=10) fwd+bwd | 500 / 4,000 |" in table
