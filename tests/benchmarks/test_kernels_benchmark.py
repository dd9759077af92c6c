"""Smoke test of ``python -m benchmarks kernels``: the shuffled torus is reordered for locality, both
orders are timed and give the same result, the JSON, table and figure come out; the row-read
floor and the hot-set bound are what their definitions say."""
import json
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "benchmarks", "kernels"]  # run from the repository root (cwd=REPO)


def test_torus_graph_hides_locality(load_benchmark):
    bench = load_benchmark("kernels")
    ei = bench.torus_graph(400, 2400, radius=1, seed=0)
    assert ei.shape == (2, 2400) and int(ei.max()) < 400
    # every node has 6 in-edges from its 3 x 3 neighbourhood, under shuffled ids
    assert torch.equal(torch.bincount(ei[1], minlength=400), torch.full((400,), 6))


def test_quick_torus_run(tmp_path):
    out, png = tmp_path / "k.json", tmp_path / "k.png"
    proc = subprocess.run(
        [sys.executable, *SCRIPT, "--quick", "--cases", "torus", "--features", "16", "--methods", "ours",
         "ours_own_order", "ours_kernel_in_order", "ours_bf16", "row_read_floor", "--repeats", "1", "--no-e2e",
         "--no-print-json", "--json",
         str(out), "--plot", str(png)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    (case,) = res["cases"]
    assert case["reordered"] and case["locality_score_used"] > case["locality_score_own"] + 0.25
    methods = {r["method"]: r for r in res["aggregation"]}
    assert set(methods) == {"ours", "ours_own_order", "ours_kernel_in_order", "ours_bf16", "row_read_floor"}
    for r in methods.values():
        assert r["fwd_best_s"] > 0 and r["minimum_bytes"] < r["per_edge_bytes"] and r["torch_gather_gbs"] > 0
    # bfloat16 rows: 2 bytes per feature in both byte counts, and a backward that ran
    assert methods["ours_bf16"]["minimum_bytes"] < methods["ours"]["minimum_bytes"]
    assert methods["ours_bf16"]["fwd_bwd_best_s"] > 0
    # the floor ran both ways; a graph with locality gets no hot-set bound
    assert methods["row_read_floor"]["fwd_bwd_best_s"] > 0
    assert methods["ours"]["ours_over_floor_fwd"] == methods["ours"]["fwd_best_s"] / methods["row_read_floor"]["fwd_best_s"]
    assert methods["row_read_floor"]["hot_set_fraction"] is None
    assert "reachable_minimum_pct_copy" not in methods["row_read_floor"]
    assert "| torus" in proc.stdout and png.stat().st_size > 0
    # the table and figure again from the JSON alone, timing nothing
    png2 = tmp_path / "again.png"
    again = subprocess.run([sys.executable, *SCRIPT, "--replot", str(out), "--plot", str(png2)],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "| torus" in again.stdout and png2.stat().st_size > 0


def test_replot_refuses_a_run_without_aggregation_rows(tmp_path):
    empty = tmp_path / "e2e-only.json"
    empty.write_text(json.dumps({"machine": {}, "cases": [], "aggregation": [], "end_to_end": []}))
    proc = subprocess.run([sys.executable, *SCRIPT, "--replot", str(empty)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode != 0 and "no aggregation rows" in proc.stderr


def test_hot_set_fraction_counts_the_most_used_sources(load_benchmark):
    bench = load_benchmark("kernels")
    col = torch.tensor([3, 3, 3, 1, 1, 0, 2, 4])  # source 3 feeds 3 edges, 1 feeds 2
    assert bench.hot_set_fraction(col, 5, 1) == 3 / 8
    assert bench.hot_set_fraction(col, 5, 2) == 5 / 8
    assert bench.hot_set_fraction(col, 5, 100) == 1.0
    assert bench.hot_set_fraction(col, 5, 0) == 0.0
    caches = bench.cache_bytes()
    assert caches is None or caches > 0


def test_floor_ratios_and_reachable_bound(load_benchmark):
    bench = load_benchmark("kernels")
    ours = dict(method="ours", fwd_best_s=0.6, fwd_bwd_best_s=1.5)
    floor = dict(method="row_read_floor", fwd_best_s=0.5, fwd_bwd_best_s=1.0, minimum_pct_copy=12.0,
                 hot_set_fraction=0.25)
    bench.add_floor_ratios([ours, floor])
    assert ours["ours_over_floor_fwd"] == 0.6 / 0.5 and ours["ours_over_floor_fwd_bwd"] == 1.5
    assert floor["reachable_minimum_pct_copy"] == 16.0  # 12 % / (1 - 0.25)
    whole = dict(method="row_read_floor", fwd_best_s=0.5, minimum_pct_copy=12.0,
                 hot_set_fraction=1.0)  # every row fits in cache: no bound
    bench.add_floor_ratios([dict(ours), whole])
    assert "reachable_minimum_pct_copy" not in whole


def test_row_read_floor_reads_both_ways_and_passes_the_gradient(load_benchmark):
    from tests.kernels.kernel_testutils import cpp_or_skip

    cpp_or_skip()  # the floor is the C++ kernels' gather; a failure under CI, which builds them
    bench = load_benchmark("kernels")
    import lightning_fullgraph.kernels as K

    ei = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
    csr = K.build_csr(ei, 3, 3)
    x = torch.randn(3, 8, requires_grad=True)
    out = bench.row_read_floor(x, csr)
    assert torch.equal(out, x)
    g = torch.randn(3, 8)
    out.backward(g)
    assert torch.equal(x.grad, g)


def test_baseline_refuses_a_revision_without_the_kernels(load_benchmark):
    import pytest

    bench = load_benchmark("kernels")
    with pytest.raises(SystemExit, match="no csrc/aggregate.cpp at that revision"):
        bench.kernel_at("no-such-revision")
