"""The ``lightning-fullgraph`` command line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_fullgraph.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def test_help_explains_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for word in ("partition", "train", "examples:", "synthetic:nodes="):
        assert word in text
    parser = build_parser()
    train_help = parser._subparsers._group_actions[0].choices["train"].format_help()
    for option in ("--devices", "--epochs", "--model", "--kernels", "--json", "--strategy"):
        assert option in train_help


def test_partition_json(tmp_path, capsys):
    assert main(["partition", "--dataset", "cora", "--parts", "3", "--cache-dir",
                 str(tmp_path), "--out", str(tmp_path / "out"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_parts"] == 3
    assert sorted(os.listdir(tmp_path / "out"))[:3] == ["manifest.json", "part-0-of-3.pt",
                                                        "part-1-of-3.pt"]


def test_bad_dataset_is_a_clear_error(capsys):
    assert main(["partition", "--dataset", "imagenet"]) == 2
    assert "known datasets" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_train_json_on_two_processes(tmp_path):
    env = dict(os.environ, LIGHTNING_FULLGRAPH_CACHE=str(tmp_path), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "lightning_fullgraph.cli", "train",
                           "--devices", "2", "--epochs", "20", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    start = proc.stdout.index("{")
    summary = json.loads(proc.stdout[start:proc.stdout.rindex("}") + 1])
    assert summary["processes"] == 2
    assert summary["test_acc"] > 0.6
    assert summary["comm_MB_per_epoch_per_rank"] > 0
