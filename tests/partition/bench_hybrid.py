"""Rows per exchange of the post / pre / hybrid aggregation modes, the cost of the
exact minimum vertex cover, and host-aware partitioning.

Not collected by pytest. Run::

    python tests/partition/bench_hybrid.py --graph cora --parts 2 4 8
    python tests/partition/bench_hybrid.py --graph synthetic --nodes 1000000 --parts 2 4 8 \\
        --hosts-parts 4
"""
import argparse
import json
import tempfile
import time

import torch

from lightning_fullgraph.partition import (
    MODES,
    cut_cover,
    iter_local_partitions,
    load_partition,
    metis_partition,
    node_weights_for,
    partition_graph,
    partition_stats,
)


def _graph(args):
    if args.graph == "cora":
        from lightning_fullgraph.data import load_cora
        return load_cora()
    from lightning_fullgraph.data import synthetic_graph
    return synthetic_graph(args.nodes, avg_degree=args.degree, seed=0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--graph", choices=["cora", "synthetic"], default="cora")
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--degree", type=float, default=10.0)
    p.add_argument("--parts", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--hosts-parts", type=int, nargs="*", default=[],
                   help="also compare hosts=2 with flat METIS at these part counts")
    p.add_argument("--pipeline", action="store_true",
                   help="also time partition_graph end to end and load_partition + plans")
    args = p.parse_args()
    t = time.perf_counter()
    data = _graph(args)
    ei, n = data.edge_index, data.num_nodes
    print(f"{args.graph}: {n:,} nodes, {ei.size(1):,} edges "
          f"(generated in {time.perf_counter() - t:.1f}s)", flush=True)
    w = node_weights_for(data)
    results = []
    for P in args.parts:
        t0 = time.perf_counter()
        parts = metis_partition(ei, n, P, node_weights=w)
        t1 = time.perf_counter()
        cover = cut_cover(ei, parts, P)
        t2 = time.perf_counter()
        stats = partition_stats(parts, ei, num_parts=P, cover=cover)
        t3 = time.perf_counter()
        rows = stats.mode_rows
        row = {"graph": args.graph, "P": P, "cut_edges": stats.edge_cut, **rows,
               "post/hybrid": round(rows["post"] / max(rows["hybrid"], 1), 3),
               "pre/hybrid": round(rows["pre"] / max(rows["hybrid"], 1), 3),
               "metis_s": round(t1 - t0, 2), "cover_s": round(t2 - t1, 2),
               "stats_s": round(t3 - t2, 2)}
        if args.pipeline:
            t4 = time.perf_counter()
            for lp in iter_local_partitions(data, parts, num_parts=P, fingerprint="x",
                                            cover=cover):
                pass
            row["build_all_ranks_s"] = round(time.perf_counter() - t4, 2)
        results.append(row)
        print(json.dumps(row), flush=True)

    for P in args.hosts_parts:
        flat = metis_partition(ei, n, P, node_weights=w)
        t0 = time.perf_counter()
        aware = metis_partition(ei, n, P, node_weights=w, hosts=2)
        t1 = time.perf_counter()
        s_flat = partition_stats(flat, ei, num_parts=P, hosts=2)
        s_aware = partition_stats(aware, ei, num_parts=P, hosts=2)
        row = {"graph": args.graph, "P": P, "hosts": 2, "metis_hosts_s": round(t1 - t0, 2)}
        for name, s in (("flat", s_flat), ("hosts2", s_aware)):
            for m in ("post", "hybrid"):
                row[f"{name}_inter_{m}"] = s.inter_host_rows[m]
                row[f"{name}_total_{m}"] = s.mode_rows[m]
            row[f"{name}_edge_imbalance"] = round(s.edge_imbalance, 3)
        print(json.dumps(row), flush=True)

    if args.pipeline:
        P = args.parts[-1]
        with tempfile.TemporaryDirectory() as root:
            t0 = time.perf_counter()
            path = partition_graph(data, P, root=root, progress=True)
            t1 = time.perf_counter()
            lp = load_partition(path, 0, num_parts=P)
            t2 = time.perf_counter()
            for m in MODES:
                lp.plan(m)
            t3 = time.perf_counter()
        print(json.dumps({"P": P, "partition_graph_s": round(t1 - t0, 2),
                          "load_rank0_s": round(t2 - t1, 3),
                          "plans_rank0_all_modes_s": round(t3 - t2, 3)}), flush=True)


if __name__ == "__main__":
    main()
