"""The ``lightning-fullgraph`` command line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_fullgraph.cli import build_parser, main
from lightning_fullgraph.kernels.cpp import ext_root

ROOT = Path(__file__).resolve().parents[1]


def test_help_explains_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for word in ("partition", "train", "examples:", "synthetic:nodes="):
        assert word in text
    parser = build_parser()
    train_help = parser._subparsers._group_actions[0].choices["train"].format_help()
    for option in ("--devices", "--epochs", "--model", "--kernels", "--json", "--strategy",
                   "--aggregation"):
        assert option in train_help


def test_partition_json(tmp_path, capsys):
    assert main(["partition", "--dataset", "cora", "--parts", "3", "--cache-dir",
                 str(tmp_path), "--out", str(tmp_path / "out"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_parts"] == 3
    assert sorted(os.listdir(tmp_path / "out"))[:3] == ["manifest.json", "part-0-of-3.pt",
                                                        "part-1-of-3.pt"]


def test_partition_objective(tmp_path, capsys):
    # The volume objective (default) sends fewer halo rows than the edge-cut one.
    rows = {}
    for objective in ("vol", "cut"):
        assert main(["partition", "--dataset", "cora", "--parts", "4", "--cache-dir",
                     str(tmp_path), "--objective", objective, "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["options"]["objective"] == objective
        rows[objective] = info["stats"]["total_halo"]
    assert rows["vol"] < rows["cut"]


def test_bad_dataset_is_a_clear_error(capsys):
    assert main(["partition", "--dataset", "imagenet"]) == 2
    assert "known datasets" in capsys.readouterr().err


def _cli(tmp_path, *args, **env):
    # A fresh partition cache, but the kernels this interpreter already compiled (a cache of
    # their own would compile them again in every test).
    env = dict(os.environ, LIGHTNING_FULLGRAPH_CACHE=str(tmp_path / "cache"),
               LIGHTNING_FULLGRAPH_EXT_DIR=str(ext_root()), PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "lightning_fullgraph.cli", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.multiprocess
def test_train_json_on_two_processes(tmp_path):
    # A stale export of the variable an earlier version handed partitions over with, and
    # a partition of another graph already in the cache, must change nothing.
    other = tmp_path / "other"
    assert main(["partition", "--dataset", "synthetic:nodes=500,degree=4", "--parts", "2",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(other)]) == 0
    link_file = tmp_path / "fitted-link.json"
    proc = _cli(tmp_path, "train", "--devices", "2", "--epochs", "20", "--json",
                "--aggregation", "pre", "--save-link", str(link_file), "--link", "calibrate",
                LIGHTNING_FULLGRAPH_PARTITION_DIR=str(other))
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)  # stdout is the JSON document and nothing else
    assert summary["nodes"] == 2708  # Cora, not the stale partition
    assert summary["processes"] == 2
    assert summary["test_acc"] > 0.6
    assert summary["comm_MB_per_epoch_per_rank"] > 0
    assert summary["aggregation"] == "pre"
    # The link fitted to the run's exchanges, for the planner to predict with.
    from lightning_fullgraph.planner import LinkModel
    link = LinkModel.load(link_file)
    assert (link.source, link.world_size) == ("training", 2) and link.samples
    assert "link fitted to the run's exchanges" in proc.stderr
    # --link calibrate: the planner's step terms on the measured link (no codec: no codec
    # time), next to the training steps' measured exchange and compute.
    assert summary["predicted_step_exchange_seconds"] > 0
    assert summary["predicted_step_codec_seconds"] == 0.0
    assert 0 < summary["train_step_exchange_seconds"] < summary["train_step_seconds"]
    assert 0 < summary["train_step_compute_seconds"] < summary["train_step_seconds"]
    # The least over ranks, per epoch, then the median: no more than rank 0's own.
    assert 0 < summary["train_step_compute_seconds_min"] \
        <= summary["train_step_compute_seconds"]
    assert summary["huge_pages"] is False  # an opt-in (--huge-pages on): nothing global


@pytest.mark.multiprocess
def test_train_step_aside_decides_alike_and_reports(tmp_path, capsys):
    # Under Lightning, two processes, by default (no option): hybrid aggregation and the
    # codec are timed against post and the exact exchange (warm-up 2, then 3 steps for each
    # subset), every rank takes the same decision (the run would hang in the next exchange
    # otherwise) and the summary reports it, with the per-epoch figures.
    proc = _cli(tmp_path, "train", "--devices", "2", "--epochs", "18", "--json", "--codec",
                "int2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    decision = summary["step_aside"]
    arms = [["hybrid", "codec"], ["hybrid"], ["codec"], []]
    assert decision["arms"] == arms
    assert decision["stages"] in arms
    assert len(decision["seconds"]) == 4 and all(0 < t < 60 for t in decision["seconds"])
    # One step per epoch: epochs 0-14 are the first step, the warm-up and the arms' steps;
    # the sixteenth (index 15) is the first that runs the decision.
    assert decision["step"] == 1 + 2 + 4 * 3
    assert len(summary["per_epoch"]["step_s"]) == 18
    assert summary["test_acc"] > 0.6
    # Without --json the summary says what was kept.
    from lightning_fullgraph.cli import _print_summary
    _print_summary(summary)
    assert "step aside           kept " in capsys.readouterr().out


@pytest.mark.multiprocess
def test_train_with_every_adaptive_knob(tmp_path):
    # The compiled kernels come from the usual build cache; partitions go to tmp_path.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_fullgraph.cli", "train", "--devices", "2",
         "--epochs", "12", "--json", "--codec", "int2", "--adaptive-bits", "--no-step-aside",
         "--cache",
         "adaptive", "--cache-dir", str(tmp_path / "partitions"), "--huge-pages", "on"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["codec"] == "int2" and summary["cache"] == "adaptive"
    from lightning_fullgraph.kernels import huge_pages
    # --huge-pages on: installed for the run where the machine can.
    assert summary["huge_pages"] is (huge_pages._why_not() is None
                                     and not huge_pages._torch_does_it())
    assert 1.0 <= summary["bits_mean"] <= 8.0 and summary["bits_last"] in (1, 2, 4, 8)
    assert 0.0 < summary["rows_skipped_frac"] < 1.0
    # Means over the run: the last epoch's bytes are reported beside them.
    assert summary["comm_MB_per_epoch_per_rank"] > 0 and summary["comm_MB_last_epoch_per_rank"] > 0
    assert summary["test_acc"] > 0.3


def test_level_percentiles_are_checked_and_need_the_adaptive_codec(capsys):
    assert main(["train", "--devices", "1", "--level-percentiles", "50,80,95"]) == 2
    assert "--codec adaptive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["partition", "--level-percentiles", "80,50,95"])
    assert "increasing fractions" in capsys.readouterr().err
    from lightning_fullgraph.cli import _percentiles
    assert _percentiles("50,80,95") == _percentiles("0.5,0.8,0.95") == (0.5, 0.8, 0.95)


def test_codec_names_are_checked_and_suffixes_accepted(capsys):
    from lightning_fullgraph.cli import _codec_name
    assert _codec_name("INT2-Compact") == "int2-compact"
    assert _codec_name("int4-nearest-compact") == "int4-nearest-compact"
    with pytest.raises(SystemExit):
        main(["train", "--codec", "int3"])
    err = capsys.readouterr().err
    assert "unknown codec 'int3'" in err and "-compact" in err
    with pytest.raises(SystemExit):  # the planner predicts fixed widths only
        main(["plan", "--codec", "adaptive-compact"])
    assert "fixed-width" in capsys.readouterr().err


def test_adaptive_bits_needs_a_quantized_codec(capsys):
    assert main(["train", "--devices", "1", "--adaptive-bits"]) == 2
    assert "--adaptive-bits" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_save_link_needs_the_halo_exchange(capsys):
    assert main(["train", "--strategy", "pyg", "--save-link", "x.json"]) == 2
    assert "--save-link" in capsys.readouterr().err


def test_train_error_is_printed_once(tmp_path):
    proc = _cli(tmp_path, "train", "--devices", "2", "--epochs", "2", "--num-classes", "3")
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert proc.stderr.count("labels >= num_classes=3") == 1, proc.stderr[-4000:]
    assert "Connection closed" not in proc.stderr, proc.stderr[-4000:]


def test_partition_out_never_deletes_a_users_directory(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my work")
    assert main(["partition", "--dataset", "cora", "--parts", "2", "--cache-dir",
                 str(tmp_path / "cache"), "--out", str(out)]) == 2
    assert "notes.txt" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "my work"
    # An older partition directory is replaced.
    parts = tmp_path / "parts"
    for n in (2, 3):
        assert main(["partition", "--dataset", "cora", "--parts", str(n), "--cache-dir",
                     str(tmp_path / "cache"), "--out", str(parts)]) == 0
    assert sorted(p.name for p in parts.iterdir())[:2] == ["manifest.json", "part-0-of-3.pt"]


@pytest.mark.multiprocess
def test_train_4d_json(tmp_path):
    # ScaleGNN split over a (2, 1, 1) grid: accuracy and the grid's bytes are reported.
    proc = _cli(tmp_path, "train", "--strategy", "4d", "--model", "scalegnn", "--devices", "2",
                "--grid", "2,1,1", "--epochs", "10", "--hidden", "32", "--layers", "3",
                "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["strategy"] == "4d" and summary["grid"] == [2, 1, 1] and summary["dp"] == 1
    assert summary["batch_size"] == 2708 // 2  # the default: half the graph
    assert summary["test_acc"] > 0.5
    assert summary["comm_MB_per_epoch_per_rank"] > 0
    assert summary["sampling_s_per_epoch"] > 0 and summary["sampling_hidden_frac"] <= 1.0
    assert summary["peak_rss_MiB"] > 0


@pytest.mark.multiprocess
def test_train_4d_on_shards(tmp_path, capsys):
    # `partition --grid` cuts the shards once; `train --shards` has every process read its own
    # tiles (no process loads the graph).
    cache = tmp_path / "cache"
    assert main(["partition", "--dataset", "cora", "--grid", "2,1,1", "--cache-dir",
                 str(cache), "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["parts"] == 2 and meta["num_nodes"] == 2708
    assert len(list((cache / "4d-shards").rglob("adj-*.pt"))) == 4
    proc = _cli(tmp_path, "train", "--strategy", "4d", "--devices", "2", "--grid", "2,1,1",
                "--shards", "--cache-dir", str(cache), "--epochs", "30", "--hidden", "32",
                "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["shards"] is True and summary["grid"] == [2, 1, 1]
    assert summary["nodes"] == 2708 and summary["batch_size"] == 2708 // 2
    assert summary["test_acc"] > 0.5
    assert summary["peak_rss_MiB_max_rank"] >= summary["peak_rss_MiB"] > 0
    with pytest.raises(SystemExit):
        main(["train", "--strategy", "4d", "--cache-dir", str(cache)])
    assert "--cache-dir applies only with --strategy fullgraph or --strategy 4d --shards" in \
        capsys.readouterr().err


def test_scalegnn_needs_the_4d_strategy(capsys):
    assert main(["train", "--devices", "1", "--model", "scalegnn"]) == 2
    assert "--strategy 4d" in capsys.readouterr().err


def test_neighbor_loader_options_are_checked(capsys):
    assert main(["train", "--devices", "1", "--loader", "neighbor"]) == 2
    assert "--strategy pyg" in capsys.readouterr().err
    assert main(["train", "--devices", "1", "--strategy", "pyg", "--loader", "neighbor",
                 "--num-neighbors", "25"]) == 2
    assert "one count per layer" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_train_pyg_neighbor_loader_with_ddp(tmp_path):
    # The baseline a PyG user would pick: NeighborLoader GraphSAGE, data parallel (DDP).
    import torch_geometric.typing as pyg_typing
    proc = _cli(tmp_path, "train", "--strategy", "pyg", "--loader", "neighbor", "--model",
                "sage", "--devices", "2", "--epochs", "6", "--batch-size", "32",
                "--val-every", "2", "--json")
    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        # Neither sampling backend installed (as in CI): a clear error, nothing trained.
        assert proc.returncode == 2, proc.stderr[-4000:]
        assert proc.stderr.count("needs pyg-lib or torch-sparse") == 1, proc.stderr[-4000:]
        return
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["processes"] == 2 and summary["loader"] == "neighbor"
    assert summary["num_neighbors"] == [25, 10] and summary["batch_size"] == 32
    # 140 training nodes, 70 per process, 32 per step: 3 steps an epoch.
    assert summary["train_steps_per_epoch"] == 3
    # The gradient all-reduce of every step, counted by the DDP hook.
    params = 1433 * 16 * 2 + 16 + 16 * 7 * 2 + 7
    assert abs(summary["comm_MB_per_epoch_per_rank"] - 3 * 4 * params / 1e6) < 1e-9
    assert [p[0] for p in summary["val_trace"]] == [1, 3, 5]
    assert summary["test_acc"] > 0.3


def test_options_the_strategy_would_ignore_are_refused(capsys):
    # argparse's error (usage, exit status 2), naming every ignored option and what it needs;
    # before, --strategy 4d trained and reported "codec": null.
    fullgraph_only = ["--codec", "int2", "--cache", "0.1", "--pipeline", "async",
                      "--sampling", "0.5", "--no-overlap", "--aggregation", "post",
                      "--link", "calibrate", "--duplex"]
    with pytest.raises(SystemExit) as info:
        main(["train", "--strategy", "4d", "--model", "scalegnn", *fullgraph_only])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: lightning-fullgraph train")
    assert ("--aggregation, --codec, --cache, --pipeline, --no-overlap, --sampling, "
            "--duplex and --link apply only with --strategy fullgraph (got --strategy 4d --model "
            "scalegnn)") in err
    with pytest.raises(SystemExit) as info:
        main(["train", "--grid", "2,1,1", "--dp", "2", "--bf16-comm", "--steps-per-epoch", "3"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert ("--dp, --grid, --bf16-comm and --steps-per-epoch apply only with --strategy 4d "
            "(got --strategy fullgraph)") in err
    with pytest.raises(SystemExit):
        main(["train", "--strategy", "pyg", "--timeout", "30", "--num-neighbors", "5,5"])
    err = capsys.readouterr().err
    assert "--timeout applies only with --strategy fullgraph or 4d" in err
    assert "--num-neighbors applies only with --strategy pyg --loader neighbor" in err
    with pytest.raises(SystemExit):
        main(["train", "--strategy", "4d", "--model", "scalegnn", "--norm", "batch_norm"])
    assert "--norm applies only with a --model other than scalegnn" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--strategy", "4d", "--grid", "2,1"])
    assert "three positive process counts" in capsys.readouterr().err


def test_default_number_of_processes_follows_the_cores():
    # A 2-core machine runs 2 processes, not 4 that would wait for each other's cores.
    from lightning_fullgraph.cli import _default_devices
    assert build_parser().parse_args(["train"]).devices is None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert _default_devices("cpu") == min(4, cores)
    demo = [line for line in (ROOT / "scripts" / "demo.sh").read_text().splitlines()
            if line.startswith("exec ")]
    assert len(demo) == 1 and "--devices" not in demo[0]  # the CLI's default


def test_sigterm_ends_the_run_with_a_non_zero_status_saying_so(monkeypatch, capsys):
    # Lightning stops every rank at the next step with SIGTERMException, a SystemExit of
    # status 0: the CLI said nothing and exited 0 as if the run had finished. (The whole
    # path, a SIGTERM to rank 0 of 2 processes, is what scripts/ and the README show; a real
    # signal is not sent here: it would leave the strategy's stop watchdog in pytest.)
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    import lightning_fullgraph.cli as cli

    def stopped(args):
        raise SIGTERMException()

    monkeypatch.setattr(cli, "_train", stopped)
    assert main(["train", "--devices", "1"]) == cli.SIGTERM_EXIT == 143
    captured = capsys.readouterr()
    assert captured.err == ("lightning-fullgraph train: stopped by SIGTERM before the run "
                            "finished; no result\n") and captured.out == ""
    monkeypatch.setenv("RANK", "1")  # the other ranks stop with the same status, silently
    assert main(["train", "--devices", "1"]) == 143 and capsys.readouterr().err == ""
    monkeypatch.setattr(cli, "_train", lambda args: sys.exit(3))  # any other exit: as is
    with pytest.raises(SystemExit) as info:
        main(["train", "--devices", "1"])
    assert info.value.code == 3


def test_4d_dimensions_are_checked_before_any_process_starts(capsys, monkeypatch):
    # Checked by every rank in the strategy, the error was printed once per rank.
    import lightning.pytorch as pl

    def launched(*args, **kwargs):
        raise AssertionError("processes were started")

    monkeypatch.setattr(pl.Trainer, "fit", launched)
    assert main(["train", "--strategy", "4d", "--model", "scalegnn", "--devices", "3",
                 "--grid", "2,1,1"]) == 2
    assert capsys.readouterr().err.count("not a multiple of the grid (2, 1, 1)") == 1
    assert main(["train", "--strategy", "4d", "--model", "scalegnn", "--devices", "2",
                 "--dp", "3"]) == 2
    assert "make dp * x * y * z equal the number of processes" in capsys.readouterr().err


def test_num_classes_is_checked_by_every_strategy(capsys, monkeypatch):
    # --strategy pyg and 4d sized the model from the labels and ignored --num-classes.
    import lightning.pytorch as pl
    monkeypatch.setattr(pl.Trainer, "fit", lambda *a, **k: pytest.fail("trained"))
    for strategy in (["--strategy", "pyg"], ["--strategy", "4d", "--model", "scalegnn"]):
        assert main(["train", *strategy, "--devices", "1", "--num-classes", "3"]) == 2
        assert "y has 1722 labels >= num_classes=3" in capsys.readouterr().err


def test_an_error_found_in_one_ranks_part_file_is_printed_by_that_rank():
    # A part copied from another graph: only the rank whose file it is knows (when it is not
    # caught up front on rank 0), so that rank prints it; rank 0 says another rank failed.
    from lightning_fullgraph.cli import _same_on_every_rank
    from lightning_fullgraph.partition import PartitionMismatchError, StalePartitionError
    assert not _same_on_every_rank(StalePartitionError("part-1-of-2.pt ... different graph"))
    assert _same_on_every_rank(PartitionMismatchError("made for 2 parts ..."))


def test_train_exchange_options_make_one_exchange_config(tmp_path):
    # `train`'s exchange flags become the ExchangeConfig the strategy takes; --link FILE.json
    # (a link written by --save-link) is loaded, and aggregation 'auto' decides on it.
    from lightning_fullgraph.cli import _exchange_config
    from lightning_fullgraph.engine import ExchangeConfig
    from lightning_fullgraph.planner import LinkModel
    path = LinkModel(alpha=2e-4, beta=1.25e8).save(tmp_path / "link.json")
    args = build_parser().parse_args(
        ["train", "--aggregation", "auto", "--link", str(path), "--codec", "int2",
         "--cache", "budgeted", "--sampling", "0.5", "--no-overlap", "--duplex"])
    config = _exchange_config(args)
    assert isinstance(config, ExchangeConfig)
    assert config.aggregation == "auto" and config.codec == "int2" and not config.overlap
    assert config.duplex
    assert config.cache == "budgeted" and config.sampling == 0.5 and config.step_aside
    assert config.link == LinkModel.load(path)
    # Without 'auto' the link is the CommunicationMonitor's alone.
    args = build_parser().parse_args(["train", "--link", str(path)])
    config = _exchange_config(args)
    assert config.link is None and config.aggregation == "hybrid" and config.lossless
    assert not config.duplex  # off unless asked
