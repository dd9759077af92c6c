#!/usr/bin/env python
"""FourDStrategy (ScaleGNN) against full-graph training and PyG's NeighborLoader with DDP.

Usage::

    python -m benchmarks fourd                        # Cora, 4 processes
    python -m benchmarks fourd --dataset synthetic:nodes=100000,degree=10,features=128 \
        --epochs 30 --seeds 0
    python -m benchmarks fourd --json > out.json      # only the JSON on stdout

Every configuration is one ``lightning-fullgraph train --json`` run (runs are stored in
``--runs`` and reused), on ``--devices`` processes unless it says otherwise:

=======================  ===============================================================
``pyg single gcn``       plain PyG, full batch, **one** process (the memory reference)
``pyg neighbor sage``    what a PyG user picks instead: ``NeighborLoader`` GraphSAGE
                         (fan-out 25, 10), data parallel with Lightning's DDP
``fullgraph gcn``        FullGraphStrategy, GCN, hybrid aggregation (every node every epoch)
``4d dp gcn``            FourDStrategy, grid (1,1,1): data parallel on sampled mini-batches
``4d dp scalegnn``       the same with ScaleGNN's model (residual GCN, RMSNorm)
``4d grid scalegnn``     ScaleGNN split over a (2,2,1) grid, one replica
``4d dp2 x grid``        two replicas of a (2,1,1) grid
``... bf16``             the grid's partial sums as bfloat16 (``--bf16-comm``)
``4d ... gcn``           the CLI's default 4d model (PyG's GCN, 2 layers) on grids
                         dp 2 x (2,1,1), (2,2,1) and (4,1,1)
``4d grid sage``         PyG's GraphSAGE split over a (2,2,1) grid (whole rows between
                         its layers)
``4d single gcn``        the 4d recipe on **one** process (the memory reference for 4d;
                         ``... shards``: reading the one-range shards, no gcn_norm in-process)
``4d ... shards``        every process holds only its grid position's shards
                         (``--shards``, cut beforehand by ``partition --grid``)
=======================  ===============================================================

A 4d epoch is ``ceil(N / B)`` steps of ``B`` sampled vertices (default half the
graph); a NeighborLoader epoch covers every training node once, ``--neighbor-batch`` seed
nodes per step and process.  Bytes are per rank: halo rows for full-graph training (its
gradient all-reduce is not counted), every collective of the grid and the replicas for 4d
(the parallel products, the logits gathered, the weight-gradient all-reduces), DDP's
gradient all-reduces for NeighborLoader (counted by a communication hook); a ring
all-reduce counts 2 (g - 1) / g of its payload.  "train ms/ep" sums the training steps of
an epoch (median over epochs).  "to target" is the training time (validation excluded) until
the validation accuracy first reaches the target (``--target``, default 95 % of full-graph
GCN's mean best validation accuracy; validated every ``--val-every`` epochs), median over the
seeds that reached it.  "RSS" is rank 0's peak, also as a share of the single process's;
"max RSS" the largest peak of any process, also as a share of ``4d single gcn``'s;
"sampling hidden" is the share of the time spent drawing 4d batches that prefetching
overlapped with training.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ._common import add_out_argument, default_results_root, write_result
from .training_runs import Runs, train

# name -> (model, train flags, processes: None = --devices)
CONFIGS = {
    "pyg single gcn": ("gcn", ("--strategy", "pyg"), 1),
    "pyg neighbor sage": ("sage", ("--strategy", "pyg", "--loader", "neighbor"), None),
    "fullgraph gcn": ("gcn", (), None),
    "4d dp gcn": ("gcn", ("--strategy", "4d", "--grid", "1,1,1"), None),
    "4d dp scalegnn": ("scalegnn", ("--strategy", "4d", "--grid", "1,1,1", "--layers", "3"),
                       None),
    "4d grid scalegnn": ("scalegnn", ("--strategy", "4d", "--grid", "2,2,1", "--layers", "3"),
                         None),
    "4d dp2 x grid": ("scalegnn", ("--strategy", "4d", "--dp", "2", "--grid", "2,1,1",
                                   "--layers", "3"), None),
    "4d grid bf16": ("scalegnn", ("--strategy", "4d", "--grid", "2,2,1", "--layers", "3",
                                  "--bf16-comm"), None),
    # The CLI's default 4d recipe (its default model, PyG's GCN) on the two grids.
    "4d dp2 x grid gcn": ("gcn", ("--strategy", "4d", "--dp", "2", "--grid", "2,1,1"), None),
    "4d grid gcn": ("gcn", ("--strategy", "4d", "--grid", "2,2,1"), None),
    "4d grid gcn bf16": ("gcn", ("--strategy", "4d", "--grid", "2,2,1", "--bf16-comm"), None),
    "4d 4x1x1 gcn": ("gcn", ("--strategy", "4d", "--grid", "4,1,1"), None),
    "4d 4x1x1 gcn bf16": ("gcn", ("--strategy", "4d", "--grid", "4,1,1", "--bf16-comm"), None),
    # PyG's GraphSAGE itself on a grid (whole rows between its layers: GridRowsModel).
    "4d grid sage": ("sage", ("--strategy", "4d", "--grid", "2,2,1"), None),
    # Memory: the 4d recipe on one process (the whole graph), and on a grid where every
    # process holds only its shards (--shards; cut beforehand by `partition --grid`, so
    # that no training process ever loads the whole graph).
    "4d single gcn": ("gcn", ("--strategy", "4d", "--grid", "1,1,1"), 1),
    "4d single gcn shards": ("gcn", ("--strategy", "4d", "--grid", "1,1,1", "--shards"), 1),
    "4d 2x1x1 gcn shards": ("gcn", ("--strategy", "4d", "--grid", "2,1,1", "--shards"), 2),
    "4d grid gcn shards": ("gcn", ("--strategy", "4d", "--grid", "2,2,1", "--shards"), None),
    "4d dp2 x grid gcn shards": ("gcn", ("--strategy", "4d", "--dp", "2", "--grid", "2,1,1",
                                         "--shards"), None),
    "4d 4x1x1 gcn shards": ("gcn", ("--strategy", "4d", "--grid", "4,1,1", "--shards"), None),
    "4d 2x2x2 gcn shards": ("gcn", ("--strategy", "4d", "--grid", "2,2,2", "--shards"), 8),
    "4d grid scalegnn shards": ("scalegnn", ("--strategy", "4d", "--grid", "2,2,1", "--layers",
                                             "3", "--shards"), None),
}
REFERENCE, SINGLE, SINGLE_4D = "fullgraph gcn", "pyg single gcn", "4d single gcn"


def _cut_shards(dataset: str, flags) -> None:
    r"""Writes the shards a ``--shards`` run reads (once; a no-op when they exist), in a
    process of its own: the training processes then never hold the whole graph."""
    import subprocess
    grid = flags[list(flags).index("--grid") + 1]
    cmd = [sys.executable, "-m", "lightning_fullgraph.cli", "partition", "--dataset", dataset,
           "--grid", grid]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")


def plot(rows, path: str, target: float = None) -> None:
    r"""Test accuracy (mean and spread over the seeds, every seed a dot) and bytes per step
    and rank of each configuration: the figure of ``--plot`` and ``python -m benchmarks plot
    fourd``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [r["config"] for r in rows]
    fig, (acc, comm) = plt.subplots(1, 2, figsize=(12, 4))
    xs = range(len(rows))
    acc.bar(xs, [100 * r["test_acc_mean"] for r in rows],
            yerr=[100 * r["test_acc_std"] for r in rows], capsize=3, color="tab:blue", alpha=0.6)
    for x, r in zip(xs, rows):
        acc.scatter([x] * len(r["test_acc"]), [100 * a for a in r["test_acc"]], s=10,
                    color="black", zorder=3)
    low = min(100 * min(r["test_acc"]) for r in rows)
    acc.set_ylim(max(0.0, low - 10), 100)
    acc.set_ylabel("test accuracy (%)")
    acc.set_title(f"{rows[0]['dataset']}: test accuracy, seeds {rows[0]['seeds']}")
    comm.bar(xs, [r["MB_per_step_per_rank"] for r in rows], color="tab:orange")
    comm.set_ylabel("MB per step and rank")
    comm.set_yscale("log")
    comm.set_title("communication per training step")
    for ax in (acc, comm):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _time_to(trace, target):
    return next((seconds for _, seconds, acc in trace if acc >= target), None)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="cora")
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--val-every", type=int, default=5, help="epochs between validations")
    p.add_argument("--neighbor-batch", type=int, default=32,
                   help="NeighborLoader seed nodes per step and process (default 32: Cora's "
                        "140 training nodes make 2 steps per process and epoch at 4 processes)")
    p.add_argument("--target", type=float, default=None,
                   help="validation accuracy for 'to target' (default: 95 %% of full-graph "
                        "GCN's mean best validation accuracy)")
    p.add_argument("--runs", default=str(default_results_root() / "fourd-v3.jsonl"),
                   help="JSON-lines file of finished runs, reused by later invocations "
                        "('' to keep none; default in the results directory)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", default=None, metavar="FIG.png",
                   help="also draw test accuracy and bytes per step of every configuration")
    add_out_argument(p)
    args = p.parse_args(argv)
    runs = Runs(Path(args.runs) if args.runs else None)
    configs = list(args.configs)
    if args.target is None and REFERENCE not in configs:
        configs.insert(0, REFERENCE)  # the target is taken from it
    done_by = {}
    for name in configs:
        model, flags, processes = CONFIGS[name]
        flags = flags + ("--val-every", str(args.val_every))
        if "neighbor" in flags:
            flags = flags + ("--batch-size", str(args.neighbor_batch))
        if "--shards" in flags:
            _cut_shards(args.dataset, flags)
        done_by[name] = [train(runs, processes or args.devices, args.dataset, model, name, flags,
                               seed, args.epochs, args.hidden) for seed in args.seeds]
        print(f"[fourd] {name}: {statistics.mean(r['test_acc'] for r in done_by[name]):.4f}",
              file=sys.stderr, flush=True)
    target = args.target
    if target is None:
        best = [max(acc for _, _, acc in r["val_trace"]) for r in done_by[REFERENCE]]
        target = 0.95 * statistics.mean(best)
    single_rss = statistics.mean(r["peak_rss_MiB"] for r in done_by[SINGLE]) \
        if SINGLE in done_by else None
    single_4d = statistics.mean(r["peak_rss_MiB"] for r in done_by[SINGLE_4D]) \
        if SINGLE_4D in done_by else None
    rows = []
    for name in args.configs:
        model, flags, _ = CONFIGS[name]
        done = done_by[name]
        acc = [r["test_acc"] for r in done]
        reached = [t for t in (_time_to(r["val_trace"], target) for r in done) if t is not None]
        mb = statistics.mean(r["comm_MB_per_epoch_per_rank"] or 0.0 for r in done)
        steps = done[0].get("train_steps_per_epoch") or 1
        rss = statistics.mean(r.get("peak_rss_MiB") or 0.0 for r in done)
        rows.append({
            "config": name, "model": model, "flags": list(flags), "dataset": args.dataset,
            "processes": done[0]["processes"], "epochs": args.epochs, "seeds": args.seeds,
            "test_acc": acc, "test_acc_mean": statistics.mean(acc),
            "test_acc_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
            "best_val_acc_mean": statistics.mean(max(a for _, _, a in r["val_trace"])
                                                 for r in done),
            "target_val_acc": target,
            "time_to_target_s": statistics.median(reached) if reached else None,
            "reached_target": f"{len(reached)}/{len(done)}",
            "MB_per_epoch_per_rank": mb, "steps_per_epoch": steps,
            "MB_per_step_per_rank": mb / steps,
            "step_s": statistics.median(r["train_step_seconds"] or 0.0 for r in done),
            "fit_s": statistics.median(r["fit_seconds"] for r in done),
            "batch_size": done[0].get("batch_size"),
            "peak_rss_MiB_rank0": rss,
            "rss_vs_single": rss / single_rss if single_rss else None,
            "peak_rss_MiB_max_rank": statistics.mean(r.get("peak_rss_MiB_max_rank") or rss
                                                     for r in done),
            "max_rank_rss_vs_4d_single": statistics.mean(
                r.get("peak_rss_MiB_max_rank") or rss for r in done) / single_4d
            if single_4d else None,
            "sampling_hidden_frac": done[0].get("sampling_hidden_frac"),
        })
    result = {"target_val_acc": target, "rows": rows}
    write_result("fourd", result, args.out, indent=2)
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(json.dumps(result))
    print(f"target validation accuracy: {100 * target:.2f} %")
    print(f"{'config':18} {'P':>2} {'test acc (%)':>14} {'to target s':>12} {'MB/step/rank':>12} "
          f"{'MB/ep/rank':>10} {'train ms/ep':>11} {'batch':>6} {'RSS MiB':>8} {'×single':>7} "
          f"{'max RSS':>8} {'×4d single':>10} {'sampling hidden':>15}")
    for r in rows:
        hidden, t, share = r["sampling_hidden_frac"], r["time_to_target_s"], r["rss_vs_single"]
        share_4d = r["max_rank_rss_vs_4d_single"]
        got, total = r["reached_target"].split("/")
        reach = "never" if t is None else f"{t:.2f}"
        reach += "" if got == total else f" ({got}/{total})"
        print(f"{r['config']:18} {r['processes']:>2} {100 * r['test_acc_mean']:7.2f} ± "
              f"{100 * r['test_acc_std']:4.2f} {reach:>12} "
              f"{r['MB_per_step_per_rank']:12.4f} {r['MB_per_epoch_per_rank']:10.4f} "
              f"{1000 * r['step_s']:11.1f} {r['batch_size'] or '':>6} "
              f"{r['peak_rss_MiB_rank0']:8.0f} {'' if share is None else f'{share:.2f}':>7} "
              f"{r['peak_rss_MiB_max_rank']:8.0f} "
              f"{'' if share_4d is None else f'{share_4d:.2f}':>10} "
              f"{'' if hidden is None else f'{100 * hidden:.0f} %':>15}")

if __name__ == "__main__":
    main()
