"""The same training runs when Lightning, torchrun or ``fabric run`` starts the processes."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_fullgraph.kernels.cpp import ext_root

from ..environment import fresh_environment

ROOT = Path(__file__).resolve().parents[2]
CI = os.environ.get("LIGHTNING_FULLGRAPH_CI", "0").lower() not in ("", "0", "false", "no")


def _console_script(name):
    """Path of an installed console script, or None.

    Looked up next to the running interpreter first (``.venv/bin/python -m pytest`` runs
    without the virtual environment on PATH, and its scripts are there), then on PATH.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def _script_or_skip(name, why):
    path = _console_script(name)
    if path is None:
        message = f"the '{name}' command is not installed ({why})"
        if CI:  # CI installs the fabric extra: a missing command is a broken install there
            pytest.fail(message + " - not allowed with LIGHTNING_FULLGRAPH_CI=1", pytrace=False)
        pytest.skip(message)
    return path


def _run_process(cmd, tmp_path, timeout=400):
    # A fresh partition cache, but the kernels this interpreter already compiled: a cache
    # of their own would compile them again in every test (about 40 s each).
    env = fresh_environment(LIGHTNING_FULLGRAPH_CACHE=str(tmp_path / "cache"),
               LIGHTNING_FULLGRAPH_EXT_DIR=str(ext_root()), PYTHONPATH=str(ROOT),
               OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _run(cmd, tmp_path, timeout=400):
    return _run_process(cmd, tmp_path, timeout).stdout


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
def test_fabric_run(tmp_path):
    fabric = _script_or_skip("fabric", "Lightning's CLI needs click: the 'fabric' extra")
    out = _run([fabric, "run", "--accelerator", "cpu", "--devices", "2",
                str(ROOT / "examples/fabric_gcn.py"), "--epochs", "30"], tmp_path)
    acc, procs = _accuracy(out)
    assert procs == 2 and acc > 0.7


@pytest.mark.multiprocess
def test_torchrun_4d_equals_lightnings_launcher(tmp_path):
    # FourDStrategy on processes torchrun created: the same training as Lightning's launcher.
    import json
    args = ["-m", "lightning_fullgraph.cli", "train", "--strategy", "4d", "--model",
            "scalegnn", "--devices", "2", "--grid", "2,1,1", "--epochs", "2", "--hidden", "16",
            "--layers", "3", "--json", "--no-progress"]
    launched = json.loads(_run([sys.executable, *args], tmp_path))
    torchrun = json.loads(_run([sys.executable, "-m", "torch.distributed.run",
                                "--nproc-per-node", "2", *args], tmp_path))
    assert torchrun["processes"] == launched["processes"] == 2
    for key in ("test_acc", "val_acc", "comm_MB_per_epoch_per_rank"):
        assert torchrun[key] == launched[key], key
    assert [p[2] for p in torchrun["val_trace"]] == [p[2] for p in launched["val_trace"]]


def _losses(out):
    found = [line for line in out.splitlines() if line.startswith("LOSSES ")]
    assert len(found) == 1, out[-2000:]
    return [float(v) for v in found[0].split()[1:]]


@pytest.mark.multiprocess
def test_fabric_run_4d_grid_equals_one_process(tmp_path):
    # setup_fourd under `fabric run`: ScaleGNN split over a (2,1,1) grid trains like the
    # whole model on one process (dropout off, so the masks are not compared).
    fabric = _script_or_skip("fabric", "Lightning's CLI needs click: the 'fabric' extra")
    script = str(ROOT / "examples/fabric_scalegnn.py")
    common = ["--epochs", "3", "--dropout", "0"]
    grid = _run([fabric, "run", "--accelerator", "cpu", "--devices", "2", script,
                 "--grid", "2,1,1", *common], tmp_path)
    single = _run([sys.executable, script, "--devices", "1", *common], tmp_path)
    assert _accuracy(grid)[1] == 2 and _accuracy(single)[1] == 1
    split, whole = _losses(grid), _losses(single)
    assert len(split) == len(whole) == 12  # 3 epochs of 4 steps
    assert max(abs(a - b) / abs(b) for a, b in zip(split, whole)) < 1e-5
