"""What the kernels' huge-page CPU allocator changes: 4 KiB against 2 MiB pages, in one process.

Usage::

    python -m benchmarks huge_pages                     # 500k nodes / 8M edges, F=128
    python -m benchmarks huge_pages --nodes 20000 --edges 200000 --rounds 1 --repeats 1  # smoke

Separate processes are a poor A/B for page sizes on a shared machine: the first of two
identical runs was up to 1.8x slower than the second here (PyG's GCNConv step, 4 KiB pages
both times; the cause was not measured). So one process alternates: each round switches the allocator off, then on
(:func:`lightning_fullgraph.kernels.set_huge_pages`), allocates the inputs anew under that
setting (the graph's ``edge_index`` and the features ``x``), and times each contender
(one warm-up, then best of ``--repeats``):

* ``aggregate``: ``K.aggregate(x, edge_index, None, "sum")`` on the C++ kernels, forward
  alone and forward + backward;
* ``GCNConv`` / ``SAGEConv`` ``(F, F)``, unmodified, one forward + backward step, on our
  kernels (``ours``) and on PyG's own path (``pyg``): the allocator places every large
  tensor of the process, PyG's as well as ours.

Reported: the best time over rounds per contender and setting, and the ratio 4 KiB / 2 MiB.
Prints a table and the JSON (``--json FILE`` also writes it).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Callable, Dict, List, Optional

import torch

import lightning_fullgraph.kernels as K
from lightning_fullgraph.kernels import huge_pages

from ._common import add_out_argument, timeit, write_result
from .kernels import power_law_graph
from .layers import make_layer, step

SETTINGS = ("off", "on")


def contenders(edge_index: torch.Tensor, x: torch.Tensor, g: torch.Tensor,
               layers: List[str]) -> Dict[str, Callable[[], None]]:
    """Name -> one timed call, on inputs allocated under the current setting."""
    n = x.size(0)

    def aggregate_fwd() -> None:
        with K.use("cpp"):
            K.aggregate(x, edge_index, None, "sum", n)

    def aggregate_fwd_bwd() -> None:
        with K.use("cpp"):
            K.aggregate(x, edge_index, None, "sum", n).backward(g)
        x.grad = None

    out: Dict[str, Callable[[], None]] = {"aggregate fwd": aggregate_fwd,
                                          "aggregate fwd+bwd": aggregate_fwd_bwd}
    for layer in layers:
        conv = make_layer(layer, x.size(1))
        name = type(conv).__name__
        for path, backend in (("ours", "auto"), ("pyg", None)):
            def run(conv=conv, backend=backend) -> None:
                with K.use(backend):
                    step(conv, x, edge_index, g)
            out[f"{name} step, {path}"] = run
    return out


def measure(args: argparse.Namespace) -> dict:
    if not K.cpp_available():
        raise SystemExit("the C++ kernels are unavailable: nothing to measure")
    why = huge_pages._why_not()
    if why is not None or huge_pages._torch_does_it():
        raise SystemExit(f"huge pages cannot be switched here: "
                         f"{why or 'THP_MEM_ALLOC_ENABLE=1 makes torch place them itself'}")
    base = power_law_graph(args.nodes, args.edges, src_skew=args.skew, dst_skew=args.skew,
                           seed=args.seed)
    times: Dict[str, Dict[str, List[float]]] = {}
    installed: Dict[str, List[bool]] = {s: [] for s in SETTINGS}  # was it really switched?
    for rnd in range(args.rounds):
        for setting in SETTINGS:
            huge_pages.set_huge_pages(setting)
            installed[setting].append(huge_pages.is_active())
            edge_index = base.clone()  # placed under this setting
            gen = torch.Generator().manual_seed(args.seed)
            x = torch.randn(args.nodes, args.features, generator=gen).requires_grad_()
            g = torch.randn(args.nodes, args.features, generator=gen)
            for name, fn in contenders(edge_index, x, g, args.layers).items():
                best = min(timeit(fn, args.repeats, warmup=1))
                times.setdefault(name, {s: [] for s in SETTINGS})[setting].append(best)
                print(f"round {rnd} {setting:>3}: {name:<24} {best:.3f} s", flush=True)
            del edge_index, x, g
    huge_pages.set_huge_pages("auto")
    rows = []
    for name, per in times.items():
        small, huge = min(per["off"]), min(per["on"])
        rows.append(dict(contender=name, pages_4k_s=small, pages_2m_s=huge, ratio=small / huge,
                         rounds=per))
    graph = dict(nodes=args.nodes, edges=args.edges, skew=args.skew, features=args.features,
                 seed=args.seed)
    return dict(rows=rows, installed=installed, graph=graph,
                machine=dict(torch=torch.__version__, threads=torch.get_num_threads(),
                             cpus=os.cpu_count(), thp=huge_pages.thp_mode(),
                             load_avg_start=args.load_avg_start),
                rounds=args.rounds, repeats=args.repeats)


def table(result: dict) -> str:
    lines = ["| contender | 4 KiB pages [s] | huge pages [s] | 4 KiB / huge |",
             "| --- | --- | --- | --- |"]
    for r in result["rows"]:
        lines.append(f"| {r['contender']} | {r['pages_4k_s']:.3f} | {r['pages_2m_s']:.3f} | "
                     f"{r['ratio']:.2f}x |")
    g = result["graph"]
    lines.append(f"\nPower-law graph {g['nodes']:,} nodes / {g['edges']:,} edges, F = "
                 f"{g['features']}; best of {result['repeats']} per round, best of "
                 f"{result['rounds']} rounds alternating 4 KiB / huge pages in one process.")
    return "\n".join(lines)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=500_000)
    p.add_argument("--edges", type=int, default=8_000_000)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--skew", type=float, default=2.0,
                   help="degree skew (kernels.power_law_graph)")
    p.add_argument("--layers", nargs="*", default=["gcn", "sage"], choices=["gcn", "sage"])
    p.add_argument("--rounds", type=int, default=2, help="off/on alternations")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per contender and round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the JSON result to this file (default: "
                   "huge_pages-<time>.json in the results directory, see --out)")
    add_out_argument(p)
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> dict:
    args = parse_args(argv)
    args.load_avg_start = os.getloadavg()
    start = time.perf_counter()
    result = measure(args)
    result["seconds"] = time.perf_counter() - start
    print(table(result))
    text = json.dumps(result, indent=1)
    print(text)
    write_result("huge_pages", result, args.out, path=args.json)
    return result


if __name__ == "__main__":
    main()
