"""Benchmark of unmodified PyG layers (GCNConv, SAGEConv) with and without our kernels, against free aggregation.

Usage::

    python -m benchmarks layers                                    # 500k nodes / 8M edges, F=128
    python -m benchmarks layers --nodes 20000 --edges 200000 --repeats 1   # tiny smoke run
    python -m benchmarks layers --layers sage --json out.json --no-profile

For each layer (``GCNConv(F, F)``, ``SAGEConv(F, F)``, as PyG ships them) one *step* is a
forward and a backward with a fixed random upstream gradient::

    out = conv(x, edge_index); out.backward(g); x.grad = None; conv.zero_grad(set_to_none=True)

timed for four variants, each with one warm-up step and then R steps, round robin (every
round runs each variant once, so load from other jobs falls on all of them alike), best and
median of R:

* ``pyg``: PyG's default gather/scatter path (backend off);
* ``ours``: the same layer under ``lightning_fullgraph.kernels.use("auto")``;
* ``no_aggregation``: backend off and the layer instance's ``propagate`` replaced by one that
  returns its source features unchanged (``N_dst == N_src`` here), i.e. aggregation at zero
  cost. Everything else the layer does stays: GCN's ``gcn_norm`` (self-loops, degrees, edge
  weights), the linear layers, the bias, SAGE's root-weight ``lin_r`` and the add.
* ``no_aggregation_ours``: the same free ``propagate``, inside the forward the kernels give the
  layer (``kernels.accelerate``): GCN's normalization memoized (``kernels.gcn``), SAGE's root
  term accumulated (``kernels.sage``) -- the dense side as it runs with the kernels. One
  difference stays: GCN's bias goes into the kernels' fresh aggregation in place, but the free
  ``propagate`` returns the linear layer's output, to which it is added out of place.
* ``row_read_floor``: as ``no_aggregation_ours``, but the stand-in ``propagate`` reads every
  edge's source row as the kernels would, forward over the layer's CSR and backward over its
  transpose, and writes nothing (``row_read_floor`` of ``benchmarks/kernels.py``: the C++
  kernels' gather without output; GCN's edge weights, 4 bytes an edge, are not read). Its time is the step of a layer
  whose aggregation took only the reading of its rows: no kernel that reads one source row per
  edge in this order can make ``ours`` faster than that on this machine.

Reported per layer: ``speedup = pyg / ours``; the Amdahl ceiling ``pyg / no_aggregation``
(the speedup if aggregation took no time at all); and the fraction of that ceiling reached,
``speedup / ceiling = no_aggregation / ours``; the same two against ``no_aggregation_ours``
(``ceiling_ours_dense``, ``fraction_of_ceiling_ours_dense``): the ceiling raised by the
kernels' dense side, and how close the aggregation lets the layer come to it; and
``fraction_of_ceiling_at_floor = no_aggregation / row_read_floor``, the fraction of the ceiling
a layer would reach if its aggregations took no more than reading their rows; and
``fraction_of_ceiling_bound``, the same if moreover the reads of the rows a cache of this
machine's size could hold (``hot_set_fraction``, see ``benchmarks/kernels.py``) cost nothing:
for a graph whose edges are drawn independently, as here, no order of them does better. The warm-up step doubles as a correctness
check: ``ours``' output and gradients are compared with ``pyg``'s (max abs diff in the JSON).
One further step of each variant runs under ``torch.profiler``; its ops' *self* CPU times
are summed into categories (aggregation / dense / other, by op name, see ``categorize``)
and the top ops are listed. For the dense side, ``torch.mm`` alone on the same shapes
(forward and weight-gradient products) gives what a linear layer's forward + backward takes
at least with this torch (JSON ``dense_reference``).

PyG's path materialises ``E x F`` messages (8M x 128 x 4 B = 4 GB) in forward and again in
backward; it is skipped, with a note, when that does not fit in the memory available.

``--autocast bf16`` runs every step (and the ``torch.mm`` reference) under
``torch.autocast("cpu", dtype=torch.bfloat16)``, what Lightning's ``precision="bf16-mixed"``
does: the linear layers then run in bfloat16, and GCN aggregates their bfloat16 output
(with float32 edge weights, so its sums are float32, as in PyG). Outputs are compared with
PyG's within ``CHECK_TOL_AMP``.

Huge pages: the script loads the C++ kernels first, which installs their huge-page CPU
allocator (see ``benchmarks/kernels.py``), so PyG's path and ours both run with large tensors
in transparent huge pages; ``LIGHTNING_FULLGRAPH_HUGE_PAGES=0`` measures both in 4 KiB pages.
The JSON records which was in effect.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import Tensor

import lightning_fullgraph.kernels as K

from ._common import add_out_argument, best_median, result_path, timeit
from .kernels import cache_bytes, hot_set_fraction, mem_available, power_law_graph, row_read_floor

VARIANTS = ("pyg", "ours", "no_aggregation", "no_aggregation_ours", "row_read_floor")
LAYERS = ("gcn", "sage")

# Profiler categories, matched against op names. Aggregation: our ops and PyG's gather /
# scatter primitives (including their backward ops: index_add_, gather, ...). "lightning_fullgraph"
# matches every op of ours (csr_sum, csr_sum_raw, permute_values) and also the
# autograd.Function record of each custom op ("GeneratedBackwardFor_lightning_fullgraph_csr_sum_default"):
# the forward kernel runs inside that record, so its self time *is* the forward aggregation.
# Not counted: element-wise passes around aggregation (PyG's E x F message multiply in GCN,
# mean's division by the degree) land in "other"; GCN's gcn_norm scatters its degrees, so a
# little of it lands in "aggregation", in all three variants alike.
AGGREGATION_KEYS = ("lightning_fullgraph", "scatter", "index_add", "segment", "index_select", "gather")
DENSE_OPS = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm")
TOP_OPS = 8
CHECK_TOL = 1e-4
CHECK_TOL_AMP = 2.0 ** -6  # bfloat16 has 8 significant bits; sums in another order


def autocast(args: argparse.Namespace):
    """The mixed-precision context of ``--autocast`` (a no-op context without it)."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=getattr(args, "autocast", "none") == "bf16")


# --------------------------------------------------------------------------- layers and variants


def make_layer(name: str, features: int) -> torch.nn.Module:
    """A freshly initialised, unmodified PyG layer ``F -> F``."""
    from torch_geometric.nn import GCNConv, SAGEConv

    return {"gcn": GCNConv, "sage": SAGEConv}[name](features, features)


class _FreePropagate:
    """Stand-in for ``MessagePassing.propagate`` that skips aggregation.

    Returns the source features it was given (``x`` or ``x[0]`` for SAGE's ``(x_src, x_dst)``
    tuple): the right shape because every graph here is square, free, and still
    differentiable, so backward flows through the dense part as with real aggregation.
    """

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, edge_index: Tensor, size: Optional[Tuple[int, int]] = None, **kwargs: Any) -> Tensor:
        x = kwargs["x"]
        x_src, x_dst = (x[0], x[1]) if isinstance(x, (tuple, list)) else (x, x)
        n_dst = size[1] if size is not None else (x_dst if x_dst is not None else x_src).size(0)
        if x_src.size(0) != n_dst:  # would silently change the layer's output shape
            raise ValueError(f"no_aggregation needs N_src == N_dst, got {x_src.size(0)} and {n_dst}")
        self.calls += 1
        return x_src


class _FloorPropagate(_FreePropagate):
    """:class:`_FreePropagate` that first reads every edge's source row, as the kernels would,
    over the CSR of the ``edge_index`` it gets (the kernels' cached one), and over its transpose
    in backward (``row_read_floor`` of ``benchmarks/kernels.py``)."""

    csr = None  # the structure read in the last call

    def __call__(self, edge_index: Tensor, size: Optional[Tuple[int, int]] = None, **kwargs: Any) -> Tensor:
        x_src = super().__call__(edge_index, size, **kwargs)
        self.csr = K.get_csr(edge_index, x_src.size(0), x_src.size(0))
        return row_read_floor(x_src, self.csr)


_MISSING = object()


@contextmanager
def free_aggregation(conv: torch.nn.Module, floor: bool = False) -> Iterator[_FreePropagate]:
    """Replace ``conv``'s per-instance ``propagate`` by :class:`_FreePropagate` (``floor``:
    :class:`_FloorPropagate`), restored on exit."""
    saved = conv.__dict__.get("propagate", _MISSING)
    fake = _FloorPropagate() if floor else _FreePropagate()
    conv.__dict__["propagate"] = fake  # instance attribute shadows the class's (jinja) propagate
    try:
        yield fake
    finally:
        if saved is _MISSING:
            del conv.__dict__["propagate"]
        else:
            conv.__dict__["propagate"] = saved


@contextmanager
def variant(name: str, conv: torch.nn.Module) -> Iterator[None]:
    """Run the enclosed steps as variant ``name`` (see the module docstring)."""
    with ExitStack() as stack:
        # use(None) also removes the wrappers use("auto") installed, so pyg and
        # no_aggregation see the layer exactly as PyG ships it.
        stack.enter_context(K.use("auto" if name == "ours" else None))
        if name in ("no_aggregation_ours", "row_read_floor"):
            # The kernels' forward, pinned on this layer (no global hook that would wrap the
            # free propagate below); reverted on exit.
            stack.enter_context(K.accelerate(conv, backend="auto"))
        if name.startswith("no_aggregation") or name == "row_read_floor":
            stack.enter_context(free_aggregation(conv, floor=name == "row_read_floor"))
        yield


def step(conv: torch.nn.Module, x: Tensor, edge_index: Tensor, g: Tensor) -> None:
    """One timed step: forward, backward, gradients dropped (not accumulated)."""
    out = conv(x, edge_index)
    out.backward(g.to(out.dtype))
    x.grad = None
    conv.zero_grad(set_to_none=True)


def checked_step(conv: torch.nn.Module, x: Tensor, edge_index: Tensor, g: Tensor) -> Dict[str, Tensor]:
    """:func:`step` that keeps the output and all gradients (the warm-up, compared across variants)."""
    out = conv(x, edge_index)
    out.backward(g.to(out.dtype))
    result = {"out": out.detach().float(), "x.grad": x.grad}
    result.update({f"{n}.grad": p.grad for n, p in conv.named_parameters() if p.grad is not None})
    x.grad = None
    conv.zero_grad(set_to_none=True)
    return result


def compare(ours: Dict[str, Tensor], ref: Dict[str, Tensor], tol: float = CHECK_TOL) -> Dict[str, dict]:
    """Per tensor: max abs difference, the reference's max abs value, and whether the difference
    is within :obj:`tol` of ``max(1, max|ref|)`` (weight gradients sum over all N rows, so
    their size, and fp32's rounding in a different summation order, grows with N)."""
    out = {}
    for key, ref_t in ref.items():
        diff = float((ours[key].double() - ref_t.double()).abs().max())
        scale = float(ref_t.abs().max())
        out[key] = dict(max_abs_diff=diff, max_abs_ref=scale, ok=diff <= tol * max(1.0, scale))
    return out


def pyg_bytes(layer: str, n: int, e: int, f: int) -> float:
    """Peak bytes of PyG's fwd+bwd: ~2 live ``E x F`` tensors (+ headroom) and a few ``N x F``."""
    e_eff = e + n if layer == "gcn" else e  # gcn_norm adds (up to) N self-loops
    return 2.3 * e_eff * f * 4 + 8 * n * f * 4


# --------------------------------------------------------------------------- profile


def categorize(op: str) -> str:
    if any(k in op for k in AGGREGATION_KEYS):
        return "aggregation"
    if op in DENSE_OPS:
        return "dense"
    return "other"


def profile_step(fn: Callable[[], None]) -> dict:
    """Self CPU seconds per category and the top ops of one call of ``fn``.

    Self times do not double count nested ops, so the categories add up to the profiled
    CPU time (Python overhead lands on the enclosing op, e.g. an autograd node).
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        fn()
        wall = time.perf_counter() - t
    events = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()]
    cats = {"aggregation": 0.0, "dense": 0.0, "other": 0.0}
    for name, self_s, _ in events:
        cats[categorize(name)] += self_s
    total = sum(cats.values())
    top = sorted(events, key=lambda ev: -ev[1])[:TOP_OPS]
    return dict(wall_s=wall, self_total_s=total, categories_s=cats,
                categories_pct={k: 100 * v / total if total else 0.0 for k, v in cats.items()},
                top=[dict(op=n, self_s=s, calls=c, category=categorize(n)) for n, s, c in top],
                our_ops=sorted({n for n, _, _ in events if n.startswith("lightning_fullgraph::")}))


# --------------------------------------------------------------------------- one layer


def bench_layer(layer: str, edge_index: Tensor, n: int, args: argparse.Namespace) -> dict:
    e, f = edge_index.size(1), args.features
    torch.manual_seed(args.seed)
    conv = make_layer(layer, f)
    gen = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(n, f, generator=gen).requires_grad_()
    g = torch.randn(n, f, generator=gen)
    row: Dict[str, Any] = dict(layer=layer, module=repr(conv), nodes=n, edges=e, features=f, repeats=args.repeats,
                               warmup=1, autocast=args.autocast, load_avg_before=os.getloadavg(), variants={})
    tol = CHECK_TOL_AMP if args.autocast == "bf16" else CHECK_TOL
    active = list(VARIANTS)
    row["variants"] = {name: {} for name in VARIANTS}
    if not K.cpp_available():  # the floor is the C++ kernels' gather
        active.remove("row_read_floor")
        row["variants"]["row_read_floor"]["note"] = "row_read_floor skipped: no C++ kernels"
    need, avail = pyg_bytes(layer, n, e, f), mem_available()
    if need >= avail:  # with headroom: the machine may be shared
        active.remove("pyg")
        row["variants"]["pyg"]["note"] = (f"pyg skipped: E x F messages need ~{need / 2**30:.1f} GiB, "
                                          f"{avail / 2**30:.1f} GiB available")

    # Warm-up: one checked step each (ours also builds its CSR here, once per graph).
    results = {}
    for name in active:
        with variant(name, conv), autocast(args):
            t = time.perf_counter()
            results[name] = checked_step(conv, x, edge_index, g)
            row["variants"][name]["first_step_s"] = time.perf_counter() - t
            if name == "ours":
                row["ours_wrapped"] = K.is_accelerated(conv)
            if name.startswith("no_aggregation") or name == "row_read_floor":
                row[f"{name}_calls"] = conv.propagate.calls  # 1: the stand-in really ran
            if name == "row_read_floor":
                row["hot_set_fraction"] = layer_hot_set(conv.propagate.csr, f)
    if "pyg" in results and "ours" in results:
        check = compare(results["ours"], results["pyg"], tol)
        row["check_ours_vs_pyg"] = check
        row["check_ok"] = all(c["ok"] for c in check.values())
        for key, c in check.items():
            if not c["ok"]:
                print(f"# WARNING {layer}: ours' {key} differs from pyg's by {c['max_abs_diff']:.3g} "
                      f"(max |pyg| {c['max_abs_ref']:.3g}, tolerance {tol:g} relative)", flush=True)
    del results

    # Timed rounds. Leaving use("auto") removes the layer's kernel wrapper and the next ours
    # step reinstalls it in a forward pre-hook (a dict lookup and a closure: microseconds).
    times: Dict[str, List[float]] = {name: [] for name in active}
    cache_before = K.memo_info()
    for _ in range(args.repeats):
        for name in active:
            with variant(name, conv), autocast(args):
                times[name] += timeit(lambda: step(conv, x, edge_index, g), 1, 0)
    # Misses here would mean ours rebuilt its CSR inside the timed steps (a cache bug).
    row["csr_cache_misses_timed"] = K.memo_info()["misses"] - cache_before["misses"]
    for name in active:
        best, med = best_median(times[name])
        row["variants"][name].update(best_s=best, median_s=med, times_s=times[name])

    if not args.no_profile:
        row["profile"] = {}
        for name in active:
            with variant(name, conv), autocast(args):
                row["profile"][name] = profile_step(lambda: step(conv, x, edge_index, g))
        ours_ops = row["profile"].get("ours", {}).get("our_ops", [])
        if "ours" in active and not any(op.startswith("lightning_fullgraph::csr_sum") for op in ours_ops):
            print(f"# WARNING {layer}: the ours step ran no lightning_fullgraph::csr_sum op", flush=True)
    row["load_avg_after"] = os.getloadavg()
    add_ratios(row)
    return row


def layer_hot_set(csr, features: int) -> Optional[float]:
    """The most a cache of this machine's size could serve of the rows a step reads: the mean,
    over forward (sources, ``col``) and backward (destinations, ``t_col``; as many edges), of
    the fraction of edges whose row is among the ``cache_bytes() / (F * 4)`` most used (see
    ``benchmarks/kernels.py``: a bound for graphs whose edges are drawn independently)."""
    caches = cache_bytes()
    if not caches or csr is None:
        return None
    rows = caches // (features * 4)
    return (hot_set_fraction(csr.col, csr.num_src, rows) + hot_set_fraction(csr.t_col, csr.num_dst, rows)) / 2


def add_ratios(row: dict) -> None:
    """speedup, Amdahl ceiling and fraction of it, from the best times (None where a variant is missing)."""
    v = {k: r.get("best_s") for k, r in row["variants"].items()}
    pyg, ours, free = v.get("pyg"), v.get("ours"), v.get("no_aggregation")
    free_ours = v.get("no_aggregation_ours")
    row["speedup"] = pyg / ours if pyg and ours else None
    row["ceiling"] = pyg / free if pyg and free else None
    row["fraction_of_ceiling"] = free / ours if free and ours else None
    row["ceiling_ours_dense"] = pyg / free_ours if pyg and free_ours else None
    row["fraction_of_ceiling_ours_dense"] = free_ours / ours if free_ours and ours else None
    floor = v.get("row_read_floor")
    row["fraction_of_ceiling_at_floor"] = free / floor if free and floor else None
    row["ours_over_floor"] = ours / floor if ours and floor else None
    # If the hot set's reads cost nothing (and the rest stayed at the floor's rate): the
    # fraction of the ceiling no order of a random graph's edges could beat.
    h = row.get("hot_set_fraction")
    if free and floor and free_ours and h is not None:
        # The floor's step less the hot share of its reads (floor - free_ours, none where
        # noise put the floor under the layer without aggregation): never above the floor,
        # so the bound is never below the fraction at the floor.
        reads = max(0.0, floor - free_ours)
        row["fraction_of_ceiling_bound"] = free / (floor - reads * h)
    # Aggregation's share of each step by subtraction, to compare with the profile's.
    for name in ("pyg", "ours"):
        if v.get(name) and free:
            row["variants"][name]["aggregation_by_subtraction_s"] = v[name] - free


# --------------------------------------------------------------------------- output


def _sec(r: dict) -> str:
    return f"{r['best_s']:.3f}/{r['median_s']:.3f}" if r.get("best_s") is not None else "-"


def _x(value: Optional[float], fmt: str = "x{:.2f}") -> str:
    return fmt.format(value) if value is not None else "-"


HEADER = (f"{'layer':>5} {'pyg best/med [s]':>17} {'ours best/med [s]':>18} {'no_agg best/med [s]':>20} "
          f"{'no_agg_ours b/m [s]':>20} {'floor b/m [s]':>14} {'speedup':>8} {'ceiling':>8} {'of ceil':>8} "
          f"{'ceil*':>8} {'of ceil*':>8} {'@floor':>7} {'bound':>6} {'max|diff|':>10}")


def fmt_row(row: dict) -> str:
    v = row["variants"]
    diff = row.get("check_ours_vs_pyg", {}).get("out", {}).get("max_abs_diff")
    notes = "; ".join(r["note"] for r in v.values() if r.get("note"))
    return (f"{row['layer']:>5} {_sec(v['pyg']):>17} {_sec(v['ours']):>18} {_sec(v['no_aggregation']):>20} "
            f"{_sec(v['no_aggregation_ours']):>20} {_sec(v['row_read_floor']):>14} {_x(row['speedup']):>8} "
            f"{_x(row['ceiling']):>8} {_x(row['fraction_of_ceiling'], '{:.0%}'):>8} "
            f"{_x(row['ceiling_ours_dense']):>8} {_x(row['fraction_of_ceiling_ours_dense'], '{:.0%}'):>8} "
            f"{_x(row['fraction_of_ceiling_at_floor'], '{:.0%}'):>7} "
            f"{_x(row.get('fraction_of_ceiling_bound'), '{:.0%}'):>6} {_x(diff, '{:.1e}'):>10}  {notes}")


def print_profile(row: dict) -> None:
    for name, p in row.get("profile", {}).items():
        c = p["categories_pct"]
        print(f"# profile {row['layer']} {name}: step {p['wall_s']:.3f}s under the profiler, self CPU "
              f"{p['self_total_s']:.3f}s = aggregation {c['aggregation']:.0f}% / dense {c['dense']:.0f}% / "
              f"other {c['other']:.0f}%")
        for op in p["top"]:
            print(f"#   {op['self_s']:8.4f}s {op['calls']:4d}x {op['category']:>11}  {op['op']}")


def markdown_table(rows: List[dict]) -> str:
    head = ["layer", "graph", "load", "pyg [s]", "ours [s]", "no aggregation [s]",
            "no aggregation, kernels' forward [s]", "kernels' forward, aggregation = row reads alone [s]",
            "speedup pyg/ours", "ceiling pyg/no-agg", "fraction of ceiling", "ceiling with the kernels' forward",
            "fraction of that ceiling", "fraction of ceiling at the row-read floor",
            "… and with the hot set's reads free (hot set h)", "aggregation share of ours' profile"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    names = {"gcn": "GCNConv", "sage": "SAGEConv"}
    for r in rows:
        v = r["variants"]
        cells = [f"{names[r['layer']]}({r['features']}, {r['features']})",
                 f"{r['nodes'] / 1e6:g}M / {r['edges'] / 1e6:g}M", f"{r['load_avg_before'][0]:.1f}"]
        for name in VARIANTS:
            cells.append(f"{v[name]['best_s']:.3f} ({v[name]['median_s']:.3f})" if v[name].get("best_s") is not None
                         else "not run (memory)" if name == "pyg" else "not run")
        cells += [_x(r["speedup"]), _x(r["ceiling"]), _x(r["fraction_of_ceiling"], "{:.0%}"),
                  _x(r["ceiling_ours_dense"]), _x(r["fraction_of_ceiling_ours_dense"], "{:.0%}"),
                  _x(r.get("fraction_of_ceiling_at_floor"), "{:.0%}"),
                  _x(r.get("fraction_of_ceiling_bound"), "{:.0%}") + _x(r.get("hot_set_fraction"), " ({:.2f})")]
        prof = r.get("profile", {}).get("ours")
        cells.append(f"{prof['categories_pct']['aggregation']:.0f} %" if prof else "-")
        out.append("| " + " | ".join(cells) + " |")
    out.append(f"\nSeconds per forward+backward step: best (median) of {rows[0]['repeats'] if rows else '-'}, "
               "after one warm-up, variants round robin.")
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def machine_info(args: argparse.Namespace, argv: Optional[List[str]]) -> dict:
    import torch_geometric

    t = time.perf_counter()
    have_cpp = K.cpp_available()  # builds the extension on first use: keep it out of the timings
    return dict(python=sys.version.split()[0], torch=torch.__version__, torch_geometric=torch_geometric.__version__,
                threads=torch.get_num_threads(), cpus=os.cpu_count(), cpu=platform.processor() or platform.machine(),
                cpp_available=have_cpp, ext_load_s=time.perf_counter() - t,
                thp_mem_alloc=os.environ.get("THP_MEM_ALLOC_ENABLE", "0"), huge_pages=K.huge_pages_info(),
                mem_available_gib=mem_available() / 2**30,
                repeats=args.repeats, warmup=1, argv=sys.argv[1:] if argv is None else list(argv),
                load_avg_start=os.getloadavg())


def dense_reference(n: int, f: int, repeats: int, dtype: torch.dtype = torch.float32) -> dict:
    """``torch.mm`` alone on the layers' GEMM shapes (forward ``[N, F] x [F, F]``; the two
    backward products, input gradient ``[N, F] x [F, F]`` and weight gradient ``[F, N] x [N, F]``),
    best of ``repeats``: what the dense part of a step can take at least with this torch."""
    a, w, g = (torch.randn(n, f, dtype=dtype), torch.randn(f, f, dtype=dtype),
               torch.randn(n, f, dtype=dtype))
    fwd = min(timeit(lambda: torch.mm(a, w), repeats, 1))
    wgrad = min(timeit(lambda: torch.mm(g.t(), a), repeats, 1))
    flops = 2.0 * n * f * f
    # A linear layer's forward + backward is one forward-shaped product twice (output and
    # input gradient) and one weight-gradient product.
    return dict(mm_fwd_s=fwd, mm_wgrad_s=wgrad, gflops_fwd=flops / fwd / 1e9, gflops_wgrad=flops / wgrad / 1e9,
                linear_fwd_bwd_s=2 * fwd + wgrad)


def main(argv: Optional[List[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=500_000)
    p.add_argument("--edges", type=int, default=8_000_000)
    p.add_argument("--features", type=int, default=128, help="in = out channels of every layer")
    p.add_argument("--layers", nargs="+", default=list(LAYERS), choices=LAYERS)
    p.add_argument("--repeats", type=int, default=3, help="timed steps per variant (after one warm-up), all alike")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skew-src", type=float, default=2.0, help="source degree skew (see kernels.power_law_graph)")
    p.add_argument("--skew-dst", type=float, default=2.0, help="destination degree skew")
    p.add_argument("--json", default=None, help="write the JSON result to this file (default: layers-<time>.json "
                   "in the results directory, see --out)")
    add_out_argument(p)
    p.add_argument("--no-print-json", action="store_true", help="do not print the JSON result")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler breakdown")
    p.add_argument("--autocast", choices=("none", "bf16"), default="none",
                   help="run the steps under torch.autocast('cpu', bfloat16) (Lightning's bf16-mixed)")
    args = p.parse_args(argv)

    info = machine_info(args, argv)
    t = time.perf_counter()
    ei = power_law_graph(args.nodes, args.edges, src_skew=args.skew_src, dst_skew=args.skew_dst, seed=args.seed)
    graph = dict(nodes=args.nodes, edges=args.edges, skew_src=args.skew_src, skew_dst=args.skew_dst, seed=args.seed,
                 generate_s=time.perf_counter() - t,
                 max_in_degree=int(torch.bincount(ei[1], minlength=args.nodes).max()))
    print(f"# torch {info['torch']}, PyG {info['torch_geometric']}, {info['threads']} threads on {info['cpus']} CPUs, "
          f"load {info['load_avg_start'][0]:.2f}, cpp kernels: {info['cpp_available']}, "
          f"THP_MEM_ALLOC_ENABLE={info['thp_mem_alloc']}, huge-page allocator: "
          f"{'on' if info['huge_pages']['active'] else 'off'}; graph N={args.nodes:,} E={args.edges:,} "
          f"F={args.features} (max in-degree {graph['max_in_degree']:,}); 1 warm-up + best/median of {args.repeats}",
          flush=True)
    dense = dense_reference(args.nodes, args.features, max(3, args.repeats),
                            torch.bfloat16 if args.autocast == "bf16" else torch.float32)
    dense_dtype = "bfloat16" if args.autocast == "bf16" else "float32"
    print(f"# torch.mm alone ({dense_dtype}), [N, F] x [F, F]: {dense['mm_fwd_s']:.3f}s "
          f"({dense['gflops_fwd']:.0f} GFLOP/s), weight "
          f"gradient [F, N] x [N, F]: {dense['mm_wgrad_s']:.3f}s ({dense['gflops_wgrad']:.0f} GFLOP/s); one linear "
          f"layer's forward + backward at that rate: {dense['linear_fwd_bwd_s']:.3f}s (GCNConv has one, SAGEConv two)",
          flush=True)
    rows: List[dict] = []
    result = dict(machine=info, graph=graph, dense_reference=dense, layers=rows)

    json_path = args.json or str(result_path("layers", args.out))

    def save() -> None:  # after every layer, so a late OOM kill keeps the earlier results
        with open(json_path, "w") as fh:
            json.dump(result, fh, indent=1)

    print(HEADER, flush=True)
    for layer in args.layers:
        row = bench_layer(layer, ei, args.nodes, args)
        rows.append(row)
        print(fmt_row(row), flush=True)
        print_profile(row)
        gc.collect()
        K.clear_memos()  # this layer's CSR and pooled buffers back to the OS before the next
        save()
    info["load_avg_end"] = os.getloadavg()
    print(markdown_table(rows))
    if not args.no_print_json:
        print(json.dumps(result, indent=1))
    save()
    print(f"# result: {json_path}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
