#!/usr/bin/env python
"""What a rank's own transfer in flight costs the rest of its step, on an emulated cluster.

The asynchronous pipeline keeps its halo transfers in flight past the training step, into the
gradient all-reduce and the next step.  Two costs follow, and this topic times both on the
machines of ``python -m benchmarks cluster`` (:meth:`EmulatedCluster.dilated`; root): a block
of the step's kind of compute (dense products and a row scatter) and a synchronous
``all_reduce`` of a model's gradients (``--grad-mb``), each on an idle link and again while
an ``all_to_all_single`` of about ``--bulk-s`` seconds of link time runs on another process
group (the pipeline's own), median of ``--repeats``, the slowest rank's.  The compute's
slowdown is the link's contention (:attr:`~lightning_fullgraph.planner.LinkModel.contention`,
which the planner models); the all-reduce's is the queue of the rank's own bulk bytes it waits
behind, which the planner does not model.

Usage::

    python -m benchmarks busy_link                                # 4 four-core nodes, 1 Gbit/s
    python -m benchmarks busy_link --node-cores 2 --rates 10gbit

Prints a table and writes JSON (``--json-out``, default ``busy_link-<time>.json`` in the
results directory, see ``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

from ._common import add_cluster_arguments, cluster_worker_json, write_rows


def worker() -> None:
    r"""One rank under ``torchrun``: rank 0 prints the slowest rank's medians as JSON."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    background = dist.new_group(backend="gloo")  # the pipeline's group of its own
    gen = torch.Generator().manual_seed(rank)
    grads = torch.randn(int(float(os.environ["BUSY_GRAD_MB"]) * 1e6 / 4), generator=gen)
    a, w = torch.randn(4096, 256, generator=gen), torch.randn(256, 256, generator=gen)
    index = torch.randint(0, 4096, (200_000, ), generator=gen)
    out = torch.zeros(4096, 256)
    beta, bulk_s = float(os.environ["BUSY_BETA"]), float(os.environ["BUSY_BULK_S"])
    per_peer = max(1, int(beta * bulk_s / max(world - 1, 1) / 4))
    send = torch.randn(per_peer * world, generator=gen)
    recv = torch.empty_like(send)

    def compute() -> float:
        t0 = time.perf_counter()
        for _ in range(4):
            (a @ w).relu_()
            out.index_add_(0, index[:100_000], a[index[100_000:]])
        return time.perf_counter() - t0

    def all_reduce() -> float:
        t0 = time.perf_counter()
        dist.all_reduce(grads)
        return time.perf_counter() - t0

    compute()  # warm-up
    result = {}
    for name, fn in (("all_reduce", all_reduce), ("compute", compute)):
        for busy in (False, True):
            seconds = []
            for _ in range(int(os.environ["BUSY_REPEATS"])):
                dist.barrier()
                work = dist.all_to_all_single(recv, send, group=background, async_op=True) \
                    if busy else None
                if busy:
                    time.sleep(0.1 * bulk_s)  # the bulk bytes fill the link's queue first
                seconds.append(fn())
                if work is not None:
                    work.wait()
            result[f"{name}_{'busy' if busy else 'idle'}_s"] = statistics.median(seconds)
    slowest = torch.tensor(list(result.values()), dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps(dict(zip(result, slowest.tolist()))), flush=True)
    dist.destroy_process_group()


def table(rows: List[Dict[str, float]]) -> str:
    head = (f"{'rate':>8} {'cores':>5}  {'all-reduce idle s':>17} {'busy s':>8} {'x':>5}  "
            f"{'compute idle s':>14} {'busy s':>8} {'x':>5}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['rate']:>8} {r['node_cores']:>5}  {r['all_reduce_idle_s']:>17.4f} "
                     f"{r['all_reduce_busy_s']:>8.4f} {r['all_reduce_ratio']:>5.2f}  "
                     f"{r['compute_idle_s']:>14.4f} {r['compute_busy_s']:>8.4f} "
                     f"{r['compute_ratio']:>5.2f}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cluster_arguments(p, node_cores=4)
    p.add_argument("--grad-mb", type=float, default=0.8,
                   help="megabytes all-reduced (default 0.8: a 3-layer, 256-wide GraphSAGE)")
    p.add_argument("--bulk-s", type=float, default=3.0,
                   help="seconds of link time the bulk transfer takes (dilated; default 3)")
    opts = p.parse_args(argv)
    from lightning_fullgraph.cluster import EmulatedCluster, parse_rate
    rows = []
    for rate in opts.rates:
        cluster = EmulatedCluster.dilated(opts.nodes, rate, node_cores=opts.node_cores)
        got = cluster_worker_json("busy_link", cluster, opts.node_cores, dict(
            BUSY_GRAD_MB=str(opts.grad_mb), BUSY_BETA=str(parse_rate(cluster.rate) / 8),
            BUSY_BULK_S=str(opts.bulk_s), BUSY_REPEATS=str(opts.repeats)), 29871, 900)
        row = dict(rate=rate, nodes=opts.nodes, node_cores=opts.node_cores,
                   dilation=cluster.dilation, grad_mb=opts.grad_mb, bulk_s=opts.bulk_s, **got)
        row["all_reduce_ratio"] = row["all_reduce_busy_s"] / row["all_reduce_idle_s"]
        row["compute_ratio"] = row["compute_busy_s"] / row["compute_idle_s"]
        rows.append(row)
    print(table(rows))
    write_rows("busy_link", rows, opts, argv)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        sys.exit(main())
