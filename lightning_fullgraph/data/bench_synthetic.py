"""Times :func:`~lightning_fullgraph.data.synthetic_graph`.

Usage: ``python -m lightning_fullgraph.data.bench_synthetic 1000000 2000000
--repeat 3``. A separate module (not imported by the package) so that ``-m``
runs it cleanly and the generator's speed claim stays checkable.
"""
import argparse
import time

import torch

from lightning_fullgraph.data.synthetic import synthetic_graph

__all__ = ["main"]


def main() -> None:
    r"""Prints wall and CPU time of :func:`synthetic_graph` per size."""
    parser = argparse.ArgumentParser(description="Time synthetic_graph.")
    parser.add_argument("num_nodes", type=int, nargs="+")
    parser.add_argument("--avg-degree", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    for num_nodes in args.num_nodes:
        for seed in range(args.repeat):
            start, cpu = time.perf_counter(), time.process_time()
            data = synthetic_graph(num_nodes, avg_degree=args.avg_degree,
                                   seed=seed)
            took = time.perf_counter() - start
            # CPU time as well: wall time is unreliable on a shared machine.
            cpu = time.process_time() - cpu
            print(f"nodes={num_nodes:,} edges={data.edge_index.size(1):,} "
                  f"seed={seed} wall={took:.2f}s cpu={cpu:.2f}s "
                  f"threads={torch.get_num_threads()}", flush=True)


if __name__ == "__main__":
    main()
