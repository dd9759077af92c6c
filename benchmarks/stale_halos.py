#!/usr/bin/env python
"""Stale and cached halos: rows skipped, bytes, exchange time and accuracy per configuration.

Usage::

    python -m benchmarks stale_halos                       # Cora (5 seeds) + synthetic, P=4
    python -m benchmarks stale_halos --seeds 0 --models gcn --skip-synthetic
    python -m benchmarks stale_halos --json > out.json     # only the JSON on stdout

Every (model, configuration, seed) is one ``lightning-fullgraph train --json`` run with
hybrid aggregation (the README's recipe on Cora: 200 epochs, hidden 16, dropout 0.5; on the
synthetic graph hidden 256, ``--synthetic-epochs``), against a ``post`` fp32 baseline.  The
configurations:

==================  =============================================================
``fp32``            exact (synchronous, every row every epoch)
``cache``           adaptive halo cache, epsilon from the training accuracy
                    (``--cache adaptive``: CDFGNN with AdaptiveCacheThreshold)
``async``           asynchronous pipeline, one-epoch-stale rows and gradients
                    (``--pipeline async``: PipeGCN, a sync epoch after 10)
``adaptor``         sync/async per epoch from the loss-descent rate
                    (``--pipeline adaptive``: SYLVIE's adaptor)
``bns0.1``          boundary node sampling, p = 0.1 (``--sampling 0.1``)
``cache+int2``      the cache, int2 rows and hybrid aggregation together
``cache+int2+bns``  the same with boundary node sampling, p = 0.1 (the cache chooses
                    among each epoch's sampled rows)
``cache+int2c``     ``cache+int2`` with the compact 4-byte header (``--codec int2-compact``:
                    zero point and scale in bfloat16, rounded outwards)
``cache+int2c+bns`` the same with boundary node sampling, p = 0.1
``nooverlap``       synchronous and exact, without overlapping the halo transfer with
                    the owned-source aggregation (``--no-overlap``; overlap is on by default)
==================  =============================================================

Reported per configuration: test accuracy (mean ± std over seeds, difference to ``fp32`` in
percentage points), the fraction of rows the cache skipped or sampling left out (mean over the
run), bytes each rank sent per epoch (mean over the run) and the ratio to post-aggregated
fp32, the exchange time per epoch (for the pipeline: the time a rank waited for rows in
flight, i.e. the exposed part) and the training step time (medians).  Runs are stored in and
reused from ``--runs`` (shared with ``benchmarks/quantization.py``: the fp32 and post baselines
are the same runs).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, Tuple

from ._common import add_out_argument, default_results_root, write_result
from .training_runs import Runs, compare, table

#: Configuration name -> ``train`` flags.
CONFIGS: Dict[str, Tuple[str, ...]] = {
    "fp32": (),
    "cache": ("--cache", "adaptive"),
    "async": ("--pipeline", "async"),
    "adaptor": ("--pipeline", "adaptive"),
    "bns0.1": ("--sampling", "0.1"),
    "cache+int2": ("--cache", "adaptive", "--codec", "int2"),
    "cache+int2+bns": ("--cache", "adaptive", "--codec", "int2", "--sampling", "0.1"),
    "cache+int2c": ("--cache", "adaptive", "--codec", "int2-compact"),
    "cache+int2c+bns": ("--cache", "adaptive", "--codec", "int2-compact", "--sampling",
                        "0.1"),
    "nooverlap": ("--no-overlap",),
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="cora")
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--models", nargs="+", default=["gcn", "sage"])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--synthetic", default="synthetic:nodes=100000,degree=10,features=128",
                   help="synthetic graph trained on (hidden --hidden, --synthetic-epochs)")
    p.add_argument("--hidden", type=int, default=256, help="hidden width on the synthetic graph")
    p.add_argument("--synthetic-epochs", type=int, default=200,
                   help="epochs on the synthetic graph (default 200, as on Cora: a cache's skip "
                        "rate is a mean over training, and rows keep moving until the model "
                        "has converged)")
    p.add_argument("--synthetic-seeds", nargs="+", type=int, default=[0])
    p.add_argument("--dropout", type=float, default=None,
                   help="dropout of every run (default: the CLI's 0.5); dropout redraws its "
                        "masks every epoch, so it changes every halo row and the cache can "
                        "skip little: --dropout 0 shows the regime CDFGNN measures")
    p.add_argument("--skip-cora", action="store_true")
    p.add_argument("--skip-synthetic", action="store_true")
    p.add_argument("--runs", default=str(default_results_root() / "quantization.jsonl"),
                   help="JSON-lines file of finished runs, reused by later invocations "
                        "('' to keep none; default in the results directory)")
    p.add_argument("--json", action="store_true")
    add_out_argument(p)
    args = p.parse_args(argv)
    if "fp32" not in args.configs:
        args.configs.insert(0, "fp32")
    runs = Runs(Path(args.runs) if args.runs else None)
    configs = {name: CONFIGS[name] for name in args.configs}
    extra = () if args.dropout is None else ("--dropout", str(args.dropout))
    suffix = "" if args.dropout is None else f"@dropout{args.dropout:g}"

    def say(line: str) -> None:
        print(f"[stale_halos] {line}", file=sys.stderr, flush=True)

    rows = [] if args.skip_cora else compare(runs, args.parts, say, args.dataset, args.models,
                                             configs, args.seeds, args.epochs, 16, extra,
                                             suffix)
    if not args.skip_synthetic:
        rows += compare(runs, args.parts, say, args.synthetic, args.models, configs,
                        args.synthetic_seeds, args.synthetic_epochs, args.hidden, extra, suffix)
    result = {"rows": rows, "parts": args.parts}
    write_result('stale_halos', result, args.out, indent=2)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(json.dumps(result))
        print(table(rows))


if __name__ == "__main__":
    main()
