"""Smoke test of ``python -m benchmarks huge_pages`` on a tiny graph: it runs end to end, really
switches the allocator off and on in every round, and reports what it timed."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_fullgraph.kernels import huge_pages
from tests.kernels.kernel_testutils import cpp_or_skip

REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "benchmarks", "huge_pages"]  # run from the repository root (cwd=REPO)


def test_tiny_run(tmp_path):
    cpp_or_skip()  # a failure under CI, which builds the kernels
    if huge_pages._why_not() is not None or huge_pages._torch_does_it():
        pytest.skip("huge pages cannot be switched on this machine")
    out = tmp_path / "hp.json"
    proc = subprocess.run(
        [sys.executable, *SCRIPT, "--nodes", "2000", "--edges", "20000", "--features", "16",
         "--rounds", "2", "--repeats", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["installed"] == {"off": [False, False], "on": [True, True]}
    names = [r["contender"] for r in res["rows"]]
    assert names == ["aggregate fwd", "aggregate fwd+bwd", "GCNConv step, ours",
                     "GCNConv step, pyg", "SAGEConv step, ours", "SAGEConv step, pyg"]
    for r in res["rows"]:
        assert len(r["rounds"]["off"]) == len(r["rounds"]["on"]) == 2
        assert r["pages_4k_s"] == min(r["rounds"]["off"]) > 0
        assert r["ratio"] == pytest.approx(r["pages_4k_s"] / r["pages_2m_s"])
    assert "| aggregate fwd |" in proc.stdout
