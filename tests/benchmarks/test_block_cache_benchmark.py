"""Smoke test of ``python -m benchmarks block_cache`` on a tiny graph: both settings run in one
process and in fresh ones, the cache really reuses blocks, and the results are reported."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "benchmarks", "block_cache"]  # run from the repository root (cwd=REPO)


def test_tiny_run():
    from lightning_fullgraph.kernels import huge_pages
    if huge_pages._why_not() is not None or huge_pages._torch_does_it():
        pytest.skip("no huge-page allocator on this machine: nothing to cache")
    proc = subprocess.run([sys.executable, *SCRIPT, "--nodes", "20000", "--edges", "200000",
                           "--rounds", "2", "--peak-steps", "2", "--limit", "256M"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, _, table = proc.stdout.rpartition("}\n")
    row = json.loads(head + "}")
    assert row["limit"] == 256 << 20 and row["reused_blocks"] > 0
    assert row["speedup_median"] == row["cache_off"]["median"] / row["cache_on"]["median"]
    assert row["peak"]["off"]["reused"] == 0 and row["peak"]["on"]["reused"] > 0
    for p in row["peak"].values():
        assert 0 < p["training_peak_mib"] <= p["process_peak_mib"]
    assert "| cache on |" in table and "| 20,000 / 200,000, F=128 |" in table
