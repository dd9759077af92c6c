"""Smoke test of ``python -m benchmarks weighted_backward`` on tiny graphs: both ways run, give the
same bits, and are reported."""
import json
import subprocess
import sys
from pathlib import Path

from tests.kernels.kernel_testutils import cpp_or_skip

REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "benchmarks", "weighted_backward"]  # run from the repository root (cwd=REPO)


def test_tiny_run():
    cpp_or_skip()  # a failure under CI, which builds the kernels
    proc = subprocess.run([sys.executable, *SCRIPT, "--scale", "0.002", "--rounds", "2",
                           "--features", "16"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, _, table = proc.stdout.rpartition("}\n")
    rows = json.loads(head + "}")["rows"]
    assert [r["case"] for r in rows] == ["power-law", "uniform"]
    for r in rows:
        assert r["identical"] and (r["nodes"], r["edges"]) in ((1000, 16000), (2000, 32000))
        assert 0 < r["fused"]["min"] <= r["fused"]["median"]
        assert r["speedup_median"] == r["gathered"]["median"] / r["fused"]["median"]
    assert "gathered/fused" in table and "power-law" in table
