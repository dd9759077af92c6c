"""Smoke test of ``python -m benchmarks layers`` on a tiny graph: it runs end to end, ours matches PyG,
ours really runs our kernels, and the free-aggregation stand-in is applied and reverted."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "benchmarks", "layers"]  # run from the repository root (cwd=REPO)


@pytest.mark.parametrize("layer", ["gcn", "sage"])
def test_free_aggregation_applies_and_reverts(layer, load_benchmark):
    bench = load_benchmark("layers")
    conv = bench.make_layer(layer, 8)
    x = torch.randn(5, 8)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    with bench.free_aggregation(conv) as fake:
        assert conv(x, ei).shape == (5, 8)
        assert fake.calls == 1
    assert "propagate" not in conv.__dict__  # the class's propagate again
    assert conv(x, ei).shape == (5, 8)


def test_tiny_run(tmp_path):
    out = tmp_path / "layers.json"
    proc = subprocess.run(
        [sys.executable, *SCRIPT, "--nodes", "2000", "--edges", "20000", "--repeats", "1", "--json", str(out),
         "--no-print-json"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [r["layer"] for r in res["layers"]] == ["gcn", "sage"]
    for row in res["layers"]:
        assert row["check_ok"], row["check_ours_vs_pyg"]
        assert row["check_ours_vs_pyg"]["out"]["max_abs_diff"] < 1e-4
        assert row["no_aggregation_calls"] == 1 and row["no_aggregation_ours_calls"] == 1
        v = row["variants"]
        names = ("pyg", "ours", "no_aggregation", "no_aggregation_ours")
        if res["machine"]["cpp_available"]:  # the floor is the C++ kernels' gather
            names += ("row_read_floor",)
            assert row["row_read_floor_calls"] == 1
            assert row["fraction_of_ceiling_at_floor"] == pytest.approx(
                v["no_aggregation"]["best_s"] / v["row_read_floor"]["best_s"])
            if row.get("hot_set_fraction") is not None:  # a machine whose sysfs names its caches
                assert 0 < row["hot_set_fraction"] <= 1
                assert row["fraction_of_ceiling_bound"] >= row["fraction_of_ceiling_at_floor"] * (1 - 1e-9)
        assert all(v[name]["best_s"] > 0 for name in names)
        assert row["speedup"] == pytest.approx(v["pyg"]["best_s"] / v["ours"]["best_s"])
        assert row["fraction_of_ceiling"] == pytest.approx(row["speedup"] / row["ceiling"])
        assert row["fraction_of_ceiling_ours_dense"] == pytest.approx(
            row["speedup"] / row["ceiling_ours_dense"])
        prof = row["profile"]
        assert set(prof) == set(names)
        assert all(prof[name]["our_ops"] == [] for name in names if name != "ours")
        if res["machine"]["cpp_available"]:
            assert "lightning_fullgraph::csr_sum" in prof["ours"]["our_ops"]
        cats = prof["ours"]["categories_s"]
        assert sum(cats.values()) == pytest.approx(prof["ours"]["self_total_s"])
    assert "| GCNConv(128, 128) |" in proc.stdout


def _ratios(bench, h, no_aggregation_ours, floor):
    row = dict(hot_set_fraction=h, variants=dict(
        pyg=dict(best_s=8.0), ours=dict(best_s=2.0), no_aggregation=dict(best_s=1.0),
        no_aggregation_ours=dict(best_s=no_aggregation_ours), row_read_floor=dict(best_s=floor)))
    bench.add_ratios(row)
    return row


def test_ceiling_bound_frees_the_hot_set_reads_only(load_benchmark):
    row = _ratios(load_benchmark("layers"), 0.25, 0.6, 1.4)
    assert row["fraction_of_ceiling_at_floor"] == pytest.approx(1.0 / 1.4)
    assert row["ours_over_floor"] == pytest.approx(2.0 / 1.4)
    # the floor's 0.8 s of row reads, a quarter of them free: 0.6 + 0.6 s
    assert row["fraction_of_ceiling_bound"] == pytest.approx(1.0 / 1.2)


def test_ceiling_bound_is_never_below_the_fraction_at_the_floor(load_benchmark):
    # Timing noise can put the floor under the layer without aggregation (one repeat on a
    # busy machine): no reads to free, the bound is the fraction at the floor.
    row = _ratios(load_benchmark("layers"), 0.5, 0.9, 0.8)
    assert row["fraction_of_ceiling_bound"] == pytest.approx(row["fraction_of_ceiling_at_floor"])
