#!/usr/bin/env python
"""The bandwidth an exchange gets by its size on an emulated cluster, and what the planner's
calibration reads from it.

A shaped link (``tbf``) carries a short exchange partly out of its burst and queue, so the
bytes per second an ``all_to_all_single`` gets fall with its size until it is long enough for
the line rate (and the senders' TCP flows sharing it) to decide.  The halo exchange of a large
graph's layer sends tens of MiB a rank: a calibration that stops at a few MiB reads a faster
link than training meets.  On the machines of ``python -m benchmarks cluster``
(:meth:`EmulatedCluster.dilated`; root) this topic times one exchange of every ``--sizes``
(bytes a rank sends, evenly over its peers), entered after a barrier, the median of
``--repeats`` of the slowest rank, and runs :func:`~lightning_fullgraph.planner.calibrate`
with the sizes it had before the bulk one (``0, 64 KiB, 1 MiB, 8 MiB``) and with its default
(which ends with 32 MiB), reporting each one's bandwidth against the largest size's.

It also times the largest size with its two directions on two process groups at once (rows to
higher ranks on the world, to lower ones on a second gloo group): gloo's ``all_to_all_single``
carries one direction of a pair's connection at a time, so a bulk exchange between two ranks
gets about half the line rate, and the same bytes split over two groups nearly all of it.

Usage::

    python -m benchmarks link_sizes                                # 4 two-core nodes, 1 Gbit/s
    python -m benchmarks link_sizes --nodes 2 --node-cores 1 --rates 1gbit 10gbit

Prints a table and writes JSON (``--json-out``, default ``link_sizes-<time>.json`` in the
results directory, see ``--out``).  Bandwidths are in bytes per emulated second (the dilated
seconds times the dilation), so a 1 Gbit/s link's line rate reads 125 MB/s.
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

#: The sweep of :func:`~lightning_fullgraph.planner.calibrate` before its bulk size.
SHORT_SWEEP = (0, 1 << 16, 1 << 20, 1 << 23)


def worker() -> None:
    r"""One rank under ``torchrun``: rank 0 prints JSON (seconds per size, the slowest rank's
    median; the two calibrations' bandwidths and durations)."""
    import torch
    import torch.distributed as dist
    from lightning_fullgraph.engine.transport import _both_directions
    from lightning_fullgraph.planner import calibrate
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [int(s) for s in os.environ["LINK_SIZES"].split(",")]
    repeats = int(os.environ["LINK_REPEATS"])
    seconds = []
    for nbytes in sizes:
        per_peer = nbytes // 4 // (world - 1)
        splits = [0 if r == rank else per_peer for r in range(world)]
        send = torch.ones(per_peer * (world - 1))
        recv = torch.empty_like(send)
        times = []
        for i in range(repeats + 1):  # one warm-up
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_to_all_single(recv, send, output_split_sizes=splits,
                                   input_split_sizes=splits)
            if i:
                times.append(time.perf_counter() - t0)
        seconds.append(statistics.median(times))
    # The largest size again, its two directions on two groups at once, as the transport
    # sends them with duplex on (each pair then carries one direction on each group).
    other = dist.new_group(backend="gloo")
    times = []
    for i in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        _both_directions(recv, send, splits, splits, rank, None, other).wait()
        if i:
            times.append(time.perf_counter() - t0)
    seconds.append(statistics.median(times))
    dist.destroy_process_group(other)
    slowest = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    result = dict(seconds=slowest.tolist()[:-1], duplex_seconds=float(slowest[-1]),
                  sent=[s // 4 // (world - 1) * (world - 1) * 4 for s in sizes])
    for name, sweep in (("short", SHORT_SWEEP), ("default", None)):
        t0 = time.perf_counter()
        link = calibrate(sizes=sweep) if sweep is not None else calibrate()
        result[f"{name}_beta"] = link.beta
        result[f"{name}_s"] = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


def table(rows: List[Dict[str, object]]) -> str:
    head = (f"{'rate':>8} {'nodes':>5} {'cores':>5}  {'MiB a rank':>10} {'MB/s':>8} "
            f"{'of line':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        for size, bw in zip(r["sizes"], r["bandwidth"]):
            lines.append(f"{r['rate']:>8} {r['nodes']:>5} {r['node_cores']:>5}  "
                         f"{size / 2 ** 20:>10.2f} {bw / 1e6:>8.2f} "
                         f"{bw / r['line_rate']:>7.2f}")
        duplex = r["duplex_bandwidth"]
        lines.append(f"{'':>8} {'':>5} {'':>5}  {'two groups':>10} {duplex / 1e6:>8.2f} "
                     f"{duplex / r['line_rate']:>7.2f}  (the largest size, each "
                     f"direction on a group of its own: {r['duplex_speedup']:.2f}x faster)")
        for name in ("short", "default"):
            lines.append(f"{'':>8} {'':>5} {'':>5}  {'calibrate, ' + name:>10}: "
                         f"{r[name + '_beta'] / 1e6:.2f} MB/s, {r[name + '_vs_largest']:.2f}x "
                         f"the largest size's, in {r[name + '_s']:.1f} s")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cluster_arguments(p, node_cores=2)
    p.add_argument("--sizes", type=int, nargs="+",
                   default=[1 << 20, 1 << 23, 1 << 25, 1 << 26],
                   help="bytes a rank sends per exchange (default: 1, 8, 32 and 64 MiB)")
    opts = p.parse_args(argv)
    from lightning_fullgraph.cluster import EmulatedCluster, parse_rate
    rows = []
    for rate in opts.rates:
        cluster = EmulatedCluster.dilated(opts.nodes, rate, node_cores=opts.node_cores)
        got = cluster_worker_json("link_sizes", cluster, opts.node_cores, dict(
            LINK_REPEATS=str(opts.repeats), LINK_SIZES=",".join(str(s) for s in opts.sizes)),
            29873, 1800)
        dilation = cluster.dilation
        bandwidth = [b / s * dilation for b, s in zip(got["sent"], got["seconds"])]
        row = dict(rate=rate, nodes=opts.nodes, node_cores=opts.node_cores, dilation=dilation,
                   line_rate=parse_rate(rate) / 8, sizes=got["sent"], seconds=got["seconds"],
                   bandwidth=bandwidth)
        row["duplex_seconds"] = got["duplex_seconds"]
        row["duplex_bandwidth"] = got["sent"][-1] / got["duplex_seconds"] * dilation
        row["duplex_speedup"] = got["seconds"][-1] / got["duplex_seconds"]
        for name in ("short", "default"):
            row[f"{name}_beta"] = got[f"{name}_beta"] * dilation
            row[f"{name}_s"] = got[f"{name}_s"]
            row[f"{name}_vs_largest"] = row[f"{name}_beta"] / bandwidth[-1]
        rows.append(row)
    print(table(rows))
    write_rows("link_sizes", rows, opts, argv)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        sys.exit(main())
