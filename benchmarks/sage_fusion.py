#!/usr/bin/env python
"""Unmodified ``SAGEConv`` with its root term accumulated into ``lin_l``'s product, or not.

Usage::

    python -m benchmarks sage_fusion                 # SAGEConv(128, 128), 500k nodes / 8M edges
    python -m benchmarks sage_fusion --json          # only the JSON on stdout

With the kernels on (``kernels.use("auto")``) a ``SAGEConv`` runs
``lin_l(aggregate(x)).addmm_(x_r, W_r^T)`` (:mod:`lightning_fullgraph.kernels.sage`) instead of
PyG's ``lin_l(aggregate(x)) + lin_r(x_r)``. Both run here on the same kernels and the same
layer -- ``pyg_forward`` by removing the fused forward for the step -- one forward + backward
step each, ``--rounds`` rounds in ABBA order in one process; reported: min, median and mean
seconds per step, ``pyg_forward / fused`` of the medians, and the largest difference of the
outputs and gradients (same inputs, fp32).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from ._common import add_out_argument, write_result


def run(nodes: int, edges: int, features: int, rounds: int, seed: int = 0) -> dict:
    import torch
    from torch_geometric.nn import SAGEConv

    import lightning_fullgraph.kernels as K
    from ._common import abba, spread
    from .kernels import power_law_graph

    torch.manual_seed(seed)
    ei = power_law_graph(nodes, edges, src_skew=2.0, dst_skew=2.0, seed=seed)
    x = torch.randn(nodes, features, requires_grad=True)
    conv = SAGEConv(features, features)
    g = torch.randn(nodes, features)
    K.use("auto")
    try:
        conv(x, ei)  # installs the kernels and the fused forward
        fused_forward = conv.__dict__.get("forward")
        if fused_forward is None:
            raise RuntimeError("the fused forward was not installed on SAGEConv")

        def step(fused: bool):
            if fused:
                conv.__dict__["forward"] = fused_forward
            else:
                conv.__dict__.pop("forward", None)
            x.grad = None
            conv.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            out = conv(x, ei)
            out.backward(g)
            seconds = time.perf_counter() - t0
            grads = [x.grad] + [p.grad for p in conv.parameters()]
            return seconds, out.detach(), [t.clone() for t in grads]

        _, out_f, grads_f = step(True)  # warm-up of both, and the comparison
        _, out_p, grads_p = step(False)
        diff = max([(out_f - out_p).abs().max().item()]
                   + [(a - b).abs().max().item() for a, b in zip(grads_f, grads_p)])
        t_fused, t_pyg = abba(lambda: step(True)[0], lambda: step(False)[0], rounds)
        conv.__dict__["forward"] = fused_forward
    finally:
        K.use(None)
    row = {"nodes": nodes, "edges": edges, "features": features, "rounds": rounds,
           "max_abs_diff": diff, "fused": spread(t_fused), "pyg_forward": spread(t_pyg)}
    row["speedup_median"] = row["pyg_forward"]["median"] / row["fused"]["median"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500_000)
    parser.add_argument("--edges", type=int, default=8_000_000)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=8, help="ABBA rounds (both ways each)")
    parser.add_argument("--json", action="store_true", help="only the JSON on stdout")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    row = run(args.nodes, args.edges, args.features, args.rounds)
    print(json.dumps(row, indent=2))
    write_result('sage_fusion', row, args.out)
    if not args.json:
        print(f"SAGEConv({args.features}, {args.features}) fwd+bwd, {args.nodes:,} nodes / "
              f"{args.edges:,} edges, median of {args.rounds}: fused "
              f"{row['fused']['median']:.4f} s, PyG's forward {row['pyg_forward']['median']:.4f}"
              f" s, x{row['speedup_median']:.3f}; max |diff| {row['max_abs_diff']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
