#!/usr/bin/env python
"""Weighted backward aggregation: weights read through the transposed positions vs. gathered first.

Usage::

    python -m benchmarks weighted_backward              # 500k/8M power-law, 1M/16M uniform
    python -m benchmarks weighted_backward --cases uniform --rounds 20
    python -m benchmarks weighted_backward --json                # only the JSON on stdout

The backward of a weighted sum aggregation (``GCNConv``'s normalised edges) is a sum over the
transposed CSR whose edge ``t`` carries the forward's CSR-order weight ``w[t_perm[t]]``. Two
ways, same bits (checked before timing):

* ``fused``: the C++ kernel reads ``w[t_perm[t]]`` itself, prefetched beside the source row it
  scales (what ``csr_sum``'s backward does);
* ``gathered``: ``w[t_perm]`` gathered into a new ``[E]`` tensor first (``take_checked``, the
  prefetching gather), then the plain weighted sum (what it did before).

Both are timed in one process, ``--rounds`` rounds in ABBA order (the first of a pair is
sometimes faster or slower for reasons of its own: allocation, cache state), F = 128 float32
rows; reported: min, median and mean seconds per call, and ``gathered / fused`` of the medians.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from ._common import add_out_argument, write_result

CASES = {"power-law": (500_000, 8_000_000), "uniform": (1_000_000, 16_000_000)}


def run_case(name: str, features: int, rounds: int, scale: float = 1.0, seed: int = 0) -> dict:
    import torch

    from ._common import abba, spread
    from .kernels import power_law_graph
    from lightning_fullgraph.kernels import ops
    from lightning_fullgraph.kernels.csr import get_csr

    n, e = (max(2, int(v * scale)) for v in CASES[name])
    g = torch.Generator().manual_seed(seed)
    if name == "power-law":
        ei = power_law_graph(n, e, src_skew=2.0, dst_skew=2.0, seed=seed)
    else:
        ei = torch.randint(0, n, (2, e), generator=g)
    csr = get_csr(ei, n, n)
    w = torch.rand(e, generator=g)
    grad = torch.randn(n, features, generator=g)

    def fused():
        return ops.csr_sum_raw(csr.t_rowptr, csr.t_col, w, grad, False, "cpp", csr.t_perm)

    def gathered():
        return ops.csr_sum_raw(csr.t_rowptr, csr.t_col, ops.take_checked(w, csr.t_perm, "cpp"),
                               grad, False, "cpp")

    identical = bool(torch.equal(fused(), gathered()))  # also the warm-up of both

    def timed(f):
        def run() -> float:
            t0 = time.perf_counter()
            out = f()
            seconds = time.perf_counter() - t0
            del out
            return seconds
        return run

    t_fused, t_gathered = abba(timed(fused), timed(gathered), rounds)
    row = {"case": name, "nodes": n, "edges": e, "features": features, "rounds": rounds,
           "identical": identical, "fused": spread(t_fused), "gathered": spread(t_gathered)}
    row["speedup_median"] = row["gathered"]["median"] / row["fused"]["median"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=12, help="ABBA rounds (both ways each)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="nodes and edges times this (e.g. 0.001 for a smoke run)")
    parser.add_argument("--json", action="store_true", help="only the JSON on stdout")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    from lightning_fullgraph.kernels import cpp
    if cpp.load() is None:
        print("the C++ kernels are not available here: nothing to compare", file=sys.stderr)
        return 2
    rows = [run_case(c, args.features, args.rounds, args.scale) for c in args.cases]
    print(json.dumps({"rows": rows}, indent=2))
    write_result('weighted_backward', {"rows": rows}, args.out)
    if not args.json:
        print(f"{'case':<10} {'nodes / edges':>20} {'identical':>9} {'fused med s':>11} "
              f"{'gathered med s':>14} {'gathered/fused':>14}")
        for r in rows:
            graph = f"{r['nodes']:,} / {r['edges']:,}"
            print(f"{r['case']:<10} {graph:>20} {'yes' if r['identical'] else 'NO':>9} "
                  f"{r['fused']['median']:>11.4f} {r['gathered']['median']:>14.4f} "
                  f"{r['speedup_median']:>14.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
