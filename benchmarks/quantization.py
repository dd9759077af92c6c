#!/usr/bin/env python
"""Quantized halo exchange: accuracy and bytes per wire format.

Usage::

    python -m benchmarks quantization                          # everything below (~80 min here)
    python -m benchmarks quantization --seeds 0 1 --models gcn --epochs 200
    python -m benchmarks quantization --skip-accuracy --skip-synthetic-training  # planner bytes
    python -m benchmarks quantization --json > out.json        # only the JSON on stdout

**Accuracy on Cora** (``--parts`` processes): every (model, configuration, seed) is one
``lightning-fullgraph train --json`` run (hybrid aggregation, the README's recipe: 200 epochs,
hidden 16, dropout 0.5), plus a ``post`` fp32 baseline; reported: test accuracy (mean and
standard deviation over seeds, difference to fp32 in percentage points) and the bytes each rank
sent per epoch as the engine counted them (mean over the run), with the ratios to
post-aggregated and to hybrid fp32.  The configurations are the codecs by name and
``adaptive+schedule``: per-node widths (``--codec adaptive``) with the per-epoch base width of
:class:`~lightning_fullgraph.callbacks.AdaptiveBitWidth` (``--adaptive-bits``), SYLVIE's
data- and time-adaptive quantization together.

**Accuracy on the synthetic graph** (``--train-synthetic``, 100k nodes, hidden 256,
``--synthetic-epochs``): the same runs, one seed, where rows are wide enough that the per-row
header (8 bytes) no longer bounds the reduction.

**Bytes on the 1M-node synthetic graph** (``--synthetic``, hidden 256 by default): the planner's
prediction per codec and aggregation mode (:func:`lightning_fullgraph.planner.plan_sweep`; its
predicted bytes equal the engine's counters exactly for fixed-width codecs, see
``benchmarks/planner.py`` and ``tests/planner``), as a ratio to post-aggregated fp32.  Per-node
widths are measured in training only (the planner does not model them yet).

Every finished run is appended to ``--runs`` (JSON lines; :mod:`training_runs`); a later
invocation reuses the runs already there (same dataset, model, configuration, seed, epochs,
hidden width and processes), so an interrupted benchmark resumes where it stopped.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

from ._common import add_out_argument, default_results_root, write_result
from .training_runs import Runs, compare, table

CODECS = ("fp32", "bf16", "int8", "int4", "int2", "int1", "adaptive")
#: Configuration name -> ``train`` flags.
CONFIGS: Dict[str, Tuple[str, ...]] = {
    "fp32": (),
    **{c: ("--codec", c) for c in CODECS if c != "fp32"},
    "adaptive+schedule": ("--codec", "adaptive", "--adaptive-bits"),
    # Per-node widths with skewed levels: 50 % of boundary nodes at 1 bit, 30 % at 2,
    # 15 % at 4, 5 % at 8 (mean 2.1 bits instead of the quartiles' 3.75).
    "adaptive-50/80/95": ("--codec", "adaptive", "--level-percentiles", "50,80,95"),
    # The same with a 2-bit floor (2, 2, 4, 8 bits; mean 2.6).
    "adaptive2-50/80/95": ("--codec", "adaptive2", "--level-percentiles", "50,80,95"),
}


def synthetic_bytes(args, say) -> List[Dict[str, Any]]:
    from lightning_fullgraph.data import load_dataset
    from lightning_fullgraph.planner import plan_sweep

    data = load_dataset(args.synthetic)
    rows = []
    base = None
    for codec in [c for c in CODECS if c != "adaptive" and c in args.configs]:
        result = plan_sweep(data, [args.parts], dataset=args.synthetic, model="gcn",
                            hidden=args.hidden, layers=2, modes=("post", "hybrid"),
                            codec=codec, progress=say)
        for mode in ("post", "hybrid"):
            sent = sum(result["results"][0]["modes"][mode]["bytes_sent"])
            if codec == "fp32" and mode == "post":
                base = sent
            rows.append({"graph": args.synthetic, "model": "gcn", "hidden": args.hidden,
                         "parts": args.parts, "codec": codec, "aggregation": mode,
                         "bytes_per_epoch": sent,
                         "reduction_vs_post_fp32": base / sent if base and sent else None})
    return rows


def _table(acc: List[Dict], syn: List[Dict]) -> str:
    lines = [table(acc)] if acc else []
    if syn:
        lines.append("")
        lines.append(f"{'graph':36} {'codec':6} {'mode':7} {'MB/epoch':>10} {'× post fp32':>11}")
        for r in syn:
            lines.append(f"{r['graph'][:36]:36} {r['codec']:6} {r['aggregation']:7} "
                         f"{r['bytes_per_epoch'] / 1e6:10.2f} {r['reduction_vs_post_fp32']:11.2f}")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="cora")
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--models", nargs="+", default=["gcn", "sage"])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                   help="codecs by name, and adaptive+schedule (per-node widths with the "
                        "AdaptiveBitWidth schedule)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--synthetic", default="synthetic:nodes=1000000,degree=10,features=128")
    p.add_argument("--hidden", type=int, default=256, help="hidden width on the synthetic graph")
    p.add_argument("--train-synthetic", default="synthetic:nodes=100000,degree=10,features=128",
                   help="synthetic graph trained on for accuracy and measured bytes")
    p.add_argument("--synthetic-epochs", type=int, default=30)
    p.add_argument("--synthetic-seeds", nargs="+", type=int, default=[0])
    p.add_argument("--runs", default=str(default_results_root() / "quantization.jsonl"),
                   help="JSON-lines file of finished runs, reused by later invocations "
                        "('' to keep none; default in the results directory)")
    p.add_argument("--skip-accuracy", action="store_true")
    p.add_argument("--skip-synthetic-training", action="store_true")
    p.add_argument("--skip-synthetic", action="store_true")
    p.add_argument("--json", action="store_true")
    add_out_argument(p)
    args = p.parse_args(argv)
    if "fp32" not in args.configs:
        args.configs.insert(0, "fp32")
    runs = Runs(Path(args.runs) if args.runs else None)

    def say(line: str) -> None:
        print(f"[quantization] {line}", file=sys.stderr, flush=True)

    configs = {name: CONFIGS[name] for name in args.configs}
    acc = [] if args.skip_accuracy else compare(runs, args.parts, say, args.dataset, args.models,
                                                 configs, args.seeds, args.epochs, 16)
    if not args.skip_synthetic_training:
        acc += compare(runs, args.parts, say, args.train_synthetic, args.models, configs,
                       args.synthetic_seeds, args.synthetic_epochs, args.hidden)
    syn = [] if args.skip_synthetic else synthetic_bytes(args, say)
    result = {"accuracy": acc, "synthetic": syn, "parts": args.parts, "epochs": args.epochs}
    write_result('quantization', result, args.out, indent=2)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(json.dumps(result))
        print(_table(acc, syn))


if __name__ == "__main__":
    main()
