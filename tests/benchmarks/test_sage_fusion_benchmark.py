"""Smoke test of ``python -m benchmarks sage_fusion`` on a tiny graph: both forwards run on the
same layer, agree, and are reported."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "benchmarks", "sage_fusion"]  # run from the repository root (cwd=REPO)


def test_tiny_run():
    proc = subprocess.run([sys.executable, *SCRIPT, "--nodes", "500", "--edges", "4000",
                           "--features", "16", "--rounds", "2"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, _, line = proc.stdout.rpartition("}\n")
    row = json.loads(head + "}")
    assert row["max_abs_diff"] < 1e-4
    assert 0 < row["fused"]["min"] <= row["fused"]["median"]
    assert row["speedup_median"] == row["pyg_forward"]["median"] / row["fused"]["median"]
    assert "fused" in line and "PyG's forward" in line
