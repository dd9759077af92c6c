"""The same training runs when Lightning, torchrun or ``fabric run`` starts the processes."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd, tmp_path, timeout=400):
    env = dict(os.environ, LIGHTNING_FULLGRAPH_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def _accuracy(out):
    found = re.findall(r"RESULT test_acc=([0-9.]+) processes=(\d+)", out)
    assert len(found) == 1, out[-2000:]  # printed once, by rank 0
    return float(found[0][0]), int(found[0][1])


@pytest.mark.multiprocess
def test_lightning_launches_processes(tmp_path):
    # Trainer(devices=2) re-runs the script once per extra rank (subprocess launcher).
    out = _run([sys.executable, str(ROOT / "examples/gcn_cora.py"), "--devices", "2",
                "--epochs", "30"], tmp_path)
    acc, procs = _accuracy(out)
    assert procs == 2 and acc > 0.7


@pytest.mark.multiprocess
def test_torchrun(tmp_path):
    out = _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                str(ROOT / "examples/gcn_cora.py"), "--devices", "2", "--epochs", "30"],
               tmp_path)
    acc, procs = _accuracy(out)
    assert procs == 2 and acc > 0.7


@pytest.mark.multiprocess
@pytest.mark.skipif(shutil.which("fabric") is None, reason="the 'fabric' CLI needs click")
def test_fabric_run(tmp_path):
    out = _run(["fabric", "run", "--accelerator", "cpu", "--devices", "2",
                str(ROOT / "examples/fabric_gcn.py"), "--epochs", "30"], tmp_path)
    acc, procs = _accuracy(out)
    assert procs == 2 and acc > 0.7
