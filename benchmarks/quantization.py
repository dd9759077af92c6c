#!/usr/bin/env python
"""Quantized halo exchange: accuracy and bytes per wire format.

Usage::

    python benchmarks/quantization.py                          # Cora, P=4, GCN+SAGE, 5 seeds
    python benchmarks/quantization.py --seeds 0 1 --models gcn --epochs 200
    python benchmarks/quantization.py --skip-accuracy          # bytes on the synthetic graph only
    python benchmarks/quantization.py --json > out.json        # only the JSON on stdout

**Accuracy** (Cora, ``--parts`` processes): every (model, codec, seed) is one
``lightning-fullgraph train --json`` run (hybrid aggregation, the README's recipe: 200 epochs,
hidden 16, dropout 0.5), plus a ``post`` fp32 baseline; reported: test accuracy (mean and
standard deviation over seeds, difference to fp32 in percentage points) and the bytes each rank
sent per epoch as the engine counted them, with the ratio to post-aggregated fp32.

**Bytes on the synthetic graph** (``--synthetic``, hidden 256 by default): the planner's
prediction per codec and aggregation mode (:func:`lightning_fullgraph.planner.plan_sweep`; its
predicted bytes equal the engine's counters exactly for fixed-width codecs, see
``benchmarks/planner.py`` and ``tests/planner``), as a ratio to post-aggregated fp32.  Per-node
widths (``adaptive``) are measured on Cora only (the planner does not model them yet).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CODECS = ("fp32", "bf16", "int8", "int4", "int2", "int1", "adaptive")


def _train(args, model: str, codec: str, seed: int, aggregation: str = "hybrid") -> Dict:
    cmd = [sys.executable, "-m", "lightning_fullgraph.cli", "train", "--json", "--no-progress",
           "--dataset", args.dataset, "--devices", str(args.parts), "--model", model,
           "--epochs", str(args.epochs), "--seed", str(seed), "--codec", codec,
           "--aggregation", aggregation]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-3000:]}")
    out = json.loads(run.stdout[run.stdout.index("{"):])
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def accuracy(args, say) -> List[Dict[str, Any]]:
    rows = []
    for model in args.models:
        baseline = [_train(args, model, "fp32", s, "post") for s in args.seeds]
        post_mb = statistics.mean(r["comm_MB_per_epoch_per_rank"] for r in baseline)
        say(f"{model} post fp32: {post_mb:.4f} MB/epoch/rank")
        fp32_acc = None
        for codec in args.codecs:
            runs = []
            for seed in args.seeds:
                runs.append(_train(args, model, codec, seed))
                say(f"{model} {codec} seed {seed}: test {runs[-1]['test_acc']:.4f}, "
                    f"{runs[-1]['comm_MB_per_epoch_per_rank']:.4f} MB/epoch/rank, "
                    f"{runs[-1]['wall_s']} s")
            acc = [r["test_acc"] for r in runs]
            mb = statistics.mean(r["comm_MB_per_epoch_per_rank"] for r in runs)
            mean = statistics.mean(acc)
            if codec == "fp32":
                fp32_acc = mean
            rows.append({
                "model": model, "codec": codec, "aggregation": "hybrid", "seeds": args.seeds,
                "test_acc": acc, "test_acc_mean": mean,
                "test_acc_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                "delta_pp_vs_fp32": None if fp32_acc is None else 100 * (mean - fp32_acc),
                "MB_per_epoch_per_rank": mb, "post_fp32_MB": post_mb,
                "reduction_vs_post_fp32": post_mb / mb if mb else None,
                "step_s": statistics.median(r["train_step_seconds"] for r in runs),
            })
    return rows


def synthetic_bytes(args, say) -> List[Dict[str, Any]]:
    from lightning_fullgraph.data import load_dataset
    from lightning_fullgraph.planner import plan_sweep

    data = load_dataset(args.synthetic)
    rows = []
    base = None
    for codec in [c for c in args.codecs if c != "adaptive"]:
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
    lines = []
    if acc:
        lines.append(f"{'model':6} {'codec':9} {'test acc':>16} {'Δ pp':>6} {'MB/ep/rank':>11} "
                     f"{'× post fp32':>11} {'step ms':>8}")
        for r in acc:
            delta = "" if r["delta_pp_vs_fp32"] is None else f"{r['delta_pp_vs_fp32']:+.2f}"
            lines.append(f"{r['model']:6} {r['codec']:9} {100 * r['test_acc_mean']:8.2f} ± "
                         f"{100 * r['test_acc_std']:5.2f} {delta:>6} "
                         f"{r['MB_per_epoch_per_rank']:11.4f} {r['reduction_vs_post_fp32']:11.2f} "
                         f"{1e3 * r['step_s']:8.1f}")
    if syn:
        lines.append("")
        lines.append(f"{'graph':36} {'codec':6} {'mode':7} {'MB/epoch':>10} {'× post fp32':>11}")
        for r in syn:
            lines.append(f"{r['graph'][:36]:36} {r['codec']:6} {r['aggregation']:7} "
                         f"{r['bytes_per_epoch'] / 1e6:10.2f} {r['reduction_vs_post_fp32']:11.2f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="cora")
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--models", nargs="+", default=["gcn", "sage"])
    p.add_argument("--codecs", nargs="+", default=list(CODECS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--synthetic", default="synthetic:nodes=1000000,degree=10,features=128")
    p.add_argument("--hidden", type=int, default=256, help="hidden width on the synthetic graph")
    p.add_argument("--skip-accuracy", action="store_true")
    p.add_argument("--skip-synthetic", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if "fp32" not in args.codecs:
        args.codecs.insert(0, "fp32")

    def say(line: str) -> None:
        print(f"[quantization] {line}", file=sys.stderr, flush=True)

    acc = [] if args.skip_accuracy else accuracy(args, say)
    syn = [] if args.skip_synthetic else synthetic_bytes(args, say)
    result = {"accuracy": acc, "synthetic": syn, "parts": args.parts, "epochs": args.epochs}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(json.dumps(result))
        print(_table(acc, syn))


if __name__ == "__main__":
    main()
