"""Smoke test of ``python -m benchmarks rank_profile`` on a tiny 2-part partition: per-step user and
system seconds and page faults of every rank, its block cache, and the measuring rank's
operators by self CPU time."""
import json
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "benchmarks", "rank_profile"]  # run from the repository root (cwd=REPO)


def test_tiny_run(tiny_partition):
    pdir = tiny_partition
    proc = subprocess.run([sys.executable, *SCRIPT, "--partition-dir", str(pdir),
                           "--rank", "1", "--epochs", "2", "--warmup", "1", "--num-classes",
                           "4", "--block-cache", "64M"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, _, table = proc.stdout.rpartition("}\n")
    result = json.loads(head + "}")
    assert result["parts"] == 2 and result["block_cache"] == 64 << 20
    assert [len(r["epochs"]) for r in result["ranks"]] == [2, 2]
    assert all(set(e) == {"wall_s", "user_s", "sys_s", "page_faults"} for r in result["ranks"]
               for e in r["epochs"])
    assert all(r["huge_pages"]["cache_limit"] == 64 << 20 for r in result["ranks"])
    assert "block cache (rank 0): limit 67,108,864 B" in table
    profile = result["profile"]
    ops = [r["op"] for r in profile["ops"]]
    assert "aten::mm" in ops or "aten::addmm" in ops  # the layers' products
    assert 0 < profile["dense_share"] < 1 and 0 < profile["kernel_ops_share"] < 1
    assert 0 < profile["exchange_share"] < 1  # two ranks exchange halo rows
    assert "rank 1, one profiled step" in table


def test_bad_options_are_refused(tiny_partition, load_benchmark, capsys):
    pdir = tiny_partition
    profile = load_benchmark("rank_profile")
    for extra, message in ((["--rank", "2"], "the partition has 2 parts"),
                           (["--block-cache", "lots"], "--block-cache 'lots'"),
                           (["--epochs", "0"], "--epochs must be >= 1")):
        with pytest.raises(SystemExit) as exit_info:
            profile.main(["--partition-dir", str(pdir), *extra])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
