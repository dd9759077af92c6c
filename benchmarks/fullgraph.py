#!/usr/bin/env python
"""Full-graph training on one process vs. a graph partitioned across P processes.

Usage::

    python -m benchmarks fullgraph --quick            # ~50k nodes smoke run (~1 min)
    python -m benchmarks fullgraph                    # 1M nodes, ~10M edges, GCN, P in {2, 4}
    python -m benchmarks fullgraph --model sage --epochs 2
    python -m benchmarks fullgraph --aggregation post # cut edges post-aggregated only
    python -m benchmarks fullgraph --json | jq .runs  # only the JSON on stdout

(``benchmarks/aggregation.py`` compares the post / pre / hybrid aggregation modes with
this file's launcher and worker.)

What it does, in order:

1. Generates a synthetic node-classification graph once per invocation
   (:func:`lightning_fullgraph.data.synthetic.synthetic_graph`; default 1,000,000
   nodes, average degree 10 = ~10M directed edges, 128 features, 16 classes) and
   saves it once with ``torch.save`` (a dict of tensors) to the cache directory.
2. Partitions it with :func:`lightning_fullgraph.partition.partition_graph` for every
   P of ``--parts`` into the same cache directory (re-used across invocations).
3. For every configuration, spawns *fresh* processes (``multiprocessing`` "spawn";
   nothing of the parent's memory counts) that train a 2-layer model (GCNConv or
   SAGEConv, hidden 128, ReLU, Adam) full-graph:

   * ``single``: one process loads the *global* graph from disk and trains plain PyG
     (no engine, no process group);
   * ``P=k``: k gloo ranks; each loads *only its own partition* with
     :func:`~lightning_fullgraph.partition.load_partition` and trains through
     :class:`~lightning_fullgraph.engine.FullGraphEngine` (``attach``, ``data``,
     ``backward``).

   One warm-up epoch, then the mean of ``--epochs`` timed epochs (forward + backward +
   optimizer step).  Ranks meet at a barrier before every epoch; a configuration's
   epoch time is the slowest rank's.

Measured per rank: peak RSS of the process (``getrusage(RUSAGE_SELF).ru_maxrss``),
the RSS right after ``import torch, torch_geometric`` (the interpreter baseline) and,
for ranks, after importing the library too (it imports Lightning); halo-exchange
bytes per epoch sent/received in the forward and backward pass and the seconds
spent in the exchange (``engine.stats``; those seconds include waiting for slower
ranks), plus the gradient all-reduce time.  Ratios are against the single-process
run of the same invocation; the target checked is: at P=4 every rank's peak RSS is
at most 40 % of the single-process peak.

Threads: with P ranks each process uses ``max(1, cores // P)`` intra-op threads
(``--cores``, default: CPUs available to this process), so the single process gets
all cores.  When ``P > cores`` the ranks are oversubscribed and their epoch times
say more about the machine than about the library; the table says so.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import platform
import queue as queue_module
import re
import resource
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

# NOTE: no torch import at module level.  Spawned children import this file as
# ``__mp_main__``; importing torch here would hide the interpreter baseline.

from ._common import REPO, add_out_argument, default_results_root, result_path  # noqa: F401  (stdlib only)

#: Where the saved graph and partitions live by default (``cache/``), beside the results.
DEFAULT_RESULTS = default_results_root()
TARGET_PARTS = 4
TARGET_RATIO = 0.40
MiB = 1024.0 * 1024.0


# --------------------------------------------------------------------------- memory


def peak_rss_kib() -> int:
    r"""Peak resident set size of this process so far (KiB on Linux)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _proc_status_kib(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def current_rss_kib() -> Optional[int]:
    r"""Current resident set size (``VmRSS``) in KiB, if ``/proc`` is available."""
    return _proc_status_kib("VmRSS")


def _mem_point() -> Dict[str, Optional[int]]:
    # VmHWM: high-water mark of this process's own address space (a cross-check of
    # ru_maxrss, which also includes the forking parent's RSS at spawn time).
    return {"peak_kib": peak_rss_kib(), "now_kib": current_rss_kib(),
            "hwm_kib": _proc_status_kib("VmHWM")}


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# --------------------------------------------------------------------------- the worker


def _build_model(torch_nn, pyg_nn, kind: str, in_dim: int, hidden: int, out_dim: int,
                 input_dropout: float = 0.0):
    conv = {"gcn": pyg_nn.GCNConv, "sage": pyg_nn.SAGEConv}[kind]
    dropout = float(input_dropout)

    class Net(torch_nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = conv(in_dim, hidden)
            self.conv2 = conv(hidden, out_dim)

        def forward(self, x, edge_index):
            if dropout > 0.0:  # a fresh input tensor every step (benchmarks/aggregation.py)
                x = torch_nn.functional.dropout(x, p=dropout, training=self.training)
            x = self.conv1(x, edge_index).relu()
            return self.conv2(x, edge_index)

    return Net()


def engine_kwargs(cfg: Dict[str, Any]) -> Dict[str, Any]:
    r"""Optional :class:`FullGraphEngine` keywords of a configuration: its
    :class:`ExchangeConfig` fields ``aggregation`` (``"post"``, ``"pre"``, ``"hybrid"``;
    absent: the default) and ``overlap``, and ``cache_static`` (absent: not passed).  Used by
    ``benchmarks/aggregation.py``; JSON-able (the record keeps it).  A configuration is measured
    as configured throughout: step aside is off (after a few steps its trial would run other
    modes and stages, and re-aggregate what the static-input memo keeps, in timed epochs)."""
    out: Dict[str, Any] = {}
    exchange = {k: (bool(cfg[k]) if k == "overlap" else cfg[k])
                for k in ("aggregation", "overlap") if cfg.get(k) is not None}
    out["exchange"] = dict(exchange, step_aside=False)
    if cfg.get("cache_static") is not None:
        out["static_inputs"] = bool(cfg["cache_static"])
    return out


def _plan_counts(engine) -> Optional[Dict[str, Any]]:
    # Rows of this rank's plan in the engine's aggregation mode (for byte checks).
    mode = getattr(engine, "aggregation", "post")
    exchanges = getattr(engine, "exchanges", None) or {}
    ex = exchanges.get(mode, getattr(engine, "exchange", None))
    plan = getattr(ex, "plan", None)
    if plan is None or not hasattr(plan, "pre"):
        return None
    return {"mode": mode, "post_send": int(plan.post.send_index.numel()),
            "post_recv": int(plan.post.recv_index.numel()),
            "pre_send": int(plan.pre.send_index.numel()),
            "pre_recv": int(plan.pre.recv_index.numel())}


def _train(cfg: Dict[str, Any], rank: int, world: int, port: int) -> Dict[str, Any]:
    rec: Dict[str, Any] = {"rank": rank, "world_size": world, "pid": os.getpid()}
    rec["mem_start"] = _mem_point()
    threads = int(cfg["threads"])
    # Before importing torch so that OpenMP picks it up as well.
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)

    import torch
    import torch_geometric  # noqa: F401  (the interpreter baseline includes PyG)
    rec["mem_after_import"] = _mem_point()

    torch.set_num_threads(threads)
    rec["threads"] = torch.get_num_threads()
    import torch.nn.functional as F
    from torch_geometric import nn as pyg_nn

    engine = None
    if cfg.get("kernels", "pyg") in ("auto", "cpp"):
        # As FullGraphStrategy does in setup_environment: the huge-page allocator goes in
        # before the data is loaded and the plans are built where the process's mode asks for
        # it (an opt-in: LIGHTNING_FULLGRAPH_HUGE_PAGES=1), in every process alike.
        from lightning_fullgraph.kernels import huge_pages
        huge_pages.enable_for_kernels(None)
        rec["huge_pages"] = huge_pages.is_active()
    t0 = time.perf_counter()
    # cfg["engine_single"]: one rank through the engine (a 1-part partition) instead of
    # plain PyG on the global graph.
    if world == 1 and not cfg.get("engine_single"):
        # Plain PyG on the global graph: the parent saved it once with torch.save.
        from torch_geometric.data import Data
        state = torch.load(cfg["graph_path"], weights_only=True, map_location="cpu")
        data = Data(**state)
        del state
        rec["local"] = {"num_nodes": int(data.num_nodes),
                        "num_edges": int(data.edge_index.size(1)), "num_halo": 0}
        rec["mem_after_library_import"] = None
    else:
        import torch.distributed as dist
        from datetime import timedelta
        from lightning_fullgraph.engine import FullGraphEngine
        from lightning_fullgraph.partition import load_partition
        rec["mem_after_library_import"] = _mem_point()
        t0 = time.perf_counter()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world,
                                timeout=timedelta(seconds=float(cfg["timeout_s"])))
        rec["init_process_group_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        # Only this rank's partition is read from disk; the global graph never is.
        part = load_partition(cfg["partition_dir"], rank, num_parts=world)
        engine = FullGraphEngine(part, **engine_kwargs(cfg))
        rec["engine_kwargs"] = engine_kwargs(cfg)
        rec["aggregation"] = getattr(engine, "aggregation", None)
        static = getattr(engine, "static", None)  # the engine's static-input cache, if any
        rec["cache_static"] = None if static is None else bool(getattr(static, "enabled", False))
        data = engine.data
        rec["local"] = {"num_nodes": part.num_owned, "num_edges": part.num_local_edges,
                        "num_halo": part.num_halo,
                        "num_send": int(part.send_index.numel()),
                        "plan": _plan_counts(engine)}
    rec["load_s"] = time.perf_counter() - t0
    rec["mem_after_load"] = _mem_point()
    rec["local"]["payload_bytes"] = int(sum(
        v.numel() * v.element_size() for v in data.to_dict().values()
        if isinstance(v, torch.Tensor)))

    x, edge_index, y, mask = data.x, data.edge_index, data.y, data.train_mask
    torch.manual_seed(int(cfg["seed"]))
    model = _build_model(torch.nn, pyg_nn, cfg["model"], x.size(1), int(cfg["hidden"]),
                         int(cfg["num_classes"]), float(cfg.get("input_dropout", 0.0)))
    rec["num_parameters"] = int(sum(p.numel() for p in model.parameters()))
    allreduce_s = [0.0]
    kernels = cfg.get("kernels", "pyg")
    if engine is None and kernels != "pyg":
        from lightning_fullgraph import kernels as kernel_backends
        kernel_backends.accelerate(model, backend=kernels)
    if engine is not None:
        engine.attach(model)  # also broadcasts rank 0's parameters
        if kernels != "pyg":
            engine.use_kernels(kernels)
        # Time the gradient all-reduce that engine.backward() calls.
        inner = engine.all_reduce_gradients

        def timed_all_reduce(params, _inner=inner):
            start = time.perf_counter()
            _inner(params)
            allreduce_s[0] += time.perf_counter() - start

        engine.all_reduce_gradients = timed_all_reduce
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    epochs: List[Dict[str, Any]] = []
    total = int(cfg["warmup"]) + int(cfg["epochs"])
    cache_ab = None
    if cfg.get("block_cache_ab"):
        from lightning_fullgraph.kernels import huge_pages as hp
        cache_ab = hp._parse_bytes(cfg["block_cache_ab"])
    for epoch in range(total):
        cache_on = None
        if cache_ab is not None and epoch >= int(cfg["warmup"]):
            cache_on = block_cache_setting(epoch - int(cfg["warmup"]))
            hp.set_block_cache(cache_ab if cache_on else 0)  # every rank, the same epoch
        if engine is not None:
            dist.barrier()
            engine.stats.reset()
            if cfg.get("next_step"):
                engine.next_step()
        allreduce_s[0] = 0.0
        c_start, times_start = time.process_time(), os.times()
        t_start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(x, edge_index)
        loss = F.cross_entropy(out[mask], y[mask])
        t_fwd = time.perf_counter()
        if engine is not None:
            engine.backward(loss)
        else:
            loss.backward()
        t_bwd = time.perf_counter()
        opt.step()
        t_end = time.perf_counter()
        c_end, times_end = time.process_time(), os.times()
        e: Dict[str, Any] = {"epoch": epoch, "warmup": epoch < int(cfg["warmup"]),
                             "cpu_s": c_end - c_start,
                             # the kernel's part: page faults, zeroing, unmapping
                             "sys_s": times_end.system - times_start.system,
                             "total_s": t_end - t_start, "forward_s": t_fwd - t_start,
                             "backward_s": t_bwd - t_fwd, "step_s": t_end - t_bwd,
                             "allreduce_s": allreduce_s[0]}
        if cache_on is not None:
            e["block_cache"] = cache_on
            e["block_cache_steady"] = (epoch - int(cfg["warmup"])) % 2 == 1
        # The global mean training loss (a correctness check against single).
        if engine is not None:
            snap = engine.stats.snapshot()
            fwd, bwd = engine.stats.total("forward"), engine.stats.total("backward")
            e["comm"] = {"forward_bytes_sent": fwd.bytes_sent,
                         "forward_bytes_received": fwd.bytes_received,
                         "backward_bytes_sent": bwd.bytes_sent,
                         "backward_bytes_received": bwd.bytes_received,
                         "forward_seconds": fwd.seconds, "backward_seconds": bwd.seconds,
                         "seconds": snap["comm/seconds"],
                         "exchanges": int(snap["comm/exchanges"])}
            if hasattr(engine.stats, "per_key"):  # bytes sent per exchange point
                e["comm_keys"] = {k: c.bytes_sent for k, c in engine.stats.per_key().items()}
            g = engine.scale_loss(loss.detach()).reshape(1).double()
            dist.all_reduce(g)
            e["loss"] = float(g)
        else:
            e["loss"] = float(loss.detach())
        if cfg.get("validate"):
            t_val = time.perf_counter()
            model.eval()
            with torch.no_grad():
                model(x, edge_index)
            model.train()
            e["val_s"] = time.perf_counter() - t_val
        e["mem_peak_kib"] = peak_rss_kib()
        epochs.append(e)
        del out, loss
    rec["epochs"] = epochs
    rec["mem_end"] = _mem_point()
    rec["peak_rss_kib"] = peak_rss_kib()
    if engine is not None:
        dist.barrier()
        dist.destroy_process_group()
    return rec


def _worker(cfg: Dict[str, Any], rank: int, world: int, port: int, out_queue) -> None:
    try:
        out_queue.put((rank, True, _train(cfg, rank, world, port)))
    except BaseException:  # report everything (asserts, OOM errors) to the parent
        out_queue.put((rank, False, traceback.format_exc()))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_config(cfg: Dict[str, Any], world: int, timeout_s: float,
                 target=None) -> List[Dict[str, Any]]:
    r"""Runs :func:`_train` (or :obj:`target`) in ``world`` freshly spawned processes.

    Not :func:`lightning_fullgraph.testing.run_distributed`: that one imports torch in
    the parent and in each child before the user function runs, and a spawned child's
    ``ru_maxrss`` starts at its parent's RSS, so the memory figures need a launcher
    that never imports torch and children that measure before importing it.
    """
    ctx = mp.get_context("spawn")
    out_queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=target or _worker, args=(cfg, r, world, port, out_queue), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: Dict[int, Any] = {}
    errors: List[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world and not errors:
            try:
                rank, ok, payload = out_queue.get(timeout=1.0)
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in results]
                if dead:
                    errors.append(f"rank(s) {dead} died with exit codes "
                                  f"{[procs[r].exitcode for r in dead]} (killed for memory?)")
                elif time.monotonic() > deadline:
                    errors.append(f"configuration did not finish within {timeout_s:.0f} s")
                continue
            if ok:
                results[rank] = payload
            else:
                errors.append(f"rank {rank} failed:\n{payload}")
    finally:
        for p in procs:
            p.join(timeout=10 if not errors else 0.5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[r] for r in range(world)]


# --------------------------------------------------------------------------- summaries


def _mean(values: List[float]) -> float:
    return float(statistics.fmean(values)) if values else float("nan")


def _std(values: List[float]) -> float:
    return float(statistics.stdev(values)) if len(values) > 1 else 0.0


def block_cache_setting(timed_epoch: int) -> bool:
    r"""``--block-cache-ab``: whether timed epoch :obj:`timed_epoch` runs with the block cache
    (pairs off, off, on, on, ...; the second epoch of a pair is the steady one)."""
    return (timed_epoch // 2) % 2 == 1


def block_cache_ab(epoch_total: List[float], timed: List[Dict[str, Any]],
                   epoch_cpu: Optional[List[float]] = None,
                   epoch_sys: Optional[List[float]] = None) -> Optional[dict]:
    r"""Mean of the steady epochs (slowest rank) with the block cache off and on, or ``None``;
    with :obj:`epoch_cpu` / :obj:`epoch_sys` (per epoch, summed over ranks) also the CPU and
    system seconds of each mode -- on an oversubscribed machine the work done, not the wall
    clock, shows what the cache saves."""
    if not timed or "block_cache" not in timed[0]:
        return None
    on_i = [i for i, e in enumerate(timed) if e["block_cache_steady"] and e["block_cache"]]
    off_i = [i for i, e in enumerate(timed) if e["block_cache_steady"] and not e["block_cache"]]
    if not on_i or not off_i:
        return None
    off, on = [epoch_total[i] for i in off_i], [epoch_total[i] for i in on_i]
    out = {"off_s": _mean(off), "on_s": _mean(on), "epochs_off": off, "epochs_on": on}
    out["speedup"] = out["off_s"] / out["on_s"]
    for name, values in (("cpu", epoch_cpu), ("sys", epoch_sys)):
        if values is not None:
            out[f"{name}_off_s"] = _mean([values[i] for i in off_i])
            out[f"{name}_on_s"] = _mean([values[i] for i in on_i])
    return out


def summarize(name: str, world: int, threads: int, ranks: List[Dict[str, Any]],
              cores: int) -> Dict[str, Any]:
    r"""Per-configuration summary of the per-rank records."""
    timed = [[e for e in r["epochs"] if not e["warmup"]] for r in ranks]
    n = len(timed[0])
    # An epoch of the configuration lasts as long as its slowest rank.
    epoch_total = [max(t[i]["total_s"] for t in timed) for i in range(n)]
    per_rank = []
    for r, t in zip(ranks, timed):
        row: Dict[str, Any] = {
            "rank": r["rank"],
            "peak_rss_kib": r["peak_rss_kib"],
            "peak_hwm_kib": r["mem_end"]["hwm_kib"],
            "rss_at_start_kib": r["mem_start"]["now_kib"],
            "rss_after_import_torch_pyg_kib": r["mem_after_import"]["now_kib"],
            "rss_after_library_import_kib": (r["mem_after_library_import"] or {}).get("now_kib"),
            "peak_rss_after_load_kib": r["mem_after_load"]["peak_kib"],
            "rss_after_load_kib": r["mem_after_load"]["now_kib"],
            "load_s": r["load_s"],
            "local": r["local"],
            "epoch_s": _mean([e["total_s"] for e in t]),
            "forward_s": _mean([e["forward_s"] for e in t]),
            "backward_s": _mean([e["backward_s"] for e in t]),
            "step_s": _mean([e["step_s"] for e in t]),
            "val_s": _mean([e.get("val_s", float("nan")) for e in t]),
            "cpu_s": _mean([e.get("cpu_s", float("nan")) for e in t]),
            "allreduce_s": _mean([e["allreduce_s"] for e in t]),
            "threads": r["threads"],
        }
        if "comm" in t[0]:
            keys = list(t[0]["comm"])
            row["comm_per_epoch"] = {k: _mean([e["comm"][k] for e in t]) for k in keys}
            row["exchange_fraction"] = row["comm_per_epoch"]["seconds"] / row["epoch_s"]
        per_rank.append(row)
    peaks = [r["peak_rss_kib"] for r in ranks]
    return {
        "name": name,
        "world_size": world,
        "threads_per_process": threads,
        "oversubscribed": world * threads > cores,
        "epochs_timed": n,
        "epoch_s": _mean(epoch_total),
        "epoch_s_std": _std(epoch_total),
        "epoch_s_all": epoch_total,
        "warmup_epoch_s": max(r["epochs"][0]["total_s"] for r in ranks)
        if ranks[0]["epochs"][0]["warmup"] else None,
        "cpu_s_sum_over_ranks": sum(_mean([e.get("cpu_s", float("nan")) for e in t])
                                    for t in timed),
        "peak_rss_kib_max": max(peaks),
        "peak_rss_kib_per_rank": peaks,
        "losses": [e["loss"] for e in ranks[0]["epochs"]],
        "num_parameters": ranks[0]["num_parameters"],
        "ranks": per_rank,
        "block_cache_ab": block_cache_ab(
            epoch_total, timed[0],
            [sum(t[i].get("cpu_s", float("nan")) for t in timed) for i in range(n)],
            [sum(t[i].get("sys_s", float("nan")) for t in timed) for i in range(n)]),
    }


def _mib(kib: Optional[float]) -> str:
    return "-" if kib is None else f"{kib / 1024:,.0f}"


def _fmt_bytes(b: float) -> str:
    return f"{b / MiB:,.1f}"


def format_report(res: Dict[str, Any]) -> str:
    lines: List[str] = []
    meta, g = res["meta"], res["graph"]
    lines.append("")
    lines.append(f"== lightning-fullgraph full-graph benchmark  ({meta['timestamp']}) ==")
    lines.append(f"machine: {meta['platform']}, {meta['cores']} cores, torch {meta['torch']}, "
                 f"torch_geometric {meta['torch_geometric']}")
    lines.append(f"graph:   {g['num_nodes']:,} nodes, {g['num_edges']:,} directed edges "
                 f"(avg degree {g['num_edges'] / g['num_nodes']:.2f}), {g['num_features']} "
                 f"features, {g['num_classes']} classes, {g['num_train']:,} train nodes; "
                 f"generated in {g['generate_s']:.1f} s, saved "
                 f"{'(reused file)' if g['reused_file'] else 'in %.1f s' % g['save_s']} "
                 f"({g['file_bytes'] / MiB:,.0f} MiB)")
    for P, p in res["partitions"].items():
        lines.append(f"partition P={P}: {'reused from cache' if p['reused'] else 'computed'} "
                     f"in {p['seconds']:.1f} s; edge cut {p.get('edge_cut_fraction', float('nan')):.3f}, "
                     f"total halo {p.get('total_halo', 0):,}; dir {p['dir']}")
    validate = ("a validation forward after every step (not in the epoch time); "
                if meta.get("validate") else "")
    lines.append(f"model:   2-layer {meta['model'].upper()} (hidden {meta['hidden']}, ReLU, Adam "
                 f"lr=0.01), {meta['warmup']} warm-up + {meta['epochs']} timed epochs; "
                 f"aggregation {meta.get('aggregation', 'engine default')}; {validate}"
                 f"threads per process = max(1, {meta['cores']} // P)")
    runs = res["runs"]
    single = runs.get("single")

    lines.append("")
    lines.append("Epoch time (slowest rank; forward + backward + optimizer step)")
    hdr = (f"{'config':<8}{'procs x thr':>12}{'epoch s':>10}{'± sd':>8}{'fwd s':>8}"
           f"{'bwd s':>8}{'step s':>8}{'speedup':>9}{'exch s':>8}{'exch %':>8}"
           f"{'allred s':>10}{'CPU s':>8}  note")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for name, r in runs.items():
        rk = r["ranks"]
        slow = max(rk, key=lambda x: x["epoch_s"])
        exch = max((x["comm_per_epoch"]["seconds"] for x in rk if "comm_per_epoch" in x),
                   default=None)
        speed = (single["epoch_s"] / r["epoch_s"]) if single else float("nan")
        note = "oversubscribed (P x threads > cores)" if r["oversubscribed"] else ""
        lines.append(
            f"{name:<8}{'%d x %d' % (r['world_size'], r['threads_per_process']):>12}"
            f"{r['epoch_s']:>10.2f}{r['epoch_s_std']:>8.2f}{slow['forward_s']:>8.2f}"
            f"{slow['backward_s']:>8.2f}{slow['step_s']:>8.3f}{speed:>8.2f}x"
            f"{(f'{exch:.2f}' if exch is not None else '-'):>8}"
            f"{('%.0f' % (100 * exch / r['epoch_s']) if exch is not None else '-'):>8}"
            f"{('%.3f' % slow['allreduce_s'] if r['world_size'] > 1 else '-'):>10}"
            f"{r.get('cpu_s_sum_over_ranks', float('nan')):>8.1f}  {note}")

    lines.append("  CPU s = process CPU time per epoch summed over the configuration's processes "
                 "(robust to other load on the machine).")
    lines.append("")
    lines.append("Peak RSS per process (MiB; getrusage ru_maxrss of a fresh spawned process)")
    hdr = (f"{'config':<8}{'rank':>5}{'import':>9}{'+lib':>8}{'loaded':>9}{'peak':>9}{'VmHWM':>8}"
           f"{'peak/single':>13}{'net/single':>12}{'nodes':>11}{'halo':>10}{'edges':>12}"
           f"{'load s':>8}")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    sp = single["peak_rss_kib_max"] if single else None
    s_base = single["ranks"][0]["rss_after_import_torch_pyg_kib"] if single else None
    for name, r in runs.items():
        for x in r["ranks"]:
            ratio = x["peak_rss_kib"] / sp if sp else float("nan")
            net = ((x["peak_rss_kib"] - x["rss_after_import_torch_pyg_kib"]) / (sp - s_base)
                   if sp else float("nan"))
            loc = x["local"]
            lines.append(
                f"{name:<8}{x['rank']:>5}{_mib(x['rss_after_import_torch_pyg_kib']):>9}"
                f"{_mib(x['rss_after_library_import_kib']):>8}{_mib(x['rss_after_load_kib']):>9}"
                f"{_mib(x['peak_rss_kib']):>9}{_mib(x['peak_hwm_kib']):>8}"
                f"{100 * ratio:>12.1f}%{100 * net:>11.1f}%"
                f"{loc['num_nodes']:>11,}{loc['num_halo']:>10,}{loc['num_edges']:>12,}"
                f"{x['load_s']:>8.1f}")
    lines.append("  import = RSS after `import torch, torch_geometric` (interpreter baseline); "
                 "+lib = after also importing lightning_fullgraph (pulls in Lightning);")
    lines.append("  loaded = RSS after loading the graph / own partition; peak = ru_maxrss at the "
                 "end (the reported figure); VmHWM = the process's own high-water mark")
    lines.append("  (cross-check; ru_maxrss also holds the tiny launcher's RSS at spawn); "
                 "net = (peak - import) relative to the single process's (peak - import).")

    dist_runs = [(n, r) for n, r in runs.items() if r["world_size"] > 1]
    if dist_runs:
        lines.append("")
        lines.append("Halo-exchange traffic per epoch per rank (MiB; engine.stats, identity codec)")
        hdr = (f"{'config':<8}{'rank':>5}{'fwd sent':>10}{'fwd recv':>10}{'bwd sent':>10}"
               f"{'bwd recv':>10}{'exchanges':>11}{'fwd s':>8}{'bwd s':>8}{'exch %':>8}")
        lines.append(hdr)
        lines.append("-" * len(hdr))
        for name, r in dist_runs:
            for x in r["ranks"]:
                c = x["comm_per_epoch"]
                lines.append(
                    f"{name:<8}{x['rank']:>5}{_fmt_bytes(c['forward_bytes_sent']):>10}"
                    f"{_fmt_bytes(c['forward_bytes_received']):>10}"
                    f"{_fmt_bytes(c['backward_bytes_sent']):>10}"
                    f"{_fmt_bytes(c['backward_bytes_received']):>10}{c['exchanges']:>11.0f}"
                    f"{c['forward_seconds']:>8.2f}{c['backward_seconds']:>8.2f}"
                    f"{100 * x['exchange_fraction']:>7.0f}%")
        lines.append("  exchange seconds include waiting for slower ranks inside all_to_all; "
                     "gradient all-reduce (not in these bytes) is the 'allred s' column above.")

    lc = res.get("loss_check")
    if lc:
        lines.append("")
        lines.append("Loss trajectory vs single process (same seed; partitioned execution is exact): "
                     + ", ".join(f"{k}: max |diff| {v:.2e}" for k, v in lc.items()))
    t = res.get("target")
    if t:
        lines.append("")
        lines.append(
            f"TARGET  P={t['parts']}: max rank peak {t['max_rank_peak_kib'] / 1024:,.0f} MiB = "
            f"{100 * t['ratio']:.1f}% of single-process peak {t['single_peak_kib'] / 1024:,.0f} MiB "
            f"(limit {100 * t['limit']:.0f}%) -> {'MET' if t['met'] else 'NOT MET'}")
    lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                     argparse.RawDescriptionHelpFormatter):
    pass


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/fullgraph.py",
        description=("Benchmark full-graph GNN training on one process (plain PyG on the global "
                     "graph) vs. P gloo ranks that each load only their own partition "
                     "(lightning_fullgraph FullGraphEngine). Reports epoch time, per-rank peak "
                     "RSS (fresh spawned process per configuration) with ratios against the "
                     "single process, halo-exchange bytes/seconds per epoch, and checks the "
                     f"target 'at P={TARGET_PARTS} every rank's peak RSS <= "
                     f"{TARGET_RATIO:.0%} of the single-process peak'."),
        epilog=(
            "examples:\n"
            "  python -m benchmarks fullgraph --quick              # ~50k nodes smoke run\n"
            "  python -m benchmarks fullgraph                      # 1M nodes, GCN, P in {2,4}\n"
            "  python -m benchmarks fullgraph --model sage --epochs 2\n"
            "  python -m benchmarks fullgraph --json | jq .target  # JSON only on stdout\n\n"
            "Each configuration runs in freshly spawned processes launched from a parent that\n"
            "never imports torch (a fork+exec'd child's ru_maxrss starts at the parent's RSS).\n"
            "Threads: each of P processes uses max(1, cores // P) threads; with P > cores the\n"
            "ranks are oversubscribed and epoch times are reported as measured (the 'CPU s'\n"
            "column, CPU time summed over processes, is robust to other load). Graph and\n"
            "partitions are cached under --cache-dir; the graph is regenerated every\n"
            "invocation (its time is reported) but written only when missing."),
        formatter_class=_HelpFormatter)
    p.add_argument("--nodes", type=int, default=1_000_000, help="number of nodes")
    p.add_argument("--preorder", action="store_true",
                   help="renumber the graph with lightning_fullgraph.data.LocalityOrder before partitioning")
    p.add_argument("--graph", choices=("synthetic", "torus"), default="synthetic",
                   help="edges: the synthetic community model, or a shuffled torus (mesh-like, locality "
                        "hidden by the ids; its features/labels from the synthetic model)")
    p.add_argument("--avg-degree", type=float, default=10.0,
                   help="average degree (directed edges ~= nodes * avg degree)")
    p.add_argument("--features", type=int, default=128, help="input feature dimension")
    p.add_argument("--classes", type=int, default=16, help="number of classes")
    p.add_argument("--hidden", type=int, default=128, help="hidden dimension")
    p.add_argument("--model", choices=("gcn", "sage"), default="gcn",
                   help="GCNConv or SAGEConv (mean aggregation) layers")
    p.add_argument("--kernels", choices=("pyg", "auto", "cpp", "torch"), default="pyg",
                   help="aggregation: PyG's own scatter path, or a lightning_fullgraph.kernels "
                        "backend (on both sides of the comparison)")
    p.add_argument("--parts", type=str, default="2,4",
                   help="comma-separated numbers of ranks to compare with the single process")
    p.add_argument("--aggregation", choices=("post", "pre", "hybrid"), default=None,
                   help="ExchangeConfig(aggregation=...) of the ranks (default: the engine's "
                        "default); benchmarks/aggregation.py compares the three")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="ExchangeConfig(overlap=...): the halo transfer runs while the "
                        "edges with owned sources aggregate (needs --kernels other than pyg; "
                        "default on, as the engine's)")
    p.add_argument("--block-cache-ab", default=None, metavar="LIMIT",
                   help="time the huge-page allocator's block cache (kernels.set_block_cache) "
                        "against none in the same processes: timed epochs in pairs, off, off, "
                        "on, on, ...; the second of each pair counts (the first fills or "
                        "empties the cache). LIMIT in bytes with a K/M/G suffix, e.g. 8G; "
                        "needs --kernels auto or cpp")
    p.add_argument("--validate", action="store_true",
                   help="after every training step, one evaluation forward on the same "
                        "features under torch.no_grad(), as Lightning's validation loop runs "
                        "(timed apart: 'val s'; its memory counts in the peak)")
    p.add_argument("--no-single", action="store_true",
                   help="skip the single-process baseline (no ratios, no target check)")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs (after the warm-up)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up epochs (not timed)")
    p.add_argument("--cores", type=int, default=available_cores(),
                   help="cores to share among the processes of a configuration")
    p.add_argument("--seed", type=int, default=0, help="graph, METIS and model seed")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 50,000 nodes (overrides --nodes)")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_RESULTS / "cache",
                   help="where the saved graph and the partitions live (reused across runs)")
    add_out_argument(p, file_ok=True)
    p.add_argument("--json", action="store_true",
                   help="print the JSON result to stdout (tables and progress go to stderr)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds allowed per configuration (also the gloo timeout)")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes = 50_000
    args.parts_list = sorted({int(x) for x in args.parts.split(",") if x.strip()})
    if any(P < 2 for P in args.parts_list):
        p.error("--parts must list world sizes >= 2 (the single process always runs)")
    if args.epochs < 1 or args.warmup < 0:
        p.error("need --epochs >= 1 and --warmup >= 0")
    if args.block_cache_ab is not None:
        if args.kernels not in ("auto", "cpp"):
            p.error("--block-cache-ab needs --kernels auto or cpp (the cache is the C++ "
                    "kernels' huge-page allocator's)")
        if not re.fullmatch(r"\s*\d+(\.\d+)?\s*([kmg]i?b?)?\s*", args.block_cache_ab, re.I):
            p.error(f"--block-cache-ab {args.block_cache_ab!r}: expected bytes with an optional "
                    "K/M/G suffix, e.g. 8G")
        if args.epochs < 4:
            p.error("--block-cache-ab needs --epochs >= 4 (two pairs: off, off, on, on)")
    return args


def _prepare(opts: Dict[str, Any]) -> Dict[str, Any]:
    r"""Generates + saves the graph and partitions it (runs in its own child process).

    Kept out of the parent: on Linux a fork+exec'd child's ``ru_maxrss`` starts at the
    forking parent's RSS (the kernel folds the pre-exec image's high-water mark into
    it), so the parent that spawns the measured processes must stay small.
    """
    out_stream = sys.stderr if opts["json"] else sys.stdout

    def log(*a):
        print(*a, file=out_stream, flush=True)

    os.environ["OMP_NUM_THREADS"] = str(opts["cores"])
    import torch
    import torch_geometric
    from lightning_fullgraph.data.synthetic import synthetic_graph
    from lightning_fullgraph.partition import (graph_fingerprint, partition_graph,
                                               read_manifest)
    torch.set_num_threads(opts["cores"])

    cache = Path(opts["cache_dir"])
    cache.mkdir(parents=True, exist_ok=True)

    # 1. The graph: generated once per invocation, saved once.
    log(f"[graph] generating {opts['nodes']:,} nodes, avg degree {opts['avg_degree']}, "
        f"{opts['features']} features, {opts['classes']} classes ...")
    t0 = time.perf_counter()
    if opts.get("graph", "synthetic") == "torus":
        # Features, labels and masks of the synthetic model, edges of a shuffled torus (locality
        # hidden by the ids; see lightning_fullgraph.data.torus): for the kernels' node order.
        from lightning_fullgraph.data import torus_graph
        side = int(round(opts["nodes"] ** 0.5))
        data = synthetic_graph(side * side, avg_degree=1.0, num_features=opts["features"],
                               num_classes=opts["classes"], seed=opts["seed"])
        data.edge_index = torus_graph(side * side, max(1, int(opts["avg_degree"])), seed=opts["seed"])
    if opts.get("preorder"):
        # Renumbered once for locality (a PyG transform): partitions then hold their rows in
        # that order, and the kernels need no per-call permutations.
        from lightning_fullgraph.data import LocalityOrder
        t_order = time.perf_counter()
        data = LocalityOrder()(data)
        log(f"[graph] LocalityOrder: {'renumbered' if 'n_id' in data else 'left as it was'} in "
            f"{time.perf_counter() - t_order:.1f} s")
        if "n_id" in data:
            del data.n_id  # not a feature: keep the saved graph's attributes as they were
    else:
        data = synthetic_graph(opts["nodes"], avg_degree=opts["avg_degree"],
                               num_features=opts["features"], num_classes=opts["classes"],
                               seed=opts["seed"])
    gen_s = time.perf_counter() - t0
    fingerprint = graph_fingerprint(data)
    graph_path = cache / f"graph-{fingerprint[:16]}.pt"
    reused_file, save_s = graph_path.exists(), 0.0
    if not reused_file:
        t0 = time.perf_counter()
        tmp = graph_path.with_name(f".{graph_path.name}.tmp-{os.getpid()}")
        torch.save({k: v for k, v in data.to_dict().items() if isinstance(v, torch.Tensor)}, tmp)
        os.replace(tmp, graph_path)
        save_s = time.perf_counter() - t0
    graph_info = {"num_nodes": int(data.num_nodes), "num_edges": int(data.edge_index.size(1)),
                  "num_features": int(data.x.size(1)), "num_classes": opts["classes"],
                  "num_train": int(data.train_mask.sum()), "avg_degree_arg": opts["avg_degree"],
                  "graph": opts.get("graph", "synthetic"), "preorder": bool(opts.get("preorder")),
                  "seed": opts["seed"], "fingerprint": fingerprint, "generate_s": gen_s,
                  "save_s": save_s, "reused_file": reused_file, "path": str(graph_path),
                  "file_bytes": graph_path.stat().st_size}
    log(f"[graph] {graph_info['num_edges']:,} edges in {gen_s:.1f} s; "
        f"{'reusing' if reused_file else 'saved'} {graph_path}")

    # 2. Partitions (cached across invocations by graph fingerprint and options).
    partitions: Dict[str, Dict[str, Any]] = {}
    for P in opts["parts"]:
        buf = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(buf):
            pdir = partition_graph(data, P, root=cache / "partitions", seed=opts["seed"])
        secs = time.perf_counter() - t0
        text = buf.getvalue()
        log(text.rstrip())
        stats = read_manifest(pdir).get("stats") or {}
        partitions[str(P)] = {
            "dir": str(pdir), "seconds": secs, "reused": "reusing cached partition" in text,
            "edge_cut_fraction": stats.get("edge_cut_fraction"),
            "total_halo": stats.get("total_halo"),
            "node_imbalance": stats.get("node_imbalance"),
            "file_bytes": {f.name: f.stat().st_size for f in sorted(pdir.glob("part-*.pt"))},
            "stats": stats,
        }
    # str(): torch.__version__ is a TorchVersion; unpickling it would import torch
    # into the launcher (and thus into every child's ru_maxrss floor).
    return {"graph": graph_info, "partitions": partitions, "torch": str(torch.__version__),
            "torch_geometric": str(torch_geometric.__version__),
            "prepare_peak_rss_kib": peak_rss_kib()}


def _prepare_worker(opts: Dict[str, Any], rank: int, world: int, port: int, out_queue) -> None:
    try:
        out_queue.put((rank, True, _prepare(opts)))
    except BaseException:
        out_queue.put((rank, False, traceback.format_exc()))


def main(argv=None) -> int:
    args = parse_args(argv)
    log_stream = sys.stderr if args.json else sys.stdout

    def log(*a):
        print(*a, file=log_stream, flush=True)

    # The parent imports no torch: it only spawns children and formats results.
    t0 = time.perf_counter()
    prep = spawn_config({"nodes": args.nodes, "avg_degree": args.avg_degree, "graph": args.graph,
                         "preorder": args.preorder,
                         "features": args.features, "classes": args.classes,
                         "seed": args.seed, "cores": args.cores, "parts": args.parts_list,
                         "cache_dir": str(args.cache_dir.resolve()), "json": args.json},
                        1, args.timeout, target=_prepare_worker)[0]
    log(f"[prepare] graph + partitions ready in {time.perf_counter() - t0:.0f} s "
        f"(preparing process peak RSS {prep['prepare_peak_rss_kib'] / 1024:,.0f} MiB); "
        f"launcher RSS now {(current_rss_kib() or 0) / 1024:,.0f} MiB")
    graph_info, partitions = prep["graph"], prep["partitions"]
    graph_path = Path(graph_info["path"])

    # 3. One fresh set of processes per configuration.
    base_cfg = {"model": args.model, "kernels": args.kernels, "hidden": args.hidden,
                "aggregation": args.aggregation, "overlap": args.overlap,
                "validate": args.validate,
                "block_cache_ab": args.block_cache_ab,
                "num_classes": args.classes,
                "epochs": args.epochs, "warmup": args.warmup, "seed": args.seed,
                "timeout_s": args.timeout}
    configs = ([] if args.no_single else [("single", 1)]) + [(f"P={P}", P)
                                                             for P in args.parts_list]
    runs: Dict[str, Any] = {}
    for name, world in configs:
        threads = max(1, args.cores // world)
        cfg = dict(base_cfg, threads=threads, graph_path=str(graph_path),
                   partition_dir=partitions[str(world)]["dir"] if world > 1 else None)
        log(f"[run] {name}: {world} process(es) x {threads} thread(s) ...")
        t0 = time.perf_counter()
        ranks = spawn_config(cfg, world, args.timeout)
        runs[name] = summarize(name, world, threads, ranks, args.cores)
        runs[name]["wall_s"] = time.perf_counter() - t0
        runs[name]["per_rank_records"] = ranks
        log(f"[run] {name}: epoch {runs[name]['epoch_s']:.2f} s, max peak RSS "
            f"{runs[name]['peak_rss_kib_max'] / 1024:,.0f} MiB (wall {runs[name]['wall_s']:.0f} s)")
        ab = runs[name]["block_cache_ab"]
        if ab is not None:
            log(f"[run] {name}: block cache off {ab['off_s']:.3f} s, on {ab['on_s']:.3f} s per "
                f"epoch (x{ab['speedup']:.3f}; steady epochs {len(ab['epochs_off'])} + "
                f"{len(ab['epochs_on'])}, slowest rank)")
            log(f"[run] {name}: CPU s per epoch over all processes off {ab['cpu_off_s']:.3f}, "
                f"on {ab['cpu_on_s']:.3f} (x{ab['cpu_off_s'] / ab['cpu_on_s']:.3f}); of it "
                f"system s off {ab['sys_off_s']:.3f}, on {ab['sys_on_s']:.3f}")

    res: Dict[str, Any] = {
        "meta": {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "argv": sys.argv, "platform": platform.platform(),
                 "python": platform.python_version(), "torch": prep["torch"],
                 "torch_geometric": prep["torch_geometric"], "cores": args.cores,
                 "model": args.model, "hidden": args.hidden, "epochs": args.epochs,
                 "kernels": args.kernels,
                 "aggregation": args.aggregation or "engine default",
                 "validate": args.validate,
                 "warmup": args.warmup, "quick": args.quick,
                 "threads_rule": "max(1, cores // P)", "rss_unit": "KiB (ru_maxrss, Linux)"},
        "graph": graph_info,
        "partitions": partitions,
        "launcher_peak_rss_kib": peak_rss_kib(),
        "runs": runs,
    }
    single = runs.get("single")
    if single:
        sp = single["peak_rss_kib_max"]
        for r in runs.values():
            r["peak_ratio_to_single_per_rank"] = [k / sp for k in r["peak_rss_kib_per_rank"]]
            r["max_peak_ratio_to_single"] = r["peak_rss_kib_max"] / sp
            r["speedup_vs_single"] = single["epoch_s"] / r["epoch_s"]
        res["loss_check"] = {
            name: max(abs(a - b) for a, b in zip(r["losses"], single["losses"]))
            for name, r in runs.items() if r["world_size"] > 1}
        target = runs.get(f"P={TARGET_PARTS}")
        if target:
            ratio = target["peak_rss_kib_max"] / sp
            res["target"] = {"parts": TARGET_PARTS, "limit": TARGET_RATIO,
                             "single_peak_kib": sp,
                             "max_rank_peak_kib": target["peak_rss_kib_max"],
                             "ratio": ratio, "met": ratio <= TARGET_RATIO}

    log(format_report(res))
    out = result_path("fullgraph", args.out)
    out.write_text(json.dumps(res, indent=1))
    log(f"[out] wrote {out}")
    if args.json:
        print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
