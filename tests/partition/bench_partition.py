"""Timing of :func:`partition_graph` on a random power-law graph.

Not collected by pytest. Run::

    python tests/partition/bench_partition.py --nodes 1000000 --edges 10000000 --parts 4
"""
import argparse
import resource
import tempfile
import time

import torch
from torch_geometric.data import Data

from lightning_fullgraph.partition import (
    build_local_partitions,
    load_partition,
    metis_partition,
    node_weights_for,
    partition_graph,
)


def power_law_graph(num_nodes, num_edges, *, feat=128, alpha=2.1, seed=0):
    r"""Chung-Lu style directed graph: endpoints drawn proportional to
    Pareto(alpha - 1) node weights, so degrees follow a power law."""
    g = torch.Generator().manual_seed(seed)
    w = (1.0 - torch.rand(num_nodes, generator=g, dtype=torch.float64)) ** (-1.0 / (alpha - 1))
    cdf = torch.cumsum(w, 0)
    cdf /= cdf[-1].clone()
    def draw():
        return torch.searchsorted(cdf, torch.rand(num_edges, generator=g, dtype=torch.float64)
                                  ).clamp_(max=num_nodes - 1)
    edge_index = torch.stack([draw(), draw()])
    r = torch.rand(num_nodes, generator=g)
    return Data(x=torch.randn(num_nodes, feat, generator=g),
                y=torch.randint(0, 40, (num_nodes,), generator=g),
                train_mask=r < 0.1, val_mask=(r >= 0.1) & (r < 0.2), test_mask=r >= 0.2,
                edge_index=edge_index, num_nodes=num_nodes)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--edges", type=int, default=10_000_000)
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--feat", type=int, default=128)
    p.add_argument("--phases", action="store_true", help="also time phases separately")
    args = p.parse_args()
    t = time.perf_counter()
    data = power_law_graph(args.nodes, args.edges, feat=args.feat)
    print(f"generated in {time.perf_counter() - t:.1f}s; max in-degree "
          f"{int(torch.bincount(data.edge_index[1]).max())}")
    with tempfile.TemporaryDirectory() as root:
        t = time.perf_counter()
        path = partition_graph(data, args.parts, root=root)
        print(f"partition_graph: {time.perf_counter() - t:.1f}s")
        t = time.perf_counter()
        partition_graph(data, args.parts, root=root, progress=False)
        print(f"cache hit: {time.perf_counter() - t:.1f}s")
        t = time.perf_counter()
        load_partition(path, 0, num_parts=args.parts)
        print(f"load_partition(rank 0): {time.perf_counter() - t:.1f}s")
    if args.phases:
        t = time.perf_counter()
        parts = metis_partition(data.edge_index, args.nodes, args.parts,
                                node_weights=node_weights_for(data))
        t1 = time.perf_counter()
        build_local_partitions(data, parts, fingerprint="x")
        print(f"metis {t1 - t:.1f}s, build_local_partitions {time.perf_counter() - t1:.1f}s")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
