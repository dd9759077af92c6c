"""Benchmark of neighbour aggregation: PyG's default path vs torch.sparse.mm vs torch-scatter vs ours.

Usage::

    python -m benchmarks kernels --quick                 # small smoke run (~1 min)
    python -m benchmarks kernels                         # 1M nodes / 16M edges, F in {16,64,128,256}
    python -m benchmarks kernels --features 128 --json out.json
    python -m benchmarks kernels --cases uniform skewed torus --features 128 --plot kernels.png
    python -m benchmarks kernels --replot out.json --plot kernels.png   # table + figure again, no timing
    python -m benchmarks kernels --cases uniform skewed --features 128 --baseline 147edf3   # an older kernel beside

For each graph case and feature width F it times a forward and a forward+backward of an
unweighted sum aggregation (``out[d] = sum_{(s,d)} x[s]``) for every contender (PyG's
gather-scatter, ``torch.sparse.mm`` on CSR, torch-scatter's ``segment_csr`` if installed,
ours, ours validating its CSR on every call, and ``ours_bf16``: ours on bfloat16 rows, the
rows a layer's linear map gives under autocast, summed in float32; its byte counts use 2-byte
rows), each with the same warm-up and the same number of repeats R, reporting the best and
the median of R.

The forward's bandwidth is reported under two byte counts:

* **per-edge bytes** ``E*F*4 + N*F*4 + E*8 + N*8``: one source-row read per edge. The
  operation does not have to move these bytes (a source row feeding several destinations
  can come from cache), so its "share of bandwidth" can exceed 100 % on cache-resident
  graphs;
* **minimum bytes**: each *used* source row read once (unique sources counted) + each
  output row written once + the CSR arrays at their real dtypes (+ weights if any): what
  any implementation must move at least.

Each against two bandwidths measured in the same run with the same threads, just before
each graph case: **copy** (``dst.copy_(src)``, read + write counted) and **read**
(``src.sum()``, read only), best of R. The load average is recorded with them: on a
shared machine both the bandwidths and the timings move, and ratios measured in the same
run are the meaningful numbers. It also times epochs of a 2-layer GCN and GraphSAGE with
and without the backend (first epoch and best/median of the following ones, both).

**The floor of the row gather** (contender ``row_read_floor``): the C++ kernels' gather with
nothing written, ``csr_row_read`` of the extension (the same task grid, feature blocks and
prefetching as ``csr_sum``; each row's sums go to a per-thread buffer that stays in cache). It
reads every edge's source row in the order ours' kernel does (for a graph the kernels number
for locality, that order, i.e. the floor of ``ours_kernel_in_order``), forward over the CSR and
backward over its transpose, so ``ours / floor`` is what the output rows and the rest of ours
cost beyond reading the rows. What reading them takes is set by the machine (how many misses a
core keeps in flight) and the graph (how many rows come from cache).

**What a cache could save at most** (random graphs): where the edges are drawn independently,
as in the ``uniform``, ``powerlaw``, ``skewed`` and ``small`` cases, the best any cache can do,
whatever the order of the edges, is to hold the most used source rows (the independent
reference model). ``hot_set_fraction`` is the fraction of edges whose source is among the
``cache_bytes() / (F * 4)`` most used sources, ``cache_bytes()`` being every CPU cache of the
machine (sysfs). If those reads cost nothing and every other read stayed at the floor's rate,
the forward would reach ``floor's minimum-bytes share / (1 - hot_set_fraction)``: the
``reachable_minimum_pct_copy`` bound. A graph with locality (``torus``) is not bound by it:
neighbouring destinations share sources, and an order that keeps them together turns most
reads into hits.

A third reference is the rate at which torch's own ``index_select`` reads uniformly random
rows of ``x`` (what an aggregation over a graph without locality has to do, by a method that
is not ours). The cases: random power-law graphs (``powerlaw``, ``skewed``, ``small``) and a
``uniform`` random graph have no locality in any node order: every used row is re-read from
DRAM about ``E / N`` times, so the minimum-bytes share is bounded by that (the per-edge share
is the meaningful one there); ``torus`` (a mesh-like graph, ids shuffled) has locality that
the node order of ``lightning_fullgraph.kernels.locality`` recovers, and its table shows ours
in that order (default) and in the graph's own order. ``--plot PATH`` draws the bandwidth
shares and speed-ups against F, one line per case; ``--replot JSON`` redraws them (and
reprints the table) from an earlier run's ``--json`` file.

Huge pages: loading the C++ kernels installs their huge-page CPU allocator
(``lightning_fullgraph.kernels.huge_pages``), which backs large tensors with transparent huge
pages and removes most TLB misses of the random row gather (and raises the measured copy
bandwidth as well). The script loads the kernels first, so every contender runs in the same
regime; ``LIGHTNING_FULLGRAPH_HUGE_PAGES=0`` measures them all in 4 KiB pages instead
(``THP_MEM_ALLOC_ENABLE=1``, torch's own switch, has the effect of the allocator). The table
records which was in effect.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ._common import abba, add_out_argument, best_median, result_path, spread, timeit  # noqa: F401  (others import them from here too)

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


def torus_graph(num_nodes: int, num_edges: int, *, radius: int = 3, seed: int = 0) -> torch.Tensor:
    """A graph with locality hidden by shuffled ids (``lightning_fullgraph.data.torus_graph``,
    ``E / N`` in-edges per node from cells within ``radius``). An order that recovers the
    neighbourhoods (a breadth-first order, see ``lightning_fullgraph.kernels.locality``) makes
    the gathers cache hits; in the shuffled ids they are as random as in the power-law graphs.

    Returns:
        ``[2, E]`` int64 ``edge_index`` (``E`` rounded down to a multiple of ``N``).
    """
    from lightning_fullgraph.data import torus_graph as torus

    side = int(round(num_nodes ** 0.5))
    return torus(num_nodes, max(1, num_edges // (side * side)), radius=radius, seed=seed)


def make_graph(spec, seed: int) -> torch.Tensor:
    n, e, s_skew, d_skew = spec
    if s_skew == "torus":
        return torus_graph(n, e, seed=seed)
    return power_law_graph(n, e, src_skew=s_skew, dst_skew=d_skew, seed=seed)


CASES = {
    # name: (nodes, edges, src_skew, dst_skew); skew "torus": torus_graph
    "powerlaw": (1_000_000, 16_000_000, 2.0, 2.0),
    "uniform": (1_000_000, 16_000_000, 1.0, 1.0),
    "small": (100_000, 1_600_000, 2.0, 2.0),
    "skewed": (1_000_000, 16_000_000, 1.5, 6.0),
    "torus": (1_000_000, 16_000_000, "torus", "torus"),
}
QUICK_CASES = {
    "powerlaw": (100_000, 1_600_000, 2.0, 2.0),
    "uniform": (100_000, 1_600_000, 1.0, 1.0),
    "small": (20_000, 200_000, 2.0, 2.0),
    "skewed": (100_000, 1_600_000, 1.5, 6.0),
    "torus": (102_400, 1_638_400, "torus", "torus"),
}
# Feature widths per case unless --features is given.
CASE_FEATURES = {"powerlaw": [16, 64, 128, 256], "uniform": [128], "small": [128], "skewed": [128],
                 "torus": [128]}
QUICK_FEATURES = [16, 128]

# --------------------------------------------------------------------------- machine


def bandwidths(num_bytes: int = 1 << 29, repeats: int = 5) -> dict:
    """Copy (``dst.copy_(src)``, read + write counted) and read-only (``src.sum()``) bandwidth.

    Both on ``num_bytes`` fp32 buffers with the current torch thread count; bytes/s, best
    and median of ``repeats`` (after one untimed run that faults the pages in).
    """
    src = torch.ones(num_bytes // 4)
    dst = torch.empty_like(src)
    copy = timeit(lambda: dst.copy_(src), repeats, 1)
    read = timeit(lambda: src.sum(), repeats, 1)
    return dict(copy_best=2 * num_bytes / min(copy), copy_median=2 * num_bytes / statistics.median(copy),
                read_best=num_bytes / min(read), read_median=num_bytes / statistics.median(read),
                threads=torch.get_num_threads(), load_avg=os.getloadavg())


def random_row_read(x: torch.Tensor, repeats: int = 3, rows: int = 1 << 21, chunk: int = 4096) -> float:
    """Rate (bytes/s read) at which torch's ``index_select`` gathers uniformly random rows of
    ``x``: the access pattern of an aggregation over a graph without locality, by a method
    that is not ours. ``rows`` random rows in chunks of ``chunk`` into one small buffer (its
    writes stay in cache), best of ``repeats``."""
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, x.size(0), (rows,), generator=g)
    buf = torch.empty(chunk, x.size(1), dtype=x.dtype)

    def run() -> None:
        for s in range(0, rows - chunk + 1, chunk):
            torch.index_select(x, 0, idx[s:s + chunk], out=buf)

    return (rows // chunk) * chunk * x.size(1) * x.element_size() / min(timeit(run, repeats, 1))


def mem_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 40


def byte_models(csr, f: int, itemsize: int = 4, weighted: bool = False) -> dict:
    """Bytes of one forward under the two models (see the module docstring)."""
    n, e = csr.num_dst, csr.num_edges
    used = int(torch.count_nonzero(torch.bincount(csr.col.long(), minlength=csr.num_src)))
    per_edge = e * f * itemsize + n * f * itemsize + e * 8 + n * 8
    minimum = (used * f * itemsize + n * f * itemsize + csr.rowptr.numel() * csr.rowptr.element_size()
               + e * csr.col.element_size() + (e * itemsize if weighted else 0))
    return dict(per_edge=per_edge, minimum=minimum, used_sources=used)


def cache_bytes() -> Optional[int]:
    """Bytes of every data or unified CPU cache of this machine, each shared cache counted once
    (Linux sysfs); ``None`` where sysfs does not say."""
    import glob

    seen = {}
    for d in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cache/index[0-9]*"):
        try:
            with open(f"{d}/type") as fh:
                kind = fh.read().strip()
            with open(f"{d}/level") as fh:
                level = fh.read().strip()
            with open(f"{d}/shared_cpu_list") as fh:
                shared = fh.read().strip()
            with open(f"{d}/size") as fh:
                size = fh.read().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:].upper(), 1)
        seen[(level, shared)] = int(size.rstrip("KMGkmg")) * unit
    return sum(seen.values()) or None


def hot_set_fraction(col: torch.Tensor, num_src: int, rows: int) -> float:
    """Fraction of the edges (entries of ``col``) whose source is among the ``rows`` most used
    sources: the most a cache of ``rows`` rows can serve when edges are drawn independently."""
    if col.numel() == 0:
        return 0.0
    counts = torch.bincount(col.long(), minlength=num_src)
    k = max(0, min(int(rows), num_src))
    return float(counts.topk(k).values.sum()) / col.numel() if k else 0.0


class RowReadFloor(torch.autograd.Function):
    """The row gather alone (the extension's ``csr_row_read``): forward reads every edge's source
    row over ``(rowptr, col)``, backward over the transposed ``(t_rowptr, t_col)``; nothing is
    written, and the input comes back unchanged (its gradient too). Times what a kernel that
    reads one row per edge in this order needs at least on this machine."""

    @staticmethod
    def forward(ctx, x, rowptr, col, t_rowptr, t_col):
        from lightning_fullgraph.kernels import cpp

        ctx.mod = cpp.load()
        ctx.transposed = (t_rowptr, t_col)
        ctx.mod.csr_row_read(rowptr, col, x.contiguous())
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        ctx.mod.csr_row_read(*ctx.transposed, grad)
        return grad, None, None, None, None


class _OtherKernel(torch.autograd.Function):
    """An unweighted sum with another build's ``csr_sum`` (``--baseline``): forward over
    ``(rowptr, col)``, backward over the transposed CSR, as ours."""

    @staticmethod
    def forward(ctx, x, mod, rowptr, col, t_rowptr, t_col):
        ctx.mod, ctx.transposed = mod, (t_rowptr, t_col)
        return mod.csr_sum(rowptr, col, None, x.contiguous(), False)

    @staticmethod
    def backward(ctx, grad):
        return ctx.mod.csr_sum(*ctx.transposed, None, grad.contiguous(), False), None, None, None, None, None


def kernel_at(rev: str):
    """The C++ kernels as they were at git revision ``rev`` of this repository (``csrc/`` at that
    revision), compiled into an extension of their own beside ours (cached by source hash under
    the kernels' build directory). Times the kernel code of ``rev`` on the same CSR, input and
    process as ours (``--baseline``): what the code changed, not the environment."""
    import hashlib
    import subprocess
    from pathlib import Path

    from torch.utils.cpp_extension import load

    from lightning_fullgraph.kernels import cpp

    repo = Path(__file__).resolve().parents[1]

    def show(path: str) -> Optional[str]:
        out = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=repo, capture_output=True, text=True)
        return out.stdout if out.returncode == 0 else None

    main = show("csrc/aggregate.cpp")
    if main is None:
        raise SystemExit(f"--baseline {rev}: this repository has no csrc/aggregate.cpp at that revision")
    files = {"aggregate.cpp": main}
    if '"huge_pages.h"' in main:  # later revisions compile the allocator beside it
        for extra in ("huge_pages.cpp", "huge_pages.h"):
            files[extra] = show(f"csrc/{extra}") or ""
    digest = hashlib.sha256("".join(files[k] for k in sorted(files)).encode()).hexdigest()[:12]
    bdir = cpp.ext_root() / f"baseline-{digest}"
    bdir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (bdir / name).write_text(text)
    print(f"# --baseline {rev}: compiling its kernels into {bdir} (cached)", file=sys.stderr, flush=True)
    return load(f"lfg_baseline_{digest}", [str(bdir / k) for k in files if k.endswith(".cpp")],
                extra_cflags=cpp._cflags(), extra_ldflags=["-fopenmp"], build_directory=str(bdir), with_cuda=False)


def row_read_floor(x: torch.Tensor, csr) -> torch.Tensor:
    """:class:`RowReadFloor` over a :class:`~lightning_fullgraph.kernels.CSRGraph` (in its own
    numbering: for a graph numbered for locality, the order the kernels read it in)."""
    return RowReadFloor.apply(x, csr.rowptr, csr.col, csr.t_rowptr, csr.t_col)


# --------------------------------------------------------------------------- methods


def _prepared_input(transform: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """``x -> transform(x)``, made once per input (the forward's ``x`` and the fwd+bwd's leaf
    ``xg`` of one width; untimed after the warm-up) and, for a leaf, a leaf itself whose
    gradient is reset on every call as :func:`_fwd_bwd` does for ``xg``."""
    made: Dict[tuple, torch.Tensor] = {}

    def prepared(x: torch.Tensor) -> torch.Tensor:
        key = (id(x), x.data_ptr(), tuple(x.shape), x.requires_grad)
        if key not in made:
            if len(made) >= 2:
                made.clear()
            out = transform(x.detach())
            made[key] = out.requires_grad_() if x.requires_grad else out
        out = made[key]
        out.grad = None
        return out

    return prepared


def make_methods(edge_index: torch.Tensor, n: int, baseline: Optional[str] = None):
    """Return ``{name: forward(x) -> out}`` closures over the graph (setup excluded);
    ``baseline``: also ``kernel_at_<rev>`` (:func:`kernel_at`)."""
    import torch_geometric.nn as gnn

    import lightning_fullgraph.kernels as K

    class PlainSum(gnn.MessagePassing):  # PyG's default gather/scatter path
        def __init__(self):
            super().__init__(aggr="sum")

        def forward(self, x, ei):
            return self.propagate(ei, x=x)

    pyg_layer = PlainSum()
    methods: Dict[str, Callable] = {"pyg": lambda x: pyg_layer(x, edge_index)}

    csr = K.get_csr(edge_index, n, n)  # ours (in a node order for locality when the kernels pick one)
    own = K.build_csr(edge_index, n, n)  # the graph's own node order, for the other contenders
    a = torch.sparse_csr_tensor(own.rowptr, own.col.long(), torch.ones(own.num_edges), (n, n))
    methods["sparse_csr_mm"] = lambda x: torch.sparse.mm(a, x)

    try:  # optional
        import torch_scatter  # noqa: F401

        col_long = own.col.long()
        methods["torch_scatter"] = lambda x: torch_scatter.segment_csr(x.index_select(0, col_long), own.rowptr,
                                                                       reduce="sum")
    except ImportError:
        pass

    methods["ours"] = lambda x: K.aggregate(x, edge_index, None, "sum", n, backend="auto")
    if csr.order is not None:
        # The same kernels on the graph's own node order (the CSR get_csr would build with
        # K.set_locality("off")): what the reordering gains, net of its two row permutations.
        methods["ours_own_order"] = lambda x: K.aggregate(x, own, None, "sum", n, backend="auto")
        # The kernels alone in that order, rows already permuted (once per input, untimed after
        # the warm-up): what an order kept by the caller (e.g. stored with a partition) would
        # give, without aggregate's two row permutations.
        import dataclasses

        raw = dataclasses.replace(csr, order=None)
        permuted = _prepared_input(lambda x: x.index_select(0, csr.order.src_perm))

        def kernel_only(x):
            return K.aggregate(permuted(x), raw, None, "sum", n, backend="auto")

        methods["ours_kernel_in_order"] = kernel_only

    def fresh_views(x):
        # Ours on new views of the same CSR arrays every call: the ops recognise validated
        # tensors by identity, so each call (forward and backward) runs the full validation
        # pass, without evicting what "ours" validated. The difference to "ours" is the
        # cost of validating at the op boundary on every call.
        g = K.CSRGraph(csr.rowptr.view(-1), csr.col.view(-1), csr.perm, csr.t_rowptr.view(-1), csr.t_col.view(-1),
                       csr.t_perm.view(-1), csr.num_src, csr.num_dst, csr.order)
        return K.aggregate(x, g, None, "sum", n, backend="auto")

    methods["ours_check_every_call"] = fresh_views

    from lightning_fullgraph.kernels import cpp

    if cpp.load() is not None:  # the floor under ours' kernel (see the module docstring)
        methods["row_read_floor"] = lambda x: row_read_floor(x, csr)
    if baseline:
        other = kernel_at(baseline)
        methods[f"kernel_at_{baseline}"] = lambda x: _OtherKernel.apply(x, other, csr.rowptr, csr.col, csr.t_rowptr,
                                                                        csr.t_col)

    # Ours on bfloat16 rows (mixed precision: what a layer's linear map gives under
    # autocast), summed in float32, a bfloat16 output; the copy of x (and of the fwd+bwd
    # leaf, whose gradient is bfloat16 too) is made once per input, untimed after the warm-up.
    halves = _prepared_input(lambda x: x.to(torch.bfloat16))

    def bf16_rows(x):
        return K.aggregate(halves(x), csr, None, "sum", n, backend="auto")

    methods["ours_bf16"] = bf16_rows
    return methods


def _validation_pass_times(csr, repeats: int) -> Optional[List[float]]:
    """Wall times of the C++ validation pass alone (``check_csr``, never cached)."""
    from lightning_fullgraph.kernels import cpp

    mod = cpp.load()
    if mod is None or not hasattr(mod, "check_csr"):
        return None
    return timeit(lambda: mod.check_csr(csr.rowptr, csr.col, csr.num_src), repeats, 1)


def _fwd_bwd(fn: Callable, xg: torch.Tensor, grad: torch.Tensor) -> None:
    out = fn(xg)
    out.backward(grad.to(out.dtype))
    xg.grad = None


def bench_case(name: str, spec, features: List[int], args) -> Tuple[List[dict], dict]:
    import gc

    import lightning_fullgraph.kernels as K

    n, e, s_skew, d_skew = spec
    t = time.perf_counter()
    ei = make_graph(spec, args.seed)
    n, e = (int(round(n ** 0.5)) ** 2 if s_skew == "torus" else n), ei.size(1)
    gen_s = time.perf_counter() - t
    t = time.perf_counter()
    csr = K.get_csr(ei, n, n)  # one-off CSR + transpose build (+ node order), cached afterwards
    csr_s = time.perf_counter() - t
    order = csr.order
    own_score = order.score_before if order else K.locality_score(ei[0], ei[1])
    locality_info = dict(locality_mode=K.get_locality(), reordered=order is not None, locality_score_own=own_score,
                         locality_score_used=order.score_after if order else own_score,
                         order_seconds=order.seconds if order else None)
    max_in = int(torch.bincount(ei[1], minlength=n).max())
    bw = bandwidths(repeats=max(args.repeats, 5))
    vpass = best_median(_validation_pass_times(csr, max(args.repeats, 5)))
    info = dict(case=name, nodes=n, edges=e, max_in_degree=max_in, generate_s=gen_s, csr_build_s=csr_s,
                validation_pass_best_s=vpass[0], validation_pass_median_s=vpass[1], threads=bw["threads"],
                load_avg=bw["load_avg"], copy_best_gbs=bw["copy_best"] / 1e9, copy_median_gbs=bw["copy_median"] / 1e9,
                read_best_gbs=bw["read_best"] / 1e9, read_median_gbs=bw["read_median"] / 1e9, **locality_info)
    print(f"# case {name}: N={n:,} E={e:,} max in-degree {max_in:,}; generate {gen_s:.1f}s, CSR build {csr_s:.1f}s "
          f"(locality score {own_score:.2f}" + (f" -> {order.score_after:.2f} in BFS order, {order.seconds:.1f}s)"
                                                if order else ", own order kept)") + "; "
          f"load {bw['load_avg'][0]:.2f}, {bw['threads']} threads: copy {bw['copy_best'] / 1e9:.1f} GB/s, "
          f"read {bw['read_best'] / 1e9:.1f} GB/s (best; median {bw['copy_median'] / 1e9:.1f} / "
          f"{bw['read_median'] / 1e9:.1f})" + (f"; validation pass {vpass[0] * 1e3:.1f} ms" if vpass[0] else ""),
          flush=True)
    methods = {k: v for k, v in make_methods(ei, n, args.baseline).items()
               if k in args.methods or k.startswith("kernel_at_")}
    caches = cache_bytes()
    random_graph = s_skew != "torus"  # edges drawn independently: the hot-set bound applies
    rows = []
    for f in features:
        x = torch.randn(n, f)
        xg = x.clone().requires_grad_()
        grad = torch.randn(n, f)
        models = byte_models(csr, f)
        models_bf16 = byte_models(csr, f, itemsize=2)
        hot_rows = caches // (f * 4) if caches else None
        hot = hot_set_fraction(csr.col, csr.num_src, hot_rows) if hot_rows and random_graph else None
        # Bandwidths again for this F, right before its timings (the load moves).
        bwf = bandwidths(repeats=5)
        bwf["gather"] = random_row_read(x, repeats=3)
        active = []
        for mname, fn in methods.items():
            m = models_bf16 if mname.endswith("_bf16") else models
            row = dict(case=name, nodes=n, edges=e, F=f, method=mname, repeats=args.repeats, warmup=1,
                       per_edge_bytes=m["per_edge"], minimum_bytes=m["minimum"],
                       used_sources=models["used_sources"], threads=bwf["threads"],
                       copy_best_gbs=bwf["copy_best"] / 1e9, read_best_gbs=bwf["read_best"] / 1e9,
                       torch_gather_gbs=bwf["gather"] / 1e9, load_avg_before=os.getloadavg()[0],
                       cache_bytes=caches, hot_set_rows=hot_rows, hot_set_fraction=hot, **locality_info)
            # Gather/scatter paths materialise E x F messages (and their gradient in
            # backward); skip what cannot fit in the memory available right now (with
            # headroom: the machine may be shared).
            msg_bytes = e * f * 4 if mname in ("pyg", "torch_scatter") else 0
            dense = 3 * n * f * 4
            if 1.3 * msg_bytes + dense >= mem_available():
                row.update(note="skipped: E*F message tensor exceeds free memory")
            else:
                can_bwd = 2.3 * msg_bytes + dense < mem_available()
                if not can_bwd:
                    row["note"] = "fwd+bwd skipped: 2 x E*F tensors exceed free memory"
                active.append((mname, fn, row, can_bwd))
            rows.append(row)

        # One warm-up each, then R rounds in which every contender runs once (round robin:
        # load from other jobs falls on all of them alike, and no contender always runs
        # right after another's large allocations).
        for _, fn, _, can_bwd in active:
            fn(x)
            if can_bwd:
                _fwd_bwd(fn, xg, grad)
        times = {m: ([], []) for m, *_ in active}
        for _ in range(args.repeats):
            for mname, fn, _, _ in active:
                t = time.perf_counter()
                fn(x)
                times[mname][0].append(time.perf_counter() - t)
        for _ in range(args.repeats):
            for mname, fn, _, can_bwd in active:
                if can_bwd:
                    t = time.perf_counter()
                    _fwd_bwd(fn, xg, grad)
                    times[mname][1].append(time.perf_counter() - t)
        for mname, _, row, _ in active:
            fwd, fb = times[mname]
            (f_best, f_med), (fb_best, fb_med) = best_median(fwd), best_median(fb)
            row.update(fwd_best_s=f_best, fwd_median_s=f_med, fwd_times_s=fwd, fwd_bwd_best_s=fb_best,
                       fwd_bwd_median_s=fb_med, fwd_bwd_times_s=fb or None, load_avg_after=os.getloadavg()[0])
            for model in ("per_edge", "minimum"):
                gbs = row[f"{model}_bytes"] / f_best / 1e9
                row[f"{model}_gbs"] = gbs
                row[f"{model}_pct_copy"] = 100 * gbs / row["copy_best_gbs"]
                row[f"{model}_pct_read"] = 100 * gbs / row["read_best_gbs"]
        add_floor_ratios([r for r in rows if r["F"] == f])
        print(f"# F={f}: load {bwf['load_avg'][0]:.2f}, copy {bwf['copy_best'] / 1e9:.1f} GB/s, read "
              f"{bwf['read_best'] / 1e9:.1f} GB/s (best of 5, {bwf['threads']} threads); torch index_select of "
              f"random rows {bwf['gather'] / 1e9:.1f} GB/s", flush=True)
        for row in rows:
            if row["F"] == f:
                print(_fmt_row(row), flush=True)
        del x, xg, grad
        gc.collect()
        from lightning_fullgraph.kernels import cpp

        if cpp._module is not None:
            cpp._module.clear_pool()  # idle pooled outputs of this width back to the OS
    # speed-ups of ours vs the others, per F (best vs best)
    for f in features:
        ours = next((r for r in rows if r["F"] == f and r["method"] == "ours" and r.get("fwd_best_s")), None)
        if ours is None:
            continue
        for r in rows:
            if r["F"] == f and r.get("fwd_best_s") and r["method"] != "ours":
                r["ours_speedup_fwd"] = r["fwd_best_s"] / ours["fwd_best_s"]
                if r.get("fwd_bwd_best_s") and ours.get("fwd_bwd_best_s"):
                    r["ours_speedup_fwd_bwd"] = r["fwd_bwd_best_s"] / ours["fwd_bwd_best_s"]
                print(f"# F={f}: {r['method']} / ours (best of {args.repeats}): fwd x{r['ours_speedup_fwd']:.2f}, "
                      f"fwd+bwd x{r.get('ours_speedup_fwd_bwd', float('nan')):.2f}")
    del methods, csr
    K.clear_memos()  # also returns idle pooled buffers to the OS
    return rows, info


def add_floor_ratios(group: List[dict]) -> None:
    """For one case and F: ours' time over the row-read floor's (``ours_over_floor``, forward and
    forward+backward, on ours' row), and on the floor's row the minimum-bytes share that the
    forward could reach at most if the hot set's reads were free (``reachable_minimum_pct_copy``,
    random graphs only; see the module docstring)."""
    by = {r["method"]: r for r in group if r.get("fwd_best_s")}
    ours, floor = by.get("ours"), by.get("row_read_floor")
    if not (ours and floor):
        return
    ours["ours_over_floor_fwd"] = ours["fwd_best_s"] / floor["fwd_best_s"]
    if ours.get("fwd_bwd_best_s") and floor.get("fwd_bwd_best_s"):
        ours["ours_over_floor_fwd_bwd"] = ours["fwd_bwd_best_s"] / floor["fwd_bwd_best_s"]
    h = floor.get("hot_set_fraction")
    if h is not None and h < 1:
        floor["reachable_minimum_pct_copy"] = floor["minimum_pct_copy"] / (1 - h)


HEADER = (f"{'case':>9} {'F':>4} {'method':>22} {'fwd best/med [s]':>17} {'fwd+bwd best/med [s]':>21} | "
          f"{'per-edge GB/s %copy %read':>25} | {'minimum GB/s %copy %read':>24}")


def _fmt_row(r: dict) -> str:
    head = f"{r['case']:>9} {r['F']:>4} {r['method']:>22}"
    if r.get("fwd_best_s") is None:
        return f"{head} {'-':>17} {'-':>21} | {'-':>25} | {'-':>24}  {r.get('note', '')}"
    fwd = f"{r['fwd_best_s']:.3f}/{r['fwd_median_s']:.3f}"
    fb = f"{r['fwd_bwd_best_s']:.3f}/{r['fwd_bwd_median_s']:.3f}" if r.get("fwd_bwd_best_s") else "-"
    pe = f"{r['per_edge_gbs']:7.2f} {r['per_edge_pct_copy']:5.1f}% {r['per_edge_pct_read']:5.1f}%"
    mn = f"{r['minimum_gbs']:6.2f} {r['minimum_pct_copy']:5.1f}% {r['minimum_pct_read']:5.1f}%"
    return f"{head} {fwd:>17} {fb:>21} | {pe:>25} | {mn:>24}  {r.get('note', '')}"


def markdown_table(rows: List[dict], case_info: List[dict]) -> str:
    """The README table: seconds fwd / fwd+bwd (best of R) per contender, and ours' forward
    bandwidth under both byte models against the copy and read bandwidths measured for that F."""
    methods = [m for m in ("pyg", "sparse_csr_mm", "torch_scatter", "ours", "ours_own_order", "ours_kernel_in_order",
                           "ours_check_every_call", "row_read_floor") if any(r["method"] == m for r in rows)]
    methods += list(dict.fromkeys(r["method"] for r in rows if r["method"].startswith("kernel_at_")))
    names = {"pyg": "PyG gather-scatter", "sparse_csr_mm": "`torch.sparse.mm` CSR", "torch_scatter": "torch-scatter",
             "ours": "ours", "ours_own_order": "ours, graph's own node order",
             "ours_kernel_in_order": "ours, kernel only (rows already in the order)",
             "ours_check_every_call": "ours, validating every call",
             "row_read_floor": "row reads alone (floor)"}
    names.update({m: f"the kernels at {m[len('kernel_at_'):]}" for m in methods if m.startswith("kernel_at_")})
    floors = any(r["method"] == "row_read_floor" for r in rows)
    head = ["case", "F", "load; copy / read / torch random-row GB/s"] + [names[m] for m in methods] + [
        "ours fwd, per-edge bytes: GB/s (% copy / % read)", "ours fwd, minimum bytes: GB/s (% copy / % read)"] + (
        ["ours / floor, fwd (fwd+bwd)", "minimum bytes, % copy: floor; hot set h; reachable ≤ floor / (1 - h)"]
        if floors else [])
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    keys = list(dict.fromkeys((r["case"], r["F"]) for r in rows))
    last_case = None
    for key in keys:
        group = {r["method"]: r for r in rows if (r["case"], r["F"]) == key}
        r0 = next(iter(group.values()))
        label = f"{r0['case']} {r0['nodes'] / 1e6:g}M/{r0['edges'] / 1e6:g}M" if key[0] != last_case else ""
        last_case = key[0]
        cells = [label, str(key[1]), f"{r0['load_avg_before']:.1f}; {r0['copy_best_gbs']:.1f} / "
                 f"{r0['read_best_gbs']:.1f} / {r0.get('torch_gather_gbs', float('nan')):.1f}"]
        for m in methods:
            r = group.get(m)
            if r is None or r.get("fwd_best_s") is None:
                cells.append("not run (memory)" if r is not None else "-")
                continue
            fb = f"{r['fwd_bwd_best_s']:.3f}" if r.get("fwd_bwd_best_s") else "not run (memory)"
            cells.append(f"{r['fwd_best_s']:.3f} / {fb}")
        ours = group.get("ours")
        if ours and ours.get("fwd_best_s"):
            cells += [f"{ours['per_edge_gbs']:.1f} ({ours['per_edge_pct_copy']:.0f} % / {ours['per_edge_pct_read']:.0f} %)",
                      f"{ours['minimum_gbs']:.1f} ({ours['minimum_pct_copy']:.0f} % / {ours['minimum_pct_read']:.0f} %)"]
        else:
            cells += ["-", "-"]
        if floors:
            floor = group.get("row_read_floor") or {}
            if ours and ours.get("ours_over_floor_fwd"):
                fb = ours.get("ours_over_floor_fwd_bwd")
                cells.append(f"{ours['ours_over_floor_fwd']:.2f}" + (f" ({fb:.2f})" if fb else ""))
            else:
                cells.append("-")
            if floor.get("minimum_pct_copy") is not None:
                h, reach = floor.get("hot_set_fraction"), floor.get("reachable_minimum_pct_copy")
                bound = (f"{h:.2f}; ≤ {reach:.0f} %" if reach is not None
                         else "1: every row fits in cache" if h is not None else "locality: not bounded")
                cells.append(f"{floor['minimum_pct_copy']:.0f} %; {bound}")
            else:
                cells.append("-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot(rows: List[dict], path: str) -> None:
    """Three panels against the feature width F, one line per graph (case): ours' forward
    bandwidth by minimum bytes and by per-edge bytes (% of the copy bandwidth measured right
    before that F), and ours' forward speed-up over each other contender. Where the graph was
    timed with its rows already in the locality order (``ours_kernel_in_order``), that line is
    drawn too, dashed; where the row-read floor ran on a random graph, the bound on what any
    order could reach (``reachable_minimum_pct_copy``) dotted. Written to ``path`` (PNG)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.get("fwd_best_s")]
    cases = list(dict.fromkeys(r["case"] for r in timed if r["method"] == "ours"))
    if not cases:
        return
    colors = {c: f"C{k}" for k, c in enumerate(cases)}
    label = {c: next(f"{c} {r['nodes'] / 1e6:g}M/{r['edges'] / 1e6:g}M" for r in timed if r["case"] == c)
             for c in cases}

    def series(case: str, method: str, key: str) -> Tuple[List[int], List[float]]:
        pts = sorted((r["F"], r[key]) for r in timed if r["case"] == case and r["method"] == method
                     and r.get(key) is not None)
        return [f for f, _ in pts], [v for _, v in pts]

    widths = sorted({r["F"] for r in timed})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    for ax, key, title in ((axes[0], "minimum_pct_copy", "minimum bytes (each used row read once)"),
                           (axes[1], "per_edge_pct_copy", "per-edge bytes (one row read per edge)")):
        for c in cases:
            ax.plot(*series(c, "ours", key), "o-", color=colors[c], label=label[c])
            fs, vs = series(c, "ours_kernel_in_order", key)
            if fs:
                ax.plot(fs, vs, "s--", color=colors[c], label=f"{c}, rows pre-ordered")
            fs, vs = series(c, "row_read_floor", "reachable_minimum_pct_copy")
            if fs and ax is axes[0]:
                ax.plot(fs, vs, "x:", color=colors[c], label=f"{c}: reachable (floor, hot set free)")
        if ax is axes[0]:
            ax.axhline(30, color="grey", lw=0.8, label="30 % of copy")
        ax.set_ylabel("ours, forward: % of copy bandwidth")
        ax.set_title(f"forward bandwidth by {title}", fontsize=9)
    others = [m for m in ("pyg", "sparse_csr_mm", "torch_scatter")
              if any(r.get("ours_speedup_fwd") and r["method"] == m for r in timed)]
    styles = dict(zip(others, ("o-", "^:", "v-.")))
    for c in cases:
        for m in others:
            fs, vs = series(c, m, "ours_speedup_fwd")
            if fs:
                axes[2].plot(fs, vs, styles[m], color=colors[c], label=f"{c}: {m} / ours")
    axes[2].axhline(1, color="grey", lw=0.8)
    axes[2].set_yscale("log")
    axes[2].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    axes[2].yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v:g}x" if v in (2, 3, 5, 20, 30, 50) else ""))
    axes[2].set_ylabel("forward time of contender / ours")
    axes[2].set_title("speed-up of ours, forward", fontsize=9)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlim(min(widths) / 1.3, max(widths) * 1.3)
        ax.set_xticks(widths, [str(f) for f in widths])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("feature width F (float32)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, ncol=2 if ax is axes[2] else 1)
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def replot(json_path: str, plot_path: Optional[str]) -> dict:
    """The table (and figure) again from a ``--json`` file of an earlier run, without timing."""
    with open(json_path) as fh:
        result = json.load(fh)
    rows = result.get("aggregation") or []
    if not rows:
        raise SystemExit(f"{json_path} holds no aggregation rows (was it written with --no-agg?)")
    print(markdown_table(rows, result.get("cases") or []))
    if plot_path:
        plot(rows, plot_path)
        print(f"# figure: {plot_path}")
    return result


# --------------------------------------------------------------------------- end to end


def bench_e2e(spec, args) -> List[dict]:
    import torch.nn.functional as Fn
    import torch_geometric.nn as gnn

    import lightning_fullgraph.kernels as K

    n, e, s_skew, d_skew = spec
    ei = make_graph(spec, args.seed)
    n = int(round(n ** 0.5)) ** 2 if s_skew == "torus" else n
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

    # On a graph the kernels reorder for locality (see the module docstring), also the kernels
    # in the graph's own node order: what the order gains over a whole model.
    # And the data renumbered once by LocalityOrder (a PyG transform, timed separately): the
    # kernels then need no per-call permutations.
    configs = [("off", None), ("auto", None)]
    graphs = {None: (x, ei, y), "off": (x, ei, y)}
    preorder_s = None
    if K.get_csr(ei, n, n).order is not None:
        from torch_geometric.data import Data

        from lightning_fullgraph.data import LocalityOrder

        configs += [("auto", "off"), ("auto", "preordered")]
        t = time.perf_counter()
        d = LocalityOrder()(Data(x=x, y=y, edge_index=ei, num_nodes=n))
        preorder_s = time.perf_counter() - t
        graphs["preordered"] = (d.x, d.edge_index, d.y)
        print(f"# e2e: LocalityOrder renumbered the graph in {preorder_s:.2f}s", flush=True)
    K.clear_memos()
    for model_name, conv in (("GCN", gnn.GCNConv), ("GraphSAGE", gnn.SAGEConv)):
        for backend, locality in configs:
            if backend == "off" and 2.3 * e * max(f_in, hidden) * 4 > mem_available():
                rows.append(dict(model=model_name, backend=backend, note="skipped: memory"))
                continue
            torch.manual_seed(0)
            model = Net(conv)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            gx, gei, gy = graphs[locality]

            def epoch():
                opt.zero_grad()
                loss = Fn.cross_entropy(model(gx, gei), gy)
                loss.backward()
                opt.step()

            previous = K.get_locality()
            with K.use(None if backend == "off" else backend):
                K.set_locality(previous if locality in (None, "preordered") else locality)
                load = os.getloadavg()[0]
                t = time.perf_counter()
                epoch()  # first epoch (ours: includes the one-off CSR build)
                first = time.perf_counter() - t
                times = timeit(epoch, args.e2e_epochs, 0)  # the same number for both backends
                K.set_locality(previous)
            best, med = best_median(times)
            row = dict(model=model_name, backend=backend, features=f_in, hidden=hidden, first_epoch_s=first,
                       epoch_best_s=best, epoch_median_s=med, epoch_times_s=times, load_avg_before=load,
                       locality=locality or (previous if backend != "off" else None),
                       preorder_s=preorder_s if locality == "preordered" else None)
            rows.append(row)
            label = backend + {"off": ", own order", "preordered": ", preordered"}.get(locality or "", "")
            print(f"# e2e {model_name:>9} backend={label:>15}: first epoch {first:7.2f}s, then best {best:7.2f}s / "
                  f"median {med:7.2f}s of {len(times)} (load {load:.2f})", flush=True)
            K.clear_memos()
    for model_name in ("GCN", "GraphSAGE"):
        off = next((r for r in rows if r["model"] == model_name and r["backend"] == "off" and "epoch_best_s" in r), None)
        on = next((r for r in rows if r["model"] == model_name and r["backend"] != "off" and "epoch_best_s" in r
                   and r["locality"] not in ("off", "preordered")), None)
        if off and on:
            on["speedup_vs_off"] = off["epoch_best_s"] / on["epoch_best_s"]
            print(f"# e2e {model_name}: epoch {off['epoch_best_s']:.2f}s -> {on['epoch_best_s']:.2f}s "
                  f"(x{on['speedup_vs_off']:.1f}, best of {args.e2e_epochs})")
    return rows


# --------------------------------------------------------------------------- main


def main(argv: Optional[List[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small graphs, F in {16, 128}, fast")
    p.add_argument("--cases", nargs="+", default=None, help=f"subset of {list(CASES)}")
    p.add_argument("--features", nargs="+", type=int, default=None,
                   help=f"feature widths for every case (default per case: {CASE_FEATURES})")
    p.add_argument("--methods", nargs="+",
                   default=["pyg", "sparse_csr_mm", "torch_scatter", "ours", "ours_own_order", "ours_kernel_in_order",
                            "ours_check_every_call", "ours_bf16", "row_read_floor"])
    p.add_argument("--baseline", metavar="REV", default=None,
                   help="also time the C++ kernels of git revision REV of this repository (contender kernel_at_REV: "
                        "the same CSR, input and process as ours)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per contender (after one warm-up), all alike")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-e2e", action="store_true", help="skip the end-to-end GCN/GraphSAGE epochs")
    p.add_argument("--no-agg", action="store_true", help="skip the aggregation table (end-to-end only)")
    p.add_argument("--e2e-case", default="powerlaw")
    p.add_argument("--e2e-features", type=int, default=128)
    p.add_argument("--e2e-hidden", type=int, default=128)
    p.add_argument("--e2e-epochs", type=int, default=2)
    p.add_argument("--json", default=None, help="write the JSON result to this file (default: kernels-<time>.json "
                   "in the results directory, see --out)")
    add_out_argument(p)
    p.add_argument("--plot", default=None, help="write the bandwidth / speed-up figure (PNG) to this file")
    p.add_argument("--no-print-json", action="store_true", help="do not print the JSON result")
    p.add_argument("--replot", metavar="JSON", default=None,
                   help="time nothing: print the table (and write --plot) from an earlier run's --json file")
    args = p.parse_args(argv)
    if args.replot:
        return replot(args.replot, args.plot)

    import lightning_fullgraph.kernels as K

    cases = QUICK_CASES if args.quick else CASES
    names = args.cases or list(cases)
    t = time.perf_counter()
    have_cpp = K.cpp_available()
    build_s = time.perf_counter() - t
    info = dict(python=sys.version.split()[0], torch=torch.__version__, threads=torch.get_num_threads(),
                cpus=os.cpu_count(), cpu=platform.processor() or platform.machine(), cpp_available=have_cpp,
                ext_load_s=build_s, thp_mem_alloc=os.environ.get("THP_MEM_ALLOC_ENABLE", "0"),
                huge_pages=K.huge_pages_info(), quick=args.quick,
                repeats=args.repeats, warmup=1, argv=sys.argv[1:] if argv is None else list(argv),
                load_avg_start=os.getloadavg())
    print(f"# torch {torch.__version__}, {info['threads']} threads on {info['cpus']} CPUs, load average "
          f"{info['load_avg_start'][0]:.2f}, cpp kernels: {have_cpp} (load {build_s:.1f}s), "
          f"THP_MEM_ALLOC_ENABLE={info['thp_mem_alloc']}, huge-page allocator: "
          f"{'on' if info['huge_pages']['active'] else 'off'}; every contender: 1 warm-up + best/median of "
          f"{args.repeats}")
    rows: List[dict] = []
    case_info: List[dict] = []
    e2e: List[dict] = []
    result = dict(machine=info, cases=case_info, aggregation=rows, end_to_end=e2e)

    json_path = args.json or str(result_path("kernels", args.out))

    def save() -> None:  # after every case, so a late OOM kill keeps the earlier results
        with open(json_path, "w") as fh:
            json.dump(result, fh, indent=1)

    if not args.no_agg:
        print(HEADER)
    for name in ([] if args.no_agg else names):
        features = args.features or (QUICK_FEATURES if args.quick else CASE_FEATURES.get(name, [128]))
        r, ci = bench_case(name, cases[name], features, args)
        rows += r
        case_info.append(ci)
        save()
    if not args.no_e2e:
        e2e += bench_e2e(cases[args.e2e_case], args)
    info["load_avg_end"] = os.getloadavg()
    if rows:
        print(markdown_table(rows, case_info))
        if args.plot:
            plot(rows, args.plot)
            print(f"# figure: {args.plot}")
    if not args.no_print_json:
        print(json.dumps(result, indent=1))
    save()
    print(f"# result: {json_path}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
