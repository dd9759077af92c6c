"""Benchmark of neighbour aggregation: PyG's default path vs torch.sparse.mm vs torch-scatter vs ours.

Usage::

    python benchmarks/kernels.py --quick                 # small smoke run (~1 min)
    python benchmarks/kernels.py                         # 1M nodes / 16M edges, F in {16,64,128,256}
    python benchmarks/kernels.py --features 128 --json out.json

For each graph case and feature width F it times one forward and one forward+backward of
an unweighted sum aggregation (``out[d] = sum_{(s,d)} x[s]``) and reports the effective
bandwidth of a forward in the model ``E*F*4 + N*F*4 + E*8 + N*8`` bytes against the
machine's measured copy bandwidth (``dst.copy_(src)`` on a large buffer, read + write).
It also times epochs of a 2-layer GCN and GraphSAGE with and without the backend.

Tip: ``THP_MEM_ALLOC_ENABLE=1`` makes PyTorch back large CPU tensors with transparent
huge pages, which removes most TLB misses of the random row gather (and raises the
measured copy bandwidth as well); the table records whether it was set.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

# --------------------------------------------------------------------------- graphs


def power_law_graph(num_nodes: int, num_edges: int, *, src_skew: float, dst_skew: float, seed: int = 0) -> torch.Tensor:
    """Random directed graph whose source and destination degrees follow power laws.

    Endpoint ``i`` is drawn as ``floor(N * u**skew)`` for uniform ``u`` (``skew=1`` is uniform;
    larger values concentrate edges on few nodes with a power-law tail), then node ids are
    shuffled so hubs are scattered over memory as in real graphs. Self-loops and duplicate
    edges are kept (they occur in real data too).

    Args:
        num_nodes: ``N``.
        num_edges: ``E``.
        src_skew: Exponent for sources (out-degree skew).
        dst_skew: Exponent for destinations (in-degree skew).
        seed: RNG seed.

    Returns:
        ``[2, E]`` int64 ``edge_index`` (row 0 = source, row 1 = destination).
    """
    g = torch.Generator().manual_seed(seed)
    relabel = torch.randperm(num_nodes, generator=g)

    def draw(skew: float) -> torch.Tensor:
        u = torch.rand(num_edges, generator=g, dtype=torch.float64)
        idx = (u.pow(skew) * num_nodes).long().clamp_(max=num_nodes - 1)
        return relabel[idx]

    return torch.stack([draw(src_skew), draw(dst_skew)])


CASES = {
    # name: (nodes, edges, src_skew, dst_skew)
    "powerlaw": (1_000_000, 16_000_000, 2.0, 2.0),
    "small": (100_000, 1_600_000, 2.0, 2.0),
    "skewed": (1_000_000, 16_000_000, 1.5, 6.0),
}
QUICK_CASES = {
    "powerlaw": (100_000, 1_600_000, 2.0, 2.0),
    "small": (20_000, 200_000, 2.0, 2.0),
    "skewed": (100_000, 1_600_000, 1.5, 6.0),
}

# --------------------------------------------------------------------------- machine


def copy_bandwidth(num_bytes: int = 1 << 29, repeats: int = 5) -> float:
    """Best-of-``repeats`` ``dst.copy_(src)`` bandwidth in bytes/s (read + write counted)."""
    src = torch.ones(num_bytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault pages in before timing
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * num_bytes / best


def mem_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 40


def timeit(fn: Callable[[], None], repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    # Minimum: the machine may be shared, and interference only ever adds time.
    return min(times)


# --------------------------------------------------------------------------- methods


def make_methods(edge_index: torch.Tensor, n: int):
    """Return ``{name: forward(x) -> out}`` closures over the graph (setup excluded)."""
    import torch_geometric.nn as gnn

    import lightning_fullgraph.kernels as K

    class PlainSum(gnn.MessagePassing):  # PyG's default gather/scatter path
        def __init__(self):
            super().__init__(aggr="sum")

        def forward(self, x, ei):
            return self.propagate(ei, x=x)

    pyg_layer = PlainSum()
    methods: Dict[str, Callable] = {"pyg": lambda x: pyg_layer(x, edge_index)}

    csr = K.get_csr(edge_index, n, n)
    a = torch.sparse_csr_tensor(csr.rowptr, csr.col.long(), torch.ones(csr.num_edges), (n, n))
    methods["sparse_csr_mm"] = lambda x: torch.sparse.mm(a, x)

    try:  # optional
        import torch_scatter  # noqa: F401

        col_long = csr.col.long()
        methods["torch_scatter"] = lambda x: torch_scatter.segment_csr(x.index_select(0, col_long), csr.rowptr,
                                                                       reduce="sum")
    except ImportError:
        pass

    methods["ours"] = lambda x: K.aggregate(x, edge_index, None, "sum", n, backend="auto")
    return methods


def bench_case(name: str, spec, features: List[int], args, bw: float) -> List[dict]:
    import lightning_fullgraph.kernels as K

    n, e, s_skew, d_skew = spec
    t = time.perf_counter()
    ei = power_law_graph(n, e, src_skew=s_skew, dst_skew=d_skew, seed=args.seed)
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    K.get_csr(ei, n, n)  # one-off CSR + transpose build, cached afterwards
    csr_s = time.perf_counter() - t
    max_in = int(torch.bincount(ei[1], minlength=n).max())
    print(f"# case {name}: N={n:,} E={e:,} max in-degree {max_in:,}; generate {gen_s:.1f}s, CSR build {csr_s:.1f}s",
          flush=True)
    methods = make_methods(ei, n)
    rows = []
    for f in features:
        x = torch.randn(n, f)
        eff_bytes = e * f * 4 + n * f * 4 + e * 8 + n * 8
        grad = torch.randn(n, f)
        for mname, fn in methods.items():
            if mname not in args.methods:
                continue
            row = dict(case=name, nodes=n, edges=e, F=f, method=mname)
            heavy = mname != "ours"
            # Gather/scatter paths materialise E x F messages (and their gradient in
            # backward); skip what cannot fit in the memory available right now.
            msg_bytes = e * f * 4 if mname in ("pyg", "torch_scatter") else 0
            can_fwd = 1.3 * msg_bytes < mem_available()
            can_bwd = 2.3 * msg_bytes < mem_available()
            if not can_fwd:
                row.update(fwd_s=None, fwd_bwd_s=None, note="skipped: E*F message tensor exceeds free memory")
                rows.append(row)
                print(_fmt_row(row, bw), flush=True)
                continue
            reps = 1 if heavy and e * f > 2e8 else args.repeats
            warm = 0 if heavy and e * f > 2e8 else 1
            fwd = timeit(lambda: fn(x), reps, warm)
            xg = x.clone().requires_grad_()

            def fwd_bwd():
                out = fn(xg)
                out.backward(grad)
                xg.grad = None

            fb = timeit(fwd_bwd, reps, warm) if can_bwd else None
            if fb is None:
                row["note"] = "fwd+bwd skipped: 2 x E*F tensors exceed free memory"
            row.update(fwd_s=fwd, fwd_bwd_s=fb, eff_gbs=eff_bytes / fwd / 1e9, pct_copy_bw=100 * eff_bytes / fwd / bw)
            rows.append(row)
            print(_fmt_row(row, bw), flush=True)
        del x, grad
        import gc

        gc.collect()
        K.clear_cache()  # also returns idle pooled buffers to the OS
    # speed-ups of ours vs the others, per F
    for f in features:
        ours = next((r for r in rows if r["F"] == f and r["method"] == "ours" and r.get("fwd_s")), None)
        if ours is None:
            continue
        for r in rows:
            if r["F"] == f and r.get("fwd_s") and r["method"] != "ours":
                r["ours_speedup_fwd"] = r["fwd_s"] / ours["fwd_s"]
                if r.get("fwd_bwd_s"):
                    r["ours_speedup_fwd_bwd"] = r["fwd_bwd_s"] / ours["fwd_bwd_s"]
                print(f"# F={f}: ours vs {r['method']}: fwd x{r['ours_speedup_fwd']:.1f}, "
                      f"fwd+bwd x{r.get('ours_speedup_fwd_bwd', float('nan')):.1f}")
    K.clear_cache()
    return rows


def _fmt_row(r: dict, bw: float) -> str:
    if r.get("fwd_s") is None:
        return f"{r['case']:>9} {r['F']:>4} {r['method']:>14} {'-':>9} {'-':>9} {'-':>7} {'-':>6}  {r.get('note', '')}"
    fb = f"{r['fwd_bwd_s']:9.3f}" if r.get("fwd_bwd_s") else f"{'-':>9}"
    return (f"{r['case']:>9} {r['F']:>4} {r['method']:>14} {r['fwd_s']:9.3f} {fb} "
            f"{r['eff_gbs']:7.2f} {r['pct_copy_bw']:5.1f}%  {r.get('note', '')}")


# --------------------------------------------------------------------------- end to end


def bench_e2e(spec, args) -> List[dict]:
    import torch.nn.functional as Fn
    import torch_geometric.nn as gnn

    import lightning_fullgraph.kernels as K

    n, e, s_skew, d_skew = spec
    ei = power_law_graph(n, e, src_skew=s_skew, dst_skew=d_skew, seed=args.seed)
    f_in, hidden, classes = args.e2e_features, args.e2e_hidden, 16
    x = torch.randn(n, f_in)
    y = torch.randint(0, classes, (n,))
    rows = []

    class Net(torch.nn.Module):
        def __init__(self, conv):
            super().__init__()
            self.c1, self.c2 = conv(f_in, hidden), conv(hidden, classes)

        def forward(self, x, ei):
            return self.c2(Fn.relu(self.c1(x, ei)), ei)

    for model_name, conv in (("GCN", gnn.GCNConv), ("GraphSAGE", gnn.SAGEConv)):
        for backend in ("off", "auto"):
            if backend == "off" and 2.3 * e * max(f_in, hidden) * 4 > mem_available():
                rows.append(dict(model=model_name, backend=backend, note="skipped: memory"))
                continue
            torch.manual_seed(0)
            model = Net(conv)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)

            def epoch():
                opt.zero_grad()
                loss = Fn.cross_entropy(model(x, ei), y)
                loss.backward()
                opt.step()

            with K.use(None if backend == "off" else backend):
                t = time.perf_counter()
                epoch()  # first epoch (ours: includes the one-off CSR build)
                first = time.perf_counter() - t
                steady = timeit(epoch, args.e2e_epochs, 0) if backend != "off" else first
            row = dict(model=model_name, backend=backend, first_epoch_s=first, epoch_s=steady)
            rows.append(row)
            print(f"# e2e {model_name:>9} backend={backend:>4}: first epoch {first:7.2f}s, epoch {steady:7.2f}s",
                  flush=True)
            K.clear_cache()
    return rows


# --------------------------------------------------------------------------- main


def main(argv: Optional[List[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small graphs, F in {16, 128}, fast")
    p.add_argument("--cases", nargs="+", default=None, help=f"subset of {list(CASES)}")
    p.add_argument("--features", nargs="+", type=int, default=None)
    p.add_argument("--methods", nargs="+", default=["pyg", "sparse_csr_mm", "torch_scatter", "ours"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-e2e", action="store_true", help="skip the end-to-end GCN/GraphSAGE epochs")
    p.add_argument("--no-agg", action="store_true", help="skip the aggregation table (end-to-end only)")
    p.add_argument("--e2e-case", default="powerlaw")
    p.add_argument("--e2e-features", type=int, default=128)
    p.add_argument("--e2e-hidden", type=int, default=128)
    p.add_argument("--e2e-epochs", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the JSON result to this file")
    args = p.parse_args(argv)

    import lightning_fullgraph.kernels as K

    cases = QUICK_CASES if args.quick else CASES
    names = args.cases or list(cases)
    features = args.features or ([16, 128] if args.quick else [16, 64, 128, 256])
    t = time.perf_counter()
    have_cpp = K.cpp_available()
    build_s = time.perf_counter() - t
    bw = copy_bandwidth()
    info = dict(python=sys.version.split()[0], torch=torch.__version__, threads=torch.get_num_threads(),
                cpu=platform.processor() or platform.machine(), copy_bw_gbs=bw / 1e9, cpp_available=have_cpp,
                ext_load_s=build_s, thp_mem_alloc=os.environ.get("THP_MEM_ALLOC_ENABLE", "0"), quick=args.quick)
    print(f"# torch {torch.__version__}, {info['threads']} threads, copy bandwidth {bw / 1e9:.1f} GB/s, "
          f"cpp kernels: {have_cpp} (load {build_s:.1f}s), THP_MEM_ALLOC_ENABLE={info['thp_mem_alloc']}")
    print(f"{'case':>9} {'F':>4} {'method':>14} {'fwd[s]':>9} {'fwd+bwd':>9} {'GB/s':>7} {'%copy':>6}")
    rows: List[dict] = []
    e2e: List[dict] = []
    result = dict(machine=info, aggregation=rows, end_to_end=e2e)

    def save() -> None:  # after every case, so a late OOM kill keeps the earlier results
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(result, fh, indent=1)

    for name in ([] if args.no_agg else names):
        rows += bench_case(name, cases[name], features, args, bw)
        save()
    if not args.no_e2e:
        e2e += bench_e2e(cases[args.e2e_case], args)
    print(json.dumps(result, indent=1))
    save()
    return result


if __name__ == "__main__":
    main()
