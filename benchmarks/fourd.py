#!/usr/bin/env python
"""FourDStrategy (ScaleGNN) against full-graph training: accuracy, bytes, step time.

Usage::

    python benchmarks/fourd.py                        # Cora, 4 processes
    python benchmarks/fourd.py --dataset synthetic:nodes=100000,degree=10,features=128
    python benchmarks/fourd.py --json > out.json      # only the JSON on stdout

Every configuration is one ``lightning-fullgraph train --json`` run on ``--devices``
processes (runs are stored in ``--runs`` and reused):

=====================  =================================================================
``fullgraph gcn``      FullGraphStrategy, GCN, hybrid aggregation (every node every epoch)
``4d dp gcn``          FourDStrategy, grid (1,1,1): data parallel on sampled mini-batches
``4d dp scalegnn``     the same with ScaleGNN's model (residual GCN, RMSNorm)
``4d grid scalegnn``   ScaleGNN split over a (2,2,1) grid, one replica
``4d dp2 x grid``      two replicas of a (2,1,1) grid
``... bf16``           the grid's partial sums as bfloat16 (``--bf16-comm``)
=====================  =================================================================

A 4d epoch is ``ceil(N / B)`` steps of ``B`` sampled vertices (default a quarter of the
graph); bytes are per rank per epoch: halo rows for full-graph training (its gradient
all-reduce is not counted), and for 4d every collective of the grid and the replicas (the
parallel products, the logits gathered, the weight-gradient all-reduces; a ring all-reduce
counted as 2 (g - 1) / g of its payload).  "train ms/epoch" sums the training steps of an
epoch (median over epochs); "RSS" is rank 0's peak; "sampling hidden" is the share of the
time spent drawing batches that prefetching overlapped with training.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from training_runs import Runs, train  # noqa: E402

CONFIGS = {
    "fullgraph gcn": ("gcn", ()),
    "4d dp gcn": ("gcn", ("--strategy", "4d", "--grid", "1,1,1")),
    "4d dp scalegnn": ("scalegnn", ("--strategy", "4d", "--grid", "1,1,1", "--layers", "3")),
    "4d grid scalegnn": ("scalegnn", ("--strategy", "4d", "--grid", "2,2,1", "--layers", "3")),
    "4d dp2 x grid": ("scalegnn", ("--strategy", "4d", "--dp", "2", "--grid", "2,1,1",
                                   "--layers", "3")),
    "4d grid bf16": ("scalegnn", ("--strategy", "4d", "--grid", "2,2,1", "--layers", "3",
                                  "--bf16-comm")),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="cora")
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--runs", default=str(ROOT / "benchmarks" / "results" / "fourd.jsonl"))
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    runs = Runs(Path(args.runs) if args.runs else None)
    rows = []
    for name in args.configs:
        model, flags = CONFIGS[name]
        done = [train(runs, args.devices, args.dataset, model, name, flags, seed, args.epochs,
                      args.hidden) for seed in args.seeds]
        acc = [r["test_acc"] for r in done]
        rows.append({
            "config": name, "model": model, "flags": list(flags), "dataset": args.dataset,
            "processes": args.devices, "epochs": args.epochs, "seeds": args.seeds,
            "test_acc": acc, "test_acc_mean": statistics.mean(acc),
            "test_acc_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
            "MB_per_epoch_per_rank": statistics.mean(r["comm_MB_per_epoch_per_rank"] or 0.0
                                                     for r in done),
            "step_s": statistics.median(r["train_step_seconds"] or 0.0 for r in done),
            "fit_s": statistics.median(r["fit_seconds"] for r in done),
            "batch_size": done[0].get("batch_size"),
            "peak_rss_MiB_rank0": statistics.mean(r.get("peak_rss_MiB") or 0.0 for r in done),
            "sampling_hidden_frac": done[0].get("sampling_hidden_frac"),
        })
        print(f"[fourd] {name}: {rows[-1]['test_acc_mean']:.4f}", file=sys.stderr, flush=True)
    result = {"rows": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(json.dumps(result))
    print(f"{'config':18} {'test acc (%)':>14} {'MB/epoch/rank':>14} {'train ms/ep':>11} "
          f"{'fit s':>7} {'batch':>6} {'RSS MiB':>8} {'sampling hidden':>15}")
    for r in rows:
        hidden = r["sampling_hidden_frac"]
        print(f"{r['config']:18} {100 * r['test_acc_mean']:7.2f} ± {100 * r['test_acc_std']:4.2f} "
              f"{r['MB_per_epoch_per_rank']:14.4f} {1000 * r['step_s']:11.1f} {r['fit_s']:7.1f} "
              f"{r['batch_size'] or '':>6} {r['peak_rss_MiB_rank0']:8.0f} "
              f"{'' if hidden is None else f'{100 * hidden:.0f} %':>15}")


if __name__ == "__main__":
    main()
