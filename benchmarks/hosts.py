"""Host-aware partitioning against flat METIS: halo rows that cross hosts.

For every graph, METIS objective and (P ranks, H hosts), partitions the graph flat
(ranks numbered host-major as Lightning does: rank ``r`` on host ``r // (P/H)``) and
host-aware (``metis_partition(hosts=H)``), and counts the rows of one exchange that cross
hosts and in total, per aggregation mode (post = one row per node and remote rank;
hybrid = the exact vertex cover). Rows only: no training processes.

Usage::

    python -m benchmarks hosts                       # Cora and the 1M-node synthetic graph
    python -m benchmarks hosts --nodes 100000 --configs 4x2,8x2 --objectives vol

Prints a table (stderr) and a JSON document (stdout, and a file in the results directory).
"""
import argparse
import json
import sys
import time
from typing import Any, Dict, List, Tuple

import torch

from ._common import add_out_argument, write_result

__all__ = ["main"]


def _configs(text: str) -> List[Tuple[int, int]]:
    out = []
    for item in text.split(","):
        P, H = item.lower().split("x")
        out.append((int(P), int(H)))
    return out


def _measure(data, P: int, H: int, objective: str) -> Dict[str, Any]:
    from lightning_fullgraph.partition import metis_partition, node_weights_for, partition_stats
    w = node_weights_for(data)
    row: Dict[str, Any] = {"parts": P, "hosts": H, "objective": objective}
    for name, hosts in (("flat", None), ("host_aware", H)):
        t0 = time.perf_counter()
        parts = metis_partition(data.edge_index, data.num_nodes, P, node_weights=w,
                                hosts=hosts, objective=objective)
        seconds = time.perf_counter() - t0
        stats = partition_stats(parts, data.edge_index, num_parts=P, hosts=H)
        row[name] = {"seconds": seconds,
                     "rows": {m: int(stats.mode_rows[m]) for m in ("post", "hybrid")},
                     "inter_host_rows": {m: int(stats.inter_host_rows[m])
                                         for m in ("post", "hybrid")}}
    row["inter_host_ratio"] = {
        m: row["host_aware"]["inter_host_rows"][m] / max(1, row["flat"]["inter_host_rows"][m])
        for m in ("post", "hybrid")}
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", default="cora,synthetic", help="cora, synthetic")
    p.add_argument("--nodes", type=int, default=1_000_000, help="synthetic nodes")
    p.add_argument("--avg-degree", type=float, default=10.0)
    p.add_argument("--features", type=int, default=128,
                   help="synthetic features (with --classes: benchmarks/aggregation.py's graph)")
    p.add_argument("--classes", type=int, default=16, help="synthetic classes (communities)")
    p.add_argument("--configs", default="4x2,8x2,8x4", help="PxH pairs (ranks x hosts)")
    p.add_argument("--objectives", default="vol,cut", help="METIS objectives")
    add_out_argument(p, file_ok=True)
    args = p.parse_args(argv)
    from lightning_fullgraph.data import load_cora, synthetic_graph
    results = []
    for ds in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        if ds == "cora":
            data = load_cora()
        elif ds == "synthetic":
            data = synthetic_graph(args.nodes, avg_degree=args.avg_degree,
                                   num_features=args.features, num_classes=args.classes,
                                   seed=0)
        else:
            p.error(f"unknown data set {ds!r} (cora, synthetic)")
        for objective in args.objectives.split(","):
            for P, H in _configs(args.configs):
                row = _measure(data, P, H, objective)
                row["dataset"] = ds
                row["nodes"] = int(data.num_nodes)
                results.append(row)
                f, a = row["flat"], row["host_aware"]
                print(f"{ds:<10}{objective:>5}{P:>4}x{H:<3}"
                      f"{f['inter_host_rows']['post']:>11,}{a['inter_host_rows']['post']:>11,}"
                      f"{f['inter_host_rows']['hybrid']:>11,}"
                      f"{a['inter_host_rows']['hybrid']:>11,}"
                      f"{row['inter_host_ratio']['hybrid']:>8.3f}"
                      f"{f['rows']['hybrid']:>11,}{a['rows']['hybrid']:>11,}"
                      f"{f['seconds']:>7.1f}{a['seconds']:>7.1f}", file=sys.stderr, flush=True)
    print("columns: dataset objective PxH | inter-host rows per exchange: post flat, post "
          "host-aware, hybrid flat, hybrid host-aware, hybrid aware/flat | all hybrid rows: "
          "flat, host-aware | METIS seconds: flat, host-aware", file=sys.stderr)
    doc = {"threads": torch.get_num_threads(), "results": results}
    text = json.dumps(doc, indent=2)
    print(text)
    write_result("hosts", doc, args.out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
