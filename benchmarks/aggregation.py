#!/usr/bin/env python
"""Post vs. pre vs. hybrid aggregation of cut edges: rows, bytes, time, memory.

Usage::

    python -m benchmarks aggregation --quick                  # ~1 min smoke run
    python -m benchmarks aggregation                          # Cora + 1M-node synthetic
    python -m benchmarks aggregation --partition-only         # part 1 only (no training)
    python -m benchmarks aggregation --static-cache           # also part 3
    python -m benchmarks aggregation --json | jq .targets     # only the JSON on stdout

The three aggregation modes of :class:`~lightning_fullgraph.engine.FullGraphEngine`
(SuperGCN, ICS'25 §5): ``post`` sends the source row of every cut edge, ``pre`` lets the
sender pre-aggregate one partial row per remote destination, ``hybrid`` takes the exact
minimum vertex cover of every rank pair's cut edges (never more rows than either).

1. **Plan level** (no training; one child process): for Cora and the synthetic graph
   (:func:`~lightning_fullgraph.data.synthetic.synthetic_graph`, the default of
   ``benchmarks/fullgraph.py``: 1,000,000 nodes, average degree 10, 128 features, 16
   classes) at every P of ``--parts`` (2, 4, 8): the graph is partitioned with
   :func:`~lightning_fullgraph.partition.partition_graph` (cached under ``--cache-dir``),
   every rank's partition is loaded and its :class:`~lightning_fullgraph.partition.AggregationPlan`
   built for each mode.  Reported: rows per exchange (sum over ranks; the most any one
   rank sends / receives), the wall time of :func:`~lightning_fullgraph.partition.cut_cover`
   on the partition's owner vector and of building the plans, and the bytes one epoch of
   a 2-layer GCN moves, derived from the plans (below).  Ratios post/hybrid and post/pre.
2. **Measured** (fresh gloo processes per configuration, the launcher and worker of
   ``benchmarks/fullgraph.py``): a 2-layer GCN (hidden 128 on the synthetic graph, 16 on
   Cora) trained through the engine with ``aggregation=post|pre|hybrid`` and the
   aggregation kernels (``engine.use_kernels("auto")``), and a single process training
   plain PyG on the global graph with the same kernels (``kernels.accelerate(model,
   "auto")``).  Epoch time (slowest rank), halo bytes per epoch (``engine.stats``), per-rank
   peak RSS against the single process, the loss trajectory against the single process,
   and a check that every rank's measured bytes equal the bytes derived from its plan in
   part 1 (same partition directory).  By default with ``cache_static=False``
   (``--part2-cache-static``), so that every epoch moves what the aggregation mode decides;
   the engine's static cache is part 3.
3. **Static-input caching** (``--static-cache``): ``FullGraphEngine(cache_static=True)``
   vs. ``False`` (engine default aggregation) for GCN, SAGE and SAGE with input dropout
   (whose input is a new tensor every step, so nothing can be reused) at P = 1, 2, 4 on the
   synthetic graph, timed after ``--static-warmup`` (2) warm-up epochs because the cache
   fills during the first epochs.  If the engine does not accept the keyword, the section
   says so and nothing fails.

Plan-derived bytes.  Per rank, with ``ps``/``pr`` the post-channel rows it sends/receives per
exchange and ``qs``/``qr`` those of the pre channel (``AggregationPlan.post``/``.pre``), an
epoch whose layers exchange rows of widths ``w`` (float32) -- forward always, backward (the
rows' gradients, in the opposite direction) when the rows need a gradient -- and that
exchanges ``gcn_norm``'s degrees for ``D`` layers costs::

    forward  sent = 4 * (Wf * (ps + qs) + D * (ps + qr))    # Wf = sum of all widths
    forward  recv = 4 * (Wf * (pr + qr) + D * (pr + qs))
    backward sent = 4 *  Wb * (pr + qr)                      # Wb = widths with a gradient
    backward recv = 4 *  Wb * (ps + qs)

(degrees: one per halo source over the post channel, and in pre/hybrid one per pre slot,
sent by the slot destination's owner.)  The exchange models (:func:`exchange_model`):

* GCN, uncached (``cache_static=False``): ``GCNConv`` exchanges after its linear map, both
  layers with gradients -- widths (hidden, classes), ``D = 2``.  Every epoch alike.  This is
  "bytes per epoch" of part 1 and the target ratios.
* GCN, cached steady state (``cache_static=True`` after its first epochs): the engine keeps
  ``gcn_norm`` and the aggregation of the unchanged input features of layer 1, so only layer
  2 moves -- widths (classes), ``D = 0``.
* SAGE (mean), uncached or with input dropout: layer 1 aggregates the raw features (no
  gradient), layer 2 the hidden rows -- forward (features + hidden), backward (hidden).
  Cached steady state: layer 2 only.

"Bytes per epoch" is forward + backward bytes *sent*, summed over ranks.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

# No torch import here: this file is the launcher's (and spawned children's) main module;
# see benchmarks/fullgraph.py for why the launcher must stay small.
from . import fullgraph as fg  # launcher, worker, summaries
from ._common import add_out_argument, result_path

MODES = ("post", "pre", "hybrid")
DEFAULT_RESULTS = fg.DEFAULT_RESULTS
MiB = fg.MiB
#: Issue targets: bytes per epoch post-only / hybrid at the given P.
BYTES_TARGETS = {"cora": (4, 1.25), "synthetic": (4, 1.15)}
MEMORY_PARTS, MEMORY_LIMIT = fg.TARGET_PARTS, fg.TARGET_RATIO


# --------------------------------------------------------------------------- plan bytes


def epoch_bytes(counts: Dict[str, int], layers: Sequence[Sequence[Any]],
                degree_layers: int = 0, value_bytes: int = 4) -> Dict[str, int]:
    r"""Bytes one rank sends/receives in one epoch (see the module docstring).

    Args:
        counts: The rank's rows per exchange: ``post_send``, ``post_recv``, ``pre_send``,
            ``pre_recv``.
        layers: ``(width, backward)`` per exchanging layer.
        degree_layers: Layers that also exchange ``gcn_norm``'s degrees this epoch.
    """
    ps, pr = int(counts["post_send"]), int(counts["post_recv"])
    qs, qr = int(counts["pre_send"]), int(counts["pre_recv"])
    Wf = int(sum(w for w, _ in layers))
    Wb = int(sum(w for w, grad in layers if grad))
    D = int(degree_layers)
    return {"forward_bytes_sent": value_bytes * (Wf * (ps + qs) + D * (ps + qr)),
            "forward_bytes_received": value_bytes * (Wf * (pr + qr) + D * (pr + qs)),
            "backward_bytes_sent": value_bytes * Wb * (pr + qr),
            "backward_bytes_received": value_bytes * Wb * (ps + qs)}


def gcn_epoch_bytes(counts: Dict[str, int], widths: Sequence[int], degrees: bool = False,
                    value_bytes: int = 4) -> Dict[str, int]:
    r"""A GCN epoch whose layers exchange rows of :obj:`widths` with gradients, plus
    ``gcn_norm``'s degrees of every layer if :obj:`degrees`."""
    return epoch_bytes(counts, [(w, True) for w in widths], len(widths) if degrees else 0,
                       value_bytes)


def exchange_model(model: str, cached: bool, dims: Dict[str, int]) -> Dict[str, Any]:
    r"""What one (steady-state) epoch of the benchmark's 2-layer models exchanges; see the
    module docstring.  :obj:`dims`: ``in``, ``hidden``, ``classes``."""
    if model == "gcn":
        if cached:
            return {"layers": [(dims["classes"], True)], "degree_layers": 0}
        return {"layers": [(dims["hidden"], True), (dims["classes"], True)], "degree_layers": 2}
    if model == "sage":  # with input dropout pass cached=False: nothing can be reused
        if cached:
            return {"layers": [(dims["hidden"], True)], "degree_layers": 0}
        return {"layers": [(dims["in"], False), (dims["hidden"], True)], "degree_layers": 0}
    raise ValueError(model)


def expected_bytes(counts_per_rank: List[Dict[str, int]], xmodel: Dict[str, Any]
                   ) -> Dict[str, Any]:
    r"""Per-rank bytes of :func:`epoch_bytes` plus the total and largest bytes sent."""
    per_rank = [epoch_bytes(c, xmodel["layers"], xmodel["degree_layers"])
                for c in counts_per_rank]
    sent = [b["forward_bytes_sent"] + b["backward_bytes_sent"] for b in per_rank]
    return {"per_rank": per_rank, "epoch_bytes": int(sum(sent)),
            "epoch_bytes_max_rank": int(max(sent))}


def _ratio(a: float, b: float) -> float:
    return float(a) / float(b) if b else float("nan")


# --------------------------------------------------------------------------- part 1 (child)


def _load_graph(spec: Dict[str, Any]):
    if spec["kind"] == "cora":
        from lightning_fullgraph.data import load_cora
        return load_cora()
    from lightning_fullgraph.data.synthetic import synthetic_graph
    return synthetic_graph(spec["nodes"], avg_degree=spec["avg_degree"],
                           num_features=spec["features"], num_classes=spec["classes"],
                           seed=spec["seed"])


def _static_cache_probe() -> Dict[str, Any]:
    import inspect
    from lightning_fullgraph.engine import FullGraphEngine
    params = inspect.signature(FullGraphEngine).parameters
    return {"available": "static_inputs" in params,
            "engine_signature": "FullGraphEngine" + str(inspect.signature(FullGraphEngine))}


def _analyze(opts: Dict[str, Any]) -> Dict[str, Any]:
    r"""Part 1 for every data set: graph file, partitions, covers, plans, plan bytes."""
    out_stream = sys.stderr if opts["json"] else sys.stdout

    def log(*a):
        print(*a, file=out_stream, flush=True)

    os.environ["OMP_NUM_THREADS"] = str(opts["cores"])
    import torch
    import torch_geometric
    from lightning_fullgraph.partition import (MODES as LIB_MODES, build_plan, cut_cover,
                                               graph_fingerprint, load_partition,
                                               partition_graph, read_manifest)
    torch.set_num_threads(opts["cores"])
    assert tuple(LIB_MODES) == MODES, LIB_MODES
    cache = Path(opts["cache_dir"])
    cache.mkdir(parents=True, exist_ok=True)
    result: Dict[str, Any] = {"torch": str(torch.__version__),
                              "torch_geometric": str(torch_geometric.__version__),
                              "static_cache": _static_cache_probe(), "datasets": {}}

    for name, spec in opts["datasets"].items():
        t0 = time.perf_counter()
        data = _load_graph(spec)
        gen_s = time.perf_counter() - t0
        fingerprint = graph_fingerprint(data)
        graph_path = cache / f"graph-{fingerprint[:16]}.pt"
        if not graph_path.exists():  # the measured single process loads it
            tmp = graph_path.with_name(f".{graph_path.name}.tmp-{os.getpid()}")
            torch.save({k: v for k, v in data.to_dict().items()
                        if isinstance(v, torch.Tensor)}, tmp)
            os.replace(tmp, graph_path)
        ei = data.edge_index
        num_classes = int(data.y.max()) + 1
        dims = {"in": int(data.x.size(1)), "hidden": int(spec["hidden"]),
                "classes": num_classes}
        widths = [dims["hidden"], num_classes]
        g = {"name": name, "num_nodes": int(data.num_nodes), "num_edges": int(ei.size(1)),
             "num_features": int(data.x.size(1)), "num_classes": num_classes,
             "num_train": int(data.train_mask.sum()), "fingerprint": fingerprint,
             "path": str(graph_path), "load_or_generate_s": gen_s, "spec": spec,
             "gcn_widths": widths, "dims": dims}
        log(f"[{name}] {g['num_nodes']:,} nodes, {g['num_edges']:,} edges, "
            f"{g['num_features']} features, {num_classes} classes ({gen_s:.1f} s)")
        parts_out: Dict[str, Any] = {}
        for P in sorted(set(spec["parts"]) | set(spec.get("extra_parts", []))):
            buf = io.StringIO()
            t0 = time.perf_counter()
            with contextlib.redirect_stderr(buf):
                pdir = partition_graph(data, P, root=cache / "partitions", seed=spec["seed"])
            part_s = time.perf_counter() - t0
            text = buf.getvalue()
            reused = "reusing cached partition" in text
            log(f"[{name}] P={P}: partition {'reused' if reused else 'computed'} in "
                f"{part_s:.1f} s -> {pdir}")
            entry: Dict[str, Any] = {"dir": str(pdir), "partition_s": part_s,
                                     "reused": reused}
            parts_out[str(P)] = entry
            if P not in spec["parts"] or P < 2:
                continue  # only needed by a measured configuration
            manifest_stats = read_manifest(pdir).get("stats") or {}
            ranks = [load_partition(pdir, r, num_parts=P) for r in range(P)]
            owner = torch.full((g["num_nodes"], ), -1, dtype=torch.long)
            for r, part in enumerate(ranks):
                owner[part.owned_ids] = r
            assert int(owner.min()) >= 0, "partition does not cover every node"
            t0 = time.perf_counter()
            cover = cut_cover(ei, owner, P)
            cover_wall = time.perf_counter() - t0
            cut = int((owner[ei[0]] != owner[ei[1]]).sum())
            pair_ok = bool((cover.rows["hybrid"] <= torch.minimum(cover.rows["post"],
                                                                  cover.rows["pre"])).all())
            modes: Dict[str, Any] = {}
            for mode in MODES:
                t0 = time.perf_counter()
                plans = [build_plan(part, mode) for part in ranks]  # fresh, uncached
                plan_s = time.perf_counter() - t0
                counts = [{"post_send": p.post.num_send, "post_recv": p.post.num_recv,
                           "pre_send": p.pre.num_send, "pre_recv": p.pre.num_recv}
                          for p in plans]
                sent = [c["post_send"] + c["pre_send"] for c in counts]
                recv = [c["post_recv"] + c["pre_recv"] for c in counts]
                modes[mode] = {
                    "rows_sum": int(sum(sent)), "rows_max_sent": int(max(sent)),
                    "rows_max_received": int(max(recv)),
                    "rows_sent_per_rank": sent, "rows_received_per_rank": recv,
                    "post_channel_rows": int(sum(c["post_send"] for c in counts)),
                    "pre_channel_rows": int(sum(c["pre_send"] for c in counts)),
                    "counts_per_rank": counts, "plan_build_s": plan_s,
                    "cover_rows": int(cover.rows[mode].sum()),
                    "manifest_rows": (manifest_stats.get("mode_rows") or {}).get(mode),
                    "gcn_bytes": expected_bytes(counts, exchange_model("gcn", False, dims)),
                    "gcn_bytes_cached": expected_bytes(counts,
                                                       exchange_model("gcn", True, dims)),
                }
                m = modes[mode]
                m["rows_consistent"] = (m["rows_sum"] == m["cover_rows"] == int(sum(recv))
                                        and m["manifest_rows"] in (None, m["rows_sum"]))
            post, pre, hyb = modes["post"], modes["pre"], modes["hybrid"]
            entry.update({
                "num_parts": P, "edge_cut": cut, "edge_cut_fraction": cut / max(1, g["num_edges"]),
                "cover_s": cover.seconds, "cover_wall_s": cover_wall,
                "hybrid_le_min_per_pair": pair_ok, "modes": modes,
                "ratios": {
                    "rows_post_over_hybrid": _ratio(post["rows_sum"], hyb["rows_sum"]),
                    "rows_post_over_pre": _ratio(post["rows_sum"], pre["rows_sum"]),
                    "bytes_post_over_hybrid": _ratio(post["gcn_bytes"]["epoch_bytes"],
                                                     hyb["gcn_bytes"]["epoch_bytes"]),
                    "bytes_post_over_pre": _ratio(post["gcn_bytes"]["epoch_bytes"],
                                                  pre["gcn_bytes"]["epoch_bytes"]),
                    "max_rank_bytes_post_over_hybrid": _ratio(
                        post["gcn_bytes"]["epoch_bytes_max_rank"],
                        hyb["gcn_bytes"]["epoch_bytes_max_rank"]),
                    "cached_bytes_post_over_hybrid": _ratio(
                        post["gcn_bytes_cached"]["epoch_bytes"],
                        hyb["gcn_bytes_cached"]["epoch_bytes"]),
                }})
            log(f"[{name}] P={P}: rows post {post['rows_sum']:,} pre {pre['rows_sum']:,} "
                f"hybrid {hyb['rows_sum']:,}; cut_cover {cover.seconds:.2f} s")
            del ranks, plans, owner, cover
        g["partitions"] = parts_out
        result["datasets"][name] = g
        del data
    result["peak_rss_kib"] = fg.peak_rss_kib()
    return result


def _analyze_worker(opts: Dict[str, Any], rank: int, world: int, port: int, out_queue) -> None:
    try:
        out_queue.put((rank, True, _analyze(opts)))
    except BaseException:
        out_queue.put((rank, False, traceback.format_exc()))


# --------------------------------------------------------------------------- parts 2, 3


def _epoch_comm(ranks: List[Dict[str, Any]]) -> Dict[str, Any]:
    r"""Halo bytes per epoch from the per-rank records: timed epochs, and every epoch."""
    timed = [[e for e in r["epochs"] if not e["warmup"]] for r in ranks]
    keys = ("forward_bytes_sent", "forward_bytes_received", "backward_bytes_sent",
            "backward_bytes_received")
    per_rank = []
    for t in timed:
        per_epoch = [e["comm"]["forward_bytes_sent"] + e["comm"]["backward_bytes_sent"]
                     for e in t]
        per_rank.append({"sent_per_epoch": fg._mean(per_epoch),
                         "constant": len(set(per_epoch)) <= 1,
                         **{k: fg._mean([e["comm"][k] for e in t]) for k in keys}})
    n = len(ranks[0]["epochs"])
    every = [sum(r["epochs"][i]["comm"]["forward_bytes_sent"]
                 + r["epochs"][i]["comm"]["backward_bytes_sent"] for r in ranks)
             for i in range(n)]
    return {"per_rank": per_rank,
            "bytes_per_epoch": sum(r["sent_per_epoch"] for r in per_rank),
            "bytes_per_epoch_max_rank": max(r["sent_per_epoch"] for r in per_rank),
            "bytes_every_epoch": every,  # all epochs, warm-up included, summed over ranks
            "exchange_s_max_rank": max(fg._mean([e["comm"]["seconds"] for e in t])
                                       for t in timed)}


def _check_bytes(ranks: List[Dict[str, Any]], plan_entry: Optional[Dict[str, Any]],
                 pdir: str, model: str, dims: Dict[str, int], dropout: bool
                 ) -> Dict[str, Any]:
    r"""Measured bytes of every rank == bytes derived from its plan in part 1.

    Uncached ranks (``cache_static`` off, or SAGE with input dropout): every epoch, warm-up
    included, against the uncached model.  Cached ranks: the timed epochs against the cached
    steady-state model -- the cache fills during the warm-up.
    """
    if plan_entry is None or "modes" not in plan_entry:
        return {"checked": False, "reason": "no plan-level entry for this P"}
    if plan_entry["dir"] != pdir:
        return {"checked": False, "reason": "different partition directory"}
    mode = ranks[0].get("aggregation")
    if mode not in MODES or any(r.get("aggregation") != mode for r in ranks):
        return {"checked": False, "reason": f"unknown aggregation of the ranks: {mode!r}"}
    cached = all(bool(r.get("cache_static")) for r in ranks)
    if cached != any(bool(r.get("cache_static")) for r in ranks):
        return {"checked": False, "reason": "ranks disagree on cache_static"}
    xmodel = exchange_model(model, cached and not dropout, dims)
    counts = plan_entry["modes"][mode]["counts_per_rank"]
    exp = expected_bytes(counts, xmodel)
    mismatches, checked = [], 0
    for r in ranks:
        plan = r["local"].get("plan")
        if plan is not None and any(plan[k] != counts[r["rank"]][k] for k in counts[0]):
            mismatches.append({"rank": r["rank"], "what": "plan rows", "rank_plan": plan,
                               "part1_plan": counts[r["rank"]]})
        for e in r["epochs"]:
            if cached and e["warmup"]:
                continue
            checked += 1
            for k, v in exp["per_rank"][r["rank"]].items():
                if int(e["comm"][k]) != int(v):
                    mismatches.append({"rank": r["rank"], "epoch": e["epoch"], "key": k,
                                       "measured": int(e["comm"][k]), "expected": int(v)})
    return {"checked": True, "equal": not mismatches, "mismatches": mismatches[:20],
            "rank_epochs_checked": checked, "cache_static": cached, "mode": mode,
            "model": xmodel, "epochs": "timed" if cached else "all",
            "expected_bytes_per_epoch": exp["epoch_bytes"]}


def _run(cfg: Dict[str, Any], name: str, world: int, cores: int, timeout: float,
         log) -> Dict[str, Any]:
    threads = max(1, cores // world)
    cfg = dict(cfg, threads=threads)
    log(f"[run] {name}: {world} process(es) x {threads} thread(s) ...")
    t0 = time.perf_counter()
    ranks = fg.spawn_config(cfg, world, timeout)
    summary = fg.summarize(name, world, threads, ranks, cores)
    summary["wall_s"] = time.perf_counter() - t0
    summary["per_rank_records"] = ranks
    summary["config"] = {k: v for k, v in cfg.items()
                         if k not in ("graph_path", "partition_dir")}
    summary["aggregation"] = ranks[0].get("aggregation")
    summary["cache_static"] = ranks[0].get("cache_static")
    if world > 1 or cfg.get("engine_single"):
        summary["halo"] = _epoch_comm(ranks)
    msg = (f"[run] {name}: epoch {summary['epoch_s']:.2f} s, max peak RSS "
           f"{summary['peak_rss_kib_max'] / 1024:,.0f} MiB")
    if "halo" in summary:
        msg += f", halo {summary['halo']['bytes_per_epoch'] / MiB:,.1f} MiB/epoch"
    log(msg + f" (wall {summary['wall_s']:.0f} s)")
    return summary


def _base_cfg(args, g: Dict[str, Any]) -> Dict[str, Any]:
    return {"model": "gcn", "kernels": args.kernels, "hidden": g["dims"]["hidden"],
            "num_classes": g["num_classes"], "epochs": args.epochs, "warmup": args.warmup,
            "seed": args.seed, "timeout_s": args.timeout, "graph_path": g["path"]}


def _single(args, prep, ds: str, singles: Dict[str, Any], log) -> Optional[Dict[str, Any]]:
    r"""The single-process baseline of data set :obj:`ds` (run once per invocation)."""
    if args.no_single:
        return None
    if ds not in singles:
        g = prep["datasets"][ds]
        singles[ds] = _run(dict(_base_cfg(args, g), partition_dir=None), f"{ds} single", 1,
                           args.cores, args.timeout, log)
    return singles[ds]


def _against_single(r: Dict[str, Any], single: Optional[Dict[str, Any]],
                    losses: bool = True) -> None:
    if single is None:
        return
    sp = single["peak_rss_kib_max"]
    r["max_peak_ratio_to_single"] = r["peak_rss_kib_max"] / sp
    r["peak_ratio_to_single_per_rank"] = [k / sp for k in r["peak_rss_kib_per_rank"]]
    r["speedup_vs_single"] = _ratio(single["epoch_s"], r["epoch_s"])
    if losses and len(r["losses"]) == len(single["losses"]):
        r["loss_max_abs_diff_vs_single"] = max(
            abs(a - b) for a, b in zip(r["losses"], single["losses"]))


def _cache_kwarg(setting: str) -> Optional[bool]:
    return {"off": False, "on": True, "default": None}[setting]


def _measure(args, prep, singles, log) -> Dict[str, Any]:
    r"""Part 2: per data set, the single process and P ranks per mode (GCN)."""
    out: Dict[str, Any] = {}
    cache = _cache_kwarg(args.part2_cache_static)
    if cache is not None and not prep["static_cache"]["available"]:
        cache = None  # an engine without the keyword has no cache to switch
    for ds, parts_list in (("synthetic", args.measure_parts_list),
                           ("cora", args.cora_measure_parts_list)):
        if not parts_list or ds not in prep["datasets"]:
            continue
        g = prep["datasets"][ds]
        base = _base_cfg(args, g)
        runs: Dict[str, Any] = {}
        t_ds = time.perf_counter()
        single = _single(args, prep, ds, singles, log)
        if single is not None:
            runs["single"] = single
        for P in parts_list:
            entry = g["partitions"][str(P)]
            for mode in args.modes_list:
                name = f"P={P} {mode}"
                r = _run(dict(base, partition_dir=entry["dir"], aggregation=mode,
                              cache_static=cache),
                         f"{ds} {name}", P, args.cores, args.timeout, log)
                r["mode"], r["parts"] = mode, P
                r["bytes_check"] = _check_bytes(r["per_rank_records"], entry, entry["dir"],
                                                "gcn", g["dims"], False)
                _against_single(r, single)
                runs[name] = r
        for name, r in runs.items():
            post = runs.get(f"P={r.get('parts')} post")
            if r["world_size"] > 1 and post is not None:
                r["bytes_post_over_this"] = _ratio(post["halo"]["bytes_per_epoch"],
                                                   r["halo"]["bytes_per_epoch"])
                r["speedup_vs_post"] = _ratio(post["epoch_s"], r["epoch_s"])
        out[ds] = {"runs": runs, "wall_s": time.perf_counter() - t_ds,
                   "cache_static": args.part2_cache_static}
    return out


def _static_cache(args, prep, singles, log) -> Dict[str, Any]:
    r"""Part 3: cache_static on/off for GCN, SAGE, SAGE + input dropout."""
    probe = prep["static_cache"]
    if not probe["available"]:
        return {"available": False,
                "reason": "FullGraphEngine does not accept cache_static (yet); its signature: "
                          + probe["engine_signature"]}
    g = prep["datasets"]["synthetic"]
    single = _single(args, prep, "synthetic", singles, log)
    base = dict(_base_cfg(args, g), warmup=args.static_warmup, next_step=True)
    variants = [("gcn", "gcn", 0.0), ("sage", "sage", 0.0),
                (f"sage+dropout{args.static_dropout:g}", "sage", args.static_dropout)]
    runs: Dict[str, Any] = {}
    t0 = time.perf_counter()
    for label, model, dropout in variants:
        for P in args.static_parts_list:
            entry = g["partitions"][str(P)]
            for cs in (False, True):
                name = f"{label} P={P} cache_static={cs}"
                cfg = dict(base, model=model, input_dropout=dropout, cache_static=cs,
                           partition_dir=entry["dir"], engine_single=(P == 1))
                r = _run(cfg, name, P, args.cores, args.timeout, log)
                r.update({"variant": label, "model": model, "parts": P, "cache_static": cs,
                          "input_dropout": dropout})
                if P > 1:
                    r["bytes_check"] = _check_bytes(r["per_rank_records"], entry, entry["dir"],
                                                    model, g["dims"], dropout > 0)
                if model == "gcn":
                    _against_single(r, single, losses=False)
                runs[name] = r
            off, on = runs[f"{label} P={P} cache_static=False"], runs[name]
            on["speedup_vs_off"] = _ratio(off["epoch_s"], on["epoch_s"])
            on["bytes_on_over_off"] = _ratio(on["halo"]["bytes_per_epoch"],
                                             off["halo"]["bytes_per_epoch"])
            if not dropout:
                on["loss_max_abs_diff_vs_off"] = max(
                    abs(a - b) for a, b in zip(on["losses"], off["losses"]))
    return {"available": True, "engine_signature": probe["engine_signature"], "runs": runs,
            "warmup": args.static_warmup, "wall_s": time.perf_counter() - t0}


# --------------------------------------------------------------------------- report


def _targets(res: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for ds, (P, limit) in BYTES_TARGETS.items():
        g = res["plan"]["datasets"].get(ds)
        entry = (g or {}).get("partitions", {}).get(str(P))
        if entry and "ratios" in entry:
            ratio = entry["ratios"]["bytes_post_over_hybrid"]
            t = out[f"bytes_{ds}_P{P}"] = {
                "what": f"GCN bytes per epoch post-only / hybrid on {ds} at P={P} "
                        f"(plan-derived, uncached)", "ratio": ratio, "limit": limit,
                "met": ratio >= limit,
                "all_parts": {p: e["ratios"]["bytes_post_over_hybrid"]
                              for p, e in g["partitions"].items() if "ratios" in e}}
            m = res.get("measured", {}).get(ds, {}).get("runs", {})
            if f"P={P} post" in m and f"P={P} hybrid" in m:
                t["measured_ratio"] = _ratio(m[f"P={P} post"]["halo"]["bytes_per_epoch"],
                                             m[f"P={P} hybrid"]["halo"]["bytes_per_epoch"])
    mem_runs = [(f"part 2 {n}", r) for n, r in
                res.get("measured", {}).get("synthetic", {}).get("runs", {}).items()]
    sc = res.get("static_cache") or {}
    mem_runs += [(f"part 3 {n}", r) for n, r in (sc.get("runs") or {}).items()
                 if r.get("model") == "gcn"]
    for name, r in mem_runs:
        if r.get("parts") == MEMORY_PARTS and "max_peak_ratio_to_single" in r:
            ratio = r["max_peak_ratio_to_single"]
            out[f"memory_synthetic_{name.replace(' ', '_')}"] = {
                "what": f"max rank peak RSS / single-process peak, synthetic GCN, {name} "
                        f"(cache_static={r.get('cache_static')}), kernels "
                        f"'{r['config']['kernels']}' on both sides",
                "ratio": ratio, "limit": MEMORY_LIMIT, "met": ratio <= MEMORY_LIMIT}
    checks = [r["bytes_check"] for d in res.get("measured", {}).values()
              for r in d["runs"].values() if "bytes_check" in r]
    checks += [r["bytes_check"] for r in (sc.get("runs") or {}).values()
               if "bytes_check" in r]
    if checks:
        done = [c for c in checks if c.get("checked")]
        out["measured_bytes_equal_plan"] = {
            "what": "every rank's measured bytes == plan-derived bytes (uncached: every "
                    "epoch; cached: timed epochs vs the steady-state model)",
            "configs_checked": len(done),
            "configs_equal": sum(1 for c in done if c["equal"]),
            "met": bool(done) and all(c["equal"] for c in done)}
    return out


def _mib(b: float) -> str:
    return f"{b / MiB:,.2f}"


def _opt(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _eq(chk: Dict[str, Any]) -> str:
    return "-" if not chk.get("checked") else ("yes" if chk["equal"] else "NO")


def format_report(res: Dict[str, Any]) -> str:
    L: List[str] = []
    meta, plan = res["meta"], res["plan"]
    L.append("")
    L.append(f"== lightning-fullgraph aggregation benchmark: post vs pre vs hybrid  "
             f"({meta['timestamp']}) ==")
    L.append(f"machine: {meta['platform']}, {meta['cores']} cores, torch {plan['torch']}, "
             f"torch_geometric {plan['torch_geometric']}")
    for ds, g in plan["datasets"].items():
        L.append(f"{ds}: {g['num_nodes']:,} nodes, {g['num_edges']:,} edges, "
                 f"{g['num_features']} features, {g['num_classes']} classes; 2-layer GCN, "
                 f"hidden {g['dims']['hidden']}")

    L.append("")
    L.append("1a. Rows per exchange by mode (plan-derived; sum over ranks | max rank sent/recv)")
    hdr = (f"{'graph':<10}{'P':>3}{'cut %':>7}{'post rows':>12}{'max s/r':>17}"
           f"{'pre rows':>12}{'max s/r':>17}{'hybrid rows':>13}{'max s/r':>17}"
           f"{'post/hyb':>9}{'post/pre':>9}{'cover s':>9}{'plans s':>9}{'ok':>4}")
    L.append(hdr)
    L.append("-" * len(hdr))
    for ds, g in plan["datasets"].items():
        for P, e in g["partitions"].items():
            if "modes" not in e:
                continue
            m, rt = e["modes"], e["ratios"]
            cells = "".join(
                f"{m[k]['rows_sum']:>{12 if k != 'hybrid' else 13},}"
                f"{str(m[k]['rows_max_sent']) + '/' + str(m[k]['rows_max_received']):>17}"
                for k in MODES)
            ok = all(m[k]["rows_consistent"] for k in MODES) and e["hybrid_le_min_per_pair"]
            L.append(f"{ds:<10}{P:>3}{100 * e['edge_cut_fraction']:>6.1f}%{cells}"
                     f"{rt['rows_post_over_hybrid']:>8.3f}x{rt['rows_post_over_pre']:>8.3f}x"
                     f"{e['cover_s']:>9.3f}{sum(m[k]['plan_build_s'] for k in MODES):>9.3f}"
                     f"{'yes' if ok else 'NO':>4}")
    L.append("  cover s = cut_cover() on the partition's owner vector (all rank pairs, one "
             "matching); plans s = build_plan() for all ranks, all three modes;")
    L.append("  ok = rows agree between plans, cut_cover and the manifest, and hybrid <= "
             "min(post, pre) for every rank pair.")

    L.append("")
    L.append("1b. Halo bytes per epoch of a 2-layer GCN (plan-derived; fwd+bwd sent, summed "
             "over ranks; MiB)")
    hdr = (f"{'graph':<10}{'P':>3}{'post':>12}{'pre':>12}{'hybrid':>12}{'post/hyb':>10}"
           f"{'post/pre':>10}{'max rank post':>15}{'max rank hyb':>14}{'post/hyb':>10}"
           f"{'cached post':>13}{'cached hyb':>12}{'post/hyb':>10}")
    L.append(hdr)
    L.append("-" * len(hdr))
    for ds, g in plan["datasets"].items():
        for P, e in g["partitions"].items():
            if "modes" not in e:
                continue
            m, rt = e["modes"], e["ratios"]
            L.append(f"{ds:<10}{P:>3}"
                     + "".join(f"{_mib(m[k]['gcn_bytes']['epoch_bytes']):>12}" for k in MODES)
                     + f"{rt['bytes_post_over_hybrid']:>9.3f}x{rt['bytes_post_over_pre']:>9.3f}x"
                     f"{_mib(m['post']['gcn_bytes']['epoch_bytes_max_rank']):>15}"
                     f"{_mib(m['hybrid']['gcn_bytes']['epoch_bytes_max_rank']):>14}"
                     f"{rt['max_rank_bytes_post_over_hybrid']:>9.3f}x"
                     f"{_mib(m['post']['gcn_bytes_cached']['epoch_bytes']):>13}"
                     f"{_mib(m['hybrid']['gcn_bytes_cached']['epoch_bytes']):>12}"
                     f"{rt['cached_bytes_post_over_hybrid']:>9.3f}x")
    L.append("  post/pre/hybrid = uncached epoch (cache_static=False): both layers' rows fwd+bwd "
             "+ gcn_norm degrees; max rank = the rank sending most;")
    L.append("  cached = steady-state epoch with cache_static=True (layer 1's aggregation of the "
             "static input and gcn_norm kept): layer 2's rows only.")

    measured = res.get("measured")
    if measured:
        L.append("")
        L.append("2. Measured: 2-layer GCN through FullGraphEngine on gloo (fresh processes per "
                 f"row), kernels '{meta['kernels']}' in ranks and single process; "
                 f"{meta['warmup']} warm-up + {meta['epochs']} timed epochs; cache_static "
                 f"{meta['part2_cache_static']}")
        hdr = (f"{'graph':<10}{'config':<14}{'procs x thr':>12}{'epoch s':>9}{'± sd':>7}"
               f"{'CPU s':>8}{'exch s':>8}{'halo MiB/ep':>12}{'max rank':>10}{'plan MiB':>10}"
               f"{'= plan':>7}{'post/this':>10}{'vs post':>9}{'peak MiB':>10}"
               f"{'/single':>9}{'loss diff':>11}")
        L.append(hdr)
        L.append("-" * len(hdr))
        for ds, d in measured.items():
            for name, r in d["runs"].items():
                h, chk = r.get("halo"), r.get("bytes_check", {})
                L.append(
                    f"{ds:<10}{name:<14}"
                    f"{'%d x %d' % (r['world_size'], r['threads_per_process']):>12}"
                    f"{r['epoch_s']:>9.3f}{r['epoch_s_std']:>7.3f}"
                    f"{r['cpu_s_sum_over_ranks']:>8.2f}"
                    f"{_opt(h and h['exchange_s_max_rank'], '{:.3f}'):>8}"
                    f"{(_mib(h['bytes_per_epoch']) if h else '-'):>12}"
                    f"{(_mib(h['bytes_per_epoch_max_rank']) if h else '-'):>10}"
                    f"{(_mib(chk['expected_bytes_per_epoch']) if chk.get('checked') else '-'):>10}"
                    f"{_eq(chk):>7}"
                    f"{_opt(r.get('bytes_post_over_this'), '{:.3f}x'):>10}"
                    f"{_opt(r.get('speedup_vs_post'), '{:.2f}x'):>9}"
                    f"{r['peak_rss_kib_max'] / 1024:>10,.0f}"
                    f"{_opt(r.get('max_peak_ratio_to_single'), '{:.1%}'):>9}"
                    f"{_opt(r.get('loss_max_abs_diff_vs_single'), '{:.1e}'):>11}")
        L.append("  epoch s = slowest rank (fwd + bwd + step); CPU s = process CPU time per "
                 "epoch summed over ranks (robust to other load);")
        L.append("  exch s = the slowest rank's seconds inside the exchange (includes waiting);")
        L.append("  halo MiB/ep = engine.stats fwd+bwd bytes sent, summed over ranks (max rank: "
                 "the largest single rank); = plan: every rank's four byte counters")
        L.append("  equal part 1's plan-derived ones (uncached: every epoch, warm-up included); "
                 "post/this = measured bytes of post over this mode;")
        L.append("  vs post = epoch-time speedup over post; peak MiB = max over ranks of "
                 "ru_maxrss; /single = that over the single process's peak;")
        L.append("  loss diff = max |loss - single-process loss| over all epochs.")
        if any(r["oversubscribed"] for d in measured.values() for r in d["runs"].values()):
            L.append(f"  NOTE: {meta['cores']} cores: configurations with P x threads > cores "
                     "are oversubscribed; their epoch times say more about the machine.")
        mem = [(ds, n, r) for ds, d in measured.items() for n, r in d["runs"].items()
               if ds == "synthetic"]
        if mem:
            L.append("")
            L.append("2b. Memory per process, synthetic (MiB; ru_maxrss of fresh processes)")
            hdr = (f"{'config':<14}{'rank':>5}{'import':>8}{'+lib':>7}{'loaded':>8}"
                   f"{'peak':>8}{'/single':>9}{'net/single':>12}{'owned':>10}{'halo':>10}")
            L.append(hdr)
            L.append("-" * len(hdr))
            single = measured["synthetic"]["runs"].get("single")
            sp = single["peak_rss_kib_max"] if single else None
            s_base = single["ranks"][0]["rss_after_import_torch_pyg_kib"] if single else None
            for ds, name, r in mem:
                for x in r["ranks"]:
                    net = ((x["peak_rss_kib"] - x["rss_after_import_torch_pyg_kib"])
                           / (sp - s_base)) if sp else None
                    L.append(
                        f"{name:<14}{x['rank']:>5}{fg._mib(x['rss_after_import_torch_pyg_kib']):>8}"
                        f"{fg._mib(x['rss_after_library_import_kib']):>7}"
                        f"{fg._mib(x['rss_after_load_kib']):>8}{fg._mib(x['peak_rss_kib']):>8}"
                        f"{_opt(x['peak_rss_kib'] / sp if sp else None, '{:.1%}'):>9}"
                        f"{_opt(net, '{:.1%}'):>12}{x['local']['num_nodes']:>10,}"
                        f"{x['local']['num_halo']:>10,}")
            L.append("  import = after `import torch, torch_geometric`; +lib = after importing "
                     "lightning_fullgraph; loaded = after loading graph/partition;")
            L.append("  net/single = (peak - import) over the single process's (peak - import).")

    sc = res.get("static_cache")
    if sc is not None:
        L.append("")
        if not sc.get("available"):
            L.append("3. Static-input caching: NOT AVAILABLE -- " + sc["reason"])
        else:
            L.append("3. Static-input caching (FullGraphEngine(cache_static=...)), synthetic "
                     f"graph, engine default aggregation; {sc['warmup']} warm-up + "
                     f"{meta['epochs']} timed epochs")
            hdr = (f"{'variant':<18}{'P':>3}{'cache':>6}{'epoch s':>9}{'± sd':>7}"
                   f"{'CPU s':>8}{'MiB ep0':>10}{'MiB ep1':>10}{'MiB/ep':>10}{'model MiB':>11}{'=':>4}"
                   f"{'speedup':>9}{'bytes on/off':>13}{'peak MiB':>10}{'/single':>9}"
                   f"{'loss diff':>11}")
            L.append(hdr)
            L.append("-" * len(hdr))
            for name, r in sc["runs"].items():
                h, chk = r["halo"], r.get("bytes_check", {})
                every = h["bytes_every_epoch"]
                L.append(
                    f"{r['variant']:<18}{r['parts']:>3}{'on' if r['cache_static'] else 'off':>6}"
                    f"{r['epoch_s']:>9.3f}{r['epoch_s_std']:>7.3f}"
                    f"{r['cpu_s_sum_over_ranks']:>8.2f}"
                    f"{_mib(every[0]):>10}{(_mib(every[1]) if len(every) > 1 else '-'):>10}"
                    f"{_mib(h['bytes_per_epoch']):>10}"
                    f"{(_mib(chk['expected_bytes_per_epoch']) if chk.get('checked') else '-'):>11}"
                    f"{_eq(chk):>4}"
                    f"{_opt(r.get('speedup_vs_off'), '{:.2f}x'):>9}"
                    f"{_opt(r.get('bytes_on_over_off'), '{:.3f}'):>13}"
                    f"{r['peak_rss_kib_max'] / 1024:>10,.0f}"
                    f"{_opt(r.get('max_peak_ratio_to_single'), '{:.1%}'):>9}"
                    f"{_opt(r.get('loss_max_abs_diff_vs_off'), '{:.1e}'):>11}")
            L.append("  MiB ep0 / ep1 = halo bytes of the first two (warm-up) epochs; MiB/ep = "
                     "timed-epoch mean; model = plan-derived bytes of the exchange model")
            L.append("  (module docstring; cached rows: steady state) and = whether every rank "
                     "matched it; speedup = epoch time off / on; bytes on/off = MiB/ep ratio;")
            L.append("  /single = GCN peak over the single process of part 2; loss diff = max "
                     "|loss on - loss off| over all epochs.")

    t = res.get("targets") or {}
    if t:
        L.append("")
        for key, v in t.items():
            if "ratio" in v:
                sign = ">=" if key.startswith("bytes") else "<="
                extra = ""
                if "measured_ratio" in v:
                    extra = f" (measured: {v['measured_ratio']:.3f}x)"
                if "all_parts" in v:
                    extra += "; all P: " + ", ".join(f"P={p} {x:.3f}x"
                                                     for p, x in v["all_parts"].items())
                val = (f"{v['ratio']:.3f}x" if key.startswith("bytes")
                       else f"{100 * v['ratio']:.1f}%")
                lim = (f"{v['limit']:.2f}x" if key.startswith("bytes")
                       else f"{100 * v['limit']:.0f}%")
                L.append(f"TARGET  {v['what']}: {val} ({sign} {lim}) -> "
                         f"{'MET' if v['met'] else 'NOT MET'}{extra}")
            else:
                L.append(f"CHECK   {v['what']}: {v['configs_equal']}/{v['configs_checked']} "
                         f"configurations -> {'OK' if v['met'] else 'MISMATCH'}")
    L.append("")
    L.append("timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in meta["timings_s"].items()))
    L.append("")
    return "\n".join(L)


# --------------------------------------------------------------------------- main


def _ints(text: str) -> List[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/aggregation.py",
        description=("Compare post / pre / hybrid aggregation of cut edges: rows and bytes "
                     "per epoch from the partitions' plans (Cora and a synthetic graph), "
                     "cover time, and measured epoch time, halo bytes and per-rank memory on "
                     "gloo processes (with a check that measured bytes equal the plan's)."),
        formatter_class=fg._HelpFormatter,
        epilog=("examples:\n"
                "  python -m benchmarks aggregation --quick\n"
                "  python -m benchmarks aggregation --partition-only\n"
                "  python -m benchmarks aggregation --measure-parts 2,4 --modes post,hybrid\n"
                "  python -m benchmarks aggregation --static-cache --partition-only\n"))
    p.add_argument("--datasets", default="cora,synthetic",
                   help="data sets of part 1 (comma-separated: cora, synthetic)")
    p.add_argument("--parts", default="2,4,8", help="P of part 1 (plan level)")
    p.add_argument("--nodes", type=int, default=None,
                   help="synthetic nodes (default 1,000,000; 50,000 with --quick)")
    p.add_argument("--avg-degree", type=float, default=10.0, help="synthetic average degree")
    p.add_argument("--features", type=int, default=128, help="synthetic features")
    p.add_argument("--classes", type=int, default=16, help="synthetic classes")
    p.add_argument("--hidden", type=int, default=128, help="GCN hidden size, synthetic")
    p.add_argument("--cora-hidden", type=int, default=16, help="GCN hidden size, Cora")
    p.add_argument("--partition-only", action="store_true",
                   help="part 1 only: no training processes (also no part 3)")
    p.add_argument("--measure-parts", default=None,
                   help="P of the measured runs on the synthetic graph (default 2,4; 2 with "
                        "--quick; empty: none)")
    p.add_argument("--cora-measure-parts", default=None,
                   help="P of the measured runs on Cora (default 2,4; none with --quick)")
    p.add_argument("--modes", default=None,
                   help="aggregation modes measured (default post,pre,hybrid; post,hybrid "
                        "with --quick)")
    p.add_argument("--no-single", action="store_true",
                   help="skip the single-process baselines (no memory ratios)")
    p.add_argument("--kernels", choices=("pyg", "auto", "cpp", "torch"), default="auto",
                   help="aggregation backend, on both sides (engine.use_kernels / "
                        "kernels.accelerate)")
    p.add_argument("--static-cache", action="store_true",
                   help="part 3: FullGraphEngine(cache_static=True/False), GCN, SAGE, "
                        "SAGE + input dropout")
    p.add_argument("--static-parts", default=None,
                   help="P of part 3 (default 1,2,4; 1,2 with --quick)")
    p.add_argument("--static-dropout", type=float, default=0.5,
                   help="input dropout of the SAGE variant of part 3")
    p.add_argument("--static-warmup", type=int, default=2,
                   help="warm-up epochs of part 3 (the cache fills during the first epochs)")
    p.add_argument("--part2-cache-static", choices=("off", "on", "default"), default="off",
                   help="cache_static of the part-2 runs: off isolates the aggregation modes "
                        "(every epoch alike); default = not passed (the engine's default)")
    p.add_argument("--epochs", type=int, default=None,
                   help="timed epochs (default 3; 2 with --quick)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up epochs (not timed)")
    p.add_argument("--cores", type=int, default=fg.available_cores(),
                   help="cores shared by the processes of a configuration")
    p.add_argument("--seed", type=int, default=0, help="graph, METIS and model seed")
    p.add_argument("--quick", action="store_true",
                   help="smoke run (~1 min): 50,000-node synthetic graph, fewer runs")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_RESULTS / "cache",
                   help="saved graphs and partitions (shared with the fullgraph topic)")
    add_out_argument(p, file_ok=True)  # aggregation-<time>.json (aggregation-quick-... with --quick)
    p.add_argument("--json", action="store_true",
                   help="print only the JSON result on stdout (tables go to stderr)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds allowed per configuration (also the gloo timeout)")
    args = p.parse_args(argv)
    q = args.quick
    if args.nodes is None:
        args.nodes = 50_000 if q else 1_000_000
    args.parts_list = _ints(args.parts)
    args.datasets_list = [d.strip().lower() for d in args.datasets.split(",") if d.strip()]
    for d in args.datasets_list:
        if d not in ("cora", "synthetic"):
            p.error(f"unknown data set {d!r} (cora, synthetic)")
    if any(P < 2 for P in args.parts_list):
        p.error("--parts must be >= 2")
    default = {"measure": "2" if q else "2,4", "cora": "" if q else "2,4",
               "modes": "post,hybrid" if q else "post,pre,hybrid",
               "static": "1,2" if q else "1,2,4"}
    args.measure_parts_list = [] if args.partition_only else _ints(
        args.measure_parts if args.measure_parts is not None else default["measure"])
    args.cora_measure_parts_list = [] if args.partition_only else _ints(
        args.cora_measure_parts if args.cora_measure_parts is not None else default["cora"])
    if "synthetic" not in args.datasets_list:
        args.measure_parts_list = []
    if "cora" not in args.datasets_list:
        args.cora_measure_parts_list = []
    if any(P < 2 for P in args.measure_parts_list + args.cora_measure_parts_list):
        p.error("measured P must be >= 2")
    args.modes_list = [m.strip() for m in (args.modes or default["modes"]).split(",")
                       if m.strip()]
    if any(m not in MODES for m in args.modes_list):
        p.error(f"--modes must be among {MODES}")
    args.static_parts_list = _ints(args.static_parts or default["static"])
    if args.static_cache and "synthetic" not in args.datasets_list:
        p.error("--static-cache needs the synthetic data set")
    if args.partition_only:
        args.static_cache = False
    if args.static_warmup < 0:
        p.error("need --static-warmup >= 0")
    if args.epochs is None:
        args.epochs = 2 if q else 3
    if args.epochs < 1 or args.warmup < 0:
        p.error("need --epochs >= 1 and --warmup >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    log_stream = sys.stderr if args.json else sys.stdout

    def log(*a):
        print(*a, file=log_stream, flush=True)

    timings: Dict[str, float] = {}
    t_all = time.perf_counter()
    specs: Dict[str, Any] = {}
    for d in args.datasets_list:
        if d == "cora":
            specs[d] = {"kind": "cora", "hidden": args.cora_hidden, "seed": args.seed,
                        "parts": args.parts_list,
                        "extra_parts": args.cora_measure_parts_list}
        else:
            extra = set(args.measure_parts_list)
            if args.static_cache:
                extra |= set(args.static_parts_list)
            specs[d] = {"kind": "synthetic", "nodes": args.nodes,
                        "avg_degree": args.avg_degree, "features": args.features,
                        "classes": args.classes, "hidden": args.hidden, "seed": args.seed,
                        "parts": args.parts_list, "extra_parts": sorted(extra)}
    # Part 1 in a child: the launcher never imports torch (see benchmarks/fullgraph.py).
    t0 = time.perf_counter()
    prep = fg.spawn_config({"datasets": specs, "cores": args.cores,
                            "cache_dir": str(args.cache_dir.resolve()), "json": args.json},
                           1, args.timeout, target=_analyze_worker)[0]
    timings["part1_plan_level"] = time.perf_counter() - t0
    # The probe decides whether the static-cache section can run; if the engine lacks the
    # keyword the P=1 partition was made for nothing, which is cheap.

    res: Dict[str, Any] = {
        "meta": {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "argv": sys.argv, "platform": platform.platform(),
                 "python": platform.python_version(), "cores": args.cores,
                 "kernels": args.kernels, "epochs": args.epochs, "warmup": args.warmup,
                 "quick": args.quick, "threads_rule": "max(1, cores // P)",
                 "bytes_formula": "see epoch_bytes() / exchange_model() / module docstring",
                 "part2_cache_static": args.part2_cache_static,
                 "timings_s": timings},
        "plan": prep,
    }
    singles: Dict[str, Any] = {}  # single-process baselines, shared by parts 2 and 3
    if args.measure_parts_list or args.cora_measure_parts_list:
        t0 = time.perf_counter()
        res["measured"] = _measure(args, prep, singles, log)
        timings["part2_measured"] = time.perf_counter() - t0
    if args.static_cache:
        t0 = time.perf_counter()
        res["static_cache"] = _static_cache(args, prep, singles, log)
        timings["part3_static_cache"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_all
    res["targets"] = _targets(res)
    res["launcher_peak_rss_kib"] = fg.peak_rss_kib()

    log(format_report(res))
    out = result_path("aggregation-quick" if args.quick else "aggregation", args.out)
    out.write_text(json.dumps(res, indent=1))
    log(f"[out] wrote {out}")
    if args.json:
        print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
