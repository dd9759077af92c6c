#!/usr/bin/env python
"""Unmodified ``GCNConv`` with the kernels' forward (normalization memoized, bias in place), or
PyG's forward on the same kernels; and the other layers that call ``gcn_norm`` in every
forward (``APPNP``, ``TAGConv``, ``SGConv``, ``GCN2Conv``) with and without the memo.

Usage::

    python -m benchmarks gcn_forward                  # layer (500k/8M) and 2-layer model (1M/16M)
    python -m benchmarks gcn_forward --cases model    # only the 2-layer training step
    python -m benchmarks gcn_forward --json           # only the JSON on stdout
    python -m benchmarks gcn_forward --cases appnp tag sg gcn2   # the memo in other layers

With the kernels on (``kernels.use("auto")``) a ``GCNConv`` runs the forward of
:mod:`lightning_fullgraph.kernels.gcn`: ``gcn_norm``'s result kept per input graph, the bias
added into the aggregation's fresh output. Both forwards run here on the same kernels and the
same modules -- ``pyg_forward`` by removing the kernels' forward for the step:

* ``layer``: ``GCNConv(F, F)`` forward + backward on a power-law graph (default 500k / 8M), as
  ``benchmarks/layers.py`` times it;
* ``model``: one training step of a 2-layer GCN (``GCNConv(F, hidden)``, ReLU,
  ``GCNConv(hidden, classes)``, cross-entropy on 60 % of the nodes, Adam) on 1M / 16M -- the
  end-to-end epoch of issue #13;
* ``appnp``, ``tag``, ``sg``, ``gcn2``: ``APPNP(K=10, alpha=0.1)``, ``TAGConv(F, F, K=3)``,
  ``SGConv(F, F, K=2)`` (``cached=False``, PyG's default) and ``GCN2Conv(F, alpha=0.1,
  theta=0.5, layer=1)`` (``x_0 = x``), forward + backward on the layer case's graph. Their
  kernels' forward is PyG's with ``gcn_norm`` answered from the memo
  (``kernels.gcn.scoped_forward``): the only difference from PyG's forward is the memo.

In the ``model`` case the first layer's input (the features) needs no gradient, so the
kernels' forward aggregates it first and keeps the aggregate
(:mod:`lightning_fullgraph.kernels.gcn_reorder`, :mod:`lightning_fullgraph.kernels.kept`): a
third contender, ``ours_pyg_order``, is the kernels' forward with that off
(``K.set_static_inputs("off")``), and ``reorder_gain = ours_pyg_order / ours``.

Each step is timed ``--rounds`` rounds in one process, each round in turn with the contenders
rotated (two: ABBA); reported: min, median and mean seconds, ``pyg_forward / ours`` of the
medians, the largest difference of outputs and gradients (same inputs, fp32; 0 means
bit-identical), the bytes the normalization memo holds and those of the kept aggregates.
``--profile`` adds one step of each under ``torch.profiler`` (``layers.profile_step``: self CPU
seconds and the top ops), which shows where the difference goes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, Dict, List

from ._common import add_out_argument, write_result

CASES = ("layer", "model", "appnp", "tag", "sg", "gcn2")
#: Layer cases besides GCNConv (see the module docstring).
NORMALIZING = ("appnp", "tag", "sg", "gcn2")


def _normalizing_layer(case: str, f: int):
    from torch_geometric import nn as gnn
    if case == "appnp":
        return gnn.APPNP(K=10, alpha=0.1)
    if case == "tag":
        return gnn.TAGConv(f, f, K=3)
    if case == "sg":
        return gnn.SGConv(f, f, K=2)
    return gnn.GCN2Conv(f, alpha=0.1, theta=0.5, layer=1)


def _build(case: str, features: int, hidden: int, classes: int):
    import torch
    from torch_geometric.nn import GCNConv

    if case == "layer":
        return torch.nn.ModuleList([GCNConv(features, features)])
    if case in NORMALIZING:
        return torch.nn.ModuleList([_normalizing_layer(case, features)])

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GCNConv(features, hidden)
            self.conv2 = GCNConv(hidden, classes)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    return Net()


def rotate(contenders: Dict[str, Callable[[], float]], rounds: int) -> Dict[str, List[float]]:
    """Seconds of each contender (each call returns its own), timed in turn in one process,
    ``rounds`` rounds, each round starting one contender later: every contender takes every
    place in a round equally often (two contenders: ABBA)."""
    names = list(contenders)
    times: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            times[name].append(contenders[name]())
    return times


def run(case: str, nodes: int, edges: int, features: int, hidden: int, classes: int,
        rounds: int, seed: int = 0, profile: bool = False) -> dict:
    import torch
    import torch.nn.functional as F

    import lightning_fullgraph.kernels as K
    from ._common import spread
    from .kernels import power_law_graph
    from lightning_fullgraph.kernels import gcn, kept

    torch.manual_seed(seed)
    ei = power_law_graph(nodes, edges, src_skew=2.0, dst_skew=2.0, seed=seed)
    model = _build(case, features, hidden, classes)
    convs = [m for m in model.modules() if gcn.applies(m) or gcn.normalizes(m)]
    single = case != "model"  # one layer, forward + backward

    def layer_call(layer, x, ei):
        return layer(x, x, ei) if case == "gcn2" else layer(x, ei)

    if single:
        x = torch.randn(nodes, features, requires_grad=True)
        g = torch.randn(nodes, features)
        opt = None
    else:
        x = torch.randn(nodes, features)
        y = torch.randint(0, classes, (nodes,))
        mask = torch.rand(nodes, generator=torch.Generator().manual_seed(seed)) < 0.6
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    K.clear_memos()
    K.use("auto")
    try:
        if single:  # installs the kernels' forwards
            layer_call(model[0], x, ei)
        else:
            model(x, ei)
        ours = [conv.__dict__.get("forward") for conv in convs]
        if not ours or any(f is None for f in ours):
            raise RuntimeError(f"the kernels' forward was not installed ({case})")

        def step(use_ours: bool, reorder: str = "auto"):
            K.set_static_inputs(reorder)
            for conv, forward in zip(convs, ours):
                if use_ours:
                    conv.__dict__["forward"] = forward
                else:
                    conv.__dict__.pop("forward", None)
            if x.requires_grad:
                x.grad = None
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            if single:
                out = layer_call(model[0], x, ei)
                out.backward(g)
            else:
                out = model(x, ei)
                F.cross_entropy(out[mask], y[mask]).backward()
            grads = ([x.grad] if x.requires_grad else []) + [p.grad for p in model.parameters()]
            grads = [t.clone() for t in grads]  # before the optimizer step, for the comparison
            if opt is not None:
                opt.step()
            return time.perf_counter() - t0, out.detach(), grads

        # Warm-up of both and the comparison: the same parameters for both (no step between).
        state = {k: v.clone() for k, v in model.state_dict().items()}
        opt_state = None if opt is None else opt.state_dict()
        _, out_o, grads_o = step(True)
        model.load_state_dict(state)
        if opt is not None:
            opt.load_state_dict(opt_state)
        _, out_p, grads_p = step(False)
        diff = max([(out_o - out_p).abs().max().item()]
                   + [(a - b).abs().max().item() for a, b in zip(grads_o, grads_p)])
        contenders = {"ours": lambda: step(True)[0], "pyg_forward": lambda: step(False)[0]}
        if not single:  # the first layer's input needs no gradient: ours aggregates it first
            contenders["ours_pyg_order"] = lambda: step(True, "off")[0]
        times = rotate(contenders, rounds)
        profiles = None
        if profile:
            from .layers import profile_step
            profiles = {"ours": profile_step(lambda: step(True)),
                        "pyg_forward": profile_step(lambda: step(False))}
        for conv, forward in zip(convs, ours):
            conv.__dict__["forward"] = forward
        memo = gcn.memo_info()
        kept_bytes = kept.info()["bytes"]
    finally:
        K.set_static_inputs(None)
        K.use(None)
    row = {"case": case, "nodes": nodes, "edges": edges, "features": features,
           "hidden": hidden, "classes": classes, "rounds": rounds, "max_abs_diff": diff,
           "memo_bytes": memo["bytes"], "kept_aggregate_bytes": kept_bytes,
           **{name: spread(t) for name, t in times.items()}}
    row["speedup_median"] = row["pyg_forward"]["median"] / row["ours"]["median"]
    if "ours_pyg_order" in row:
        row["reorder_gain_median"] = row["ours_pyg_order"]["median"] / row["ours"]["median"]
    if profiles is not None:
        row["profile"] = profiles
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=["layer", "model"],
                        help="default: layer model")
    parser.add_argument("--layer-nodes", type=int, default=500_000)
    parser.add_argument("--layer-edges", type=int, default=8_000_000)
    parser.add_argument("--model-nodes", type=int, default=1_000_000)
    parser.add_argument("--model-edges", type=int, default=16_000_000)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8, help="rounds (contenders rotated)")
    parser.add_argument("--profile", action="store_true",
                        help="also one step of each under torch.profiler (top ops)")
    parser.add_argument("--json", action="store_true", help="only the JSON on stdout")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    rows = []
    for case in args.cases:
        nodes, edges = ((args.model_nodes, args.model_edges) if case == "model"
                        else (args.layer_nodes, args.layer_edges))
        rows.append(run(case, nodes, edges, args.features, args.hidden, args.classes,
                        args.rounds, profile=args.profile))
    print(json.dumps(rows, indent=2))
    write_result("gcn_forward", rows, args.out)
    if not args.json:
        print("| case | graph | kernels' forward | PyG's forward | gain | kernels' forward, PyG's order "
              "| reorder gain | max abs diff | memo MiB | kept aggregates MiB |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            what = {"layer": f"GCNConv({r['features']}, {r['features']}) fwd+bwd",
                    "model": f"2-layer GCN step (hidden {r['hidden']})",
                    "appnp": "APPNP(K=10) fwd+bwd", "tag": "TAGConv(K=3) fwd+bwd",
                    "sg": "SGConv(K=2) fwd+bwd", "gcn2": "GCN2Conv fwd+bwd"}[r["case"]]
            print(f"| {what} | {r['nodes']:,} / {r['edges']:,} | {r['ours']['median']:.3f} s "
                  f"| {r['pyg_forward']['median']:.3f} s | x{r['speedup_median']:.3f} "
                  + (f"| {r['ours_pyg_order']['median']:.3f} s | x{r['reorder_gain_median']:.3f} "
                     if "ours_pyg_order" in r else "| - | - ")
                  + f"| {r['max_abs_diff']:.1e} | {r['memo_bytes'] / 2**20:.0f} "
                  f"| {r['kept_aggregate_bytes'] / 2**20:.0f} |")
        print(f"median of {args.rounds} rotated rounds per contender, one process")
        for r in rows:
            for name, p in r.get("profile", {}).items():
                print(f"# profile {r['case']} {name}: self CPU {p['self_total_s']:.3f} s")
                for op in p["top"]:
                    print(f"#   {op['self_s']:8.4f}s {op['calls']:4d}x  {op['op']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
