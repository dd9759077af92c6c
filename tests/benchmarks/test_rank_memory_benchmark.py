"""Smoke test of ``python -m benchmarks rank_memory`` on a tiny 2-part partition: phases, mappings and
held tensors are reported for the measuring rank."""
import json
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "benchmarks", "rank_memory"]  # run from the repository root (cwd=REPO)


def test_tiny_run(tiny_partition):
    pdir = tiny_partition
    proc = subprocess.run([sys.executable, *SCRIPT, "--partition-dir", str(pdir),
                           "--rank", "1", "--epochs", "2", "--num-classes", "4", "--by-epoch"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, _, table = proc.stdout.rpartition("}\n")
    result = json.loads(head + "}")
    assert result["rank"] == 1 and result["parts"] == 2
    phases = set(result["phase_peaks_mib"])
    assert {"e0 fwd conv1", "e1 fwd conv1", "e0 bwd conv2", "e1 val conv1",
            "between epochs"} <= phases
    assert "fwd conv1" not in phases  # (without --by-epoch: one name for all epochs)
    assert [p["point"] for p in result["points"]] == [
        "before loading", "engine built", "after epoch 0", "after epoch 1"]
    assert all(p["rss_mib"] > 0 and p["files"] > 0 for p in result["points"])
    assert result["points"][-1]["partition"] > 0  # the partition file, mapped
    assert "rank 1 of 2: peak VmRSS (MiB) by phase" in table

