#!/usr/bin/env python
"""Gradient reduction of a grid-split ScaleGNN: coalesced (default) against block by block.

Usage::

    python -m benchmarks fourd_reduce      # hidden 64 and 256; grid (2,2,1), dp 2 x (2,1,1)
    python -m benchmarks fourd_reduce --json

Each configuration runs on ``dp * x * y * z`` gloo processes (one thread each): a
Grid3DScaleGNN (Cora's 1433 input features, 3 layers, 7 classes) does one forward and
backward on a random 677-vertex batch, then ``reduce_gradients`` is timed ``--repeats`` times
with ``coalesce=False`` (one all-reduce per block and axis, then one per block over the
replicas) and ``coalesce=True`` (one buffer per axis, the axes' all-reduces in flight
together, one replica all-reduce), alternating, after a barrier each; reported: the median
over repeats of the slowest rank, and the collectives and bytes of each (bytes are equal).
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from lightning_fullgraph.testing import run_distributed

from ._common import add_out_argument, write_result

CONFIGS = [(64, 1, (2, 2, 1)), (256, 1, (2, 2, 1)), (64, 2, (2, 1, 1)), (256, 2, (2, 1, 1))]


def _work(rank, world, hidden, dp, grid, repeats):
    from lightning_fullgraph.parallel import FourDDims, ScaleGNN, pmm
    from lightning_fullgraph.parallel.grid3d import Grid3DScaleGNN
    from lightning_fullgraph.parallel.mesh import FourDMesh

    torch.set_num_threads(1)
    mesh = FourDMesh.create(FourDDims.of(dp, grid))
    torch.manual_seed(0)
    split = Grid3DScaleGNN(ScaleGNN(1433, hidden, 3, 7), mesh, gather_output=True)
    n = 677
    g = torch.Generator().manual_seed(1)
    split(torch.randn(n, 1433, generator=g), torch.randint(0, n, (2, 4000), generator=g)) \
        .sum().backward()
    calls = {"n": 0}
    real = dist.all_reduce

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    out = {}
    for coalesce in (False, True):  # warm-up and counts
        dist.all_reduce = counting
        calls["n"], before = 0, pmm.bytes_sent()
        split.reduce_gradients(coalesce=coalesce)
        dist.all_reduce = real
        out[coalesce] = {"collectives": calls["n"], "bytes": pmm.bytes_sent() - before,
                         "times": []}
    for _ in range(repeats):
        for coalesce in (False, True):
            dist.barrier()
            t = time.perf_counter()
            split.reduce_gradients(coalesce=coalesce)
            out[coalesce]["times"].append(time.perf_counter() - t)
    return {("coalesced" if k else "per_block"): {
        "collectives": v["collectives"], "bytes": v["bytes"],
        "median_s": sorted(v["times"])[len(v["times"]) // 2]} for k, v in out.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--json", action="store_true")
    add_out_argument(p)
    args = p.parse_args(argv)
    rows = []
    for hidden, dp, grid in CONFIGS:
        world = dp * grid[0] * grid[1] * grid[2]
        ranks = run_distributed(_work, world, hidden, dp, grid, args.repeats, timeout_s=300)
        row = {"hidden": hidden, "dp": dp, "grid": list(grid), "processes": world}
        for kind in ("per_block", "coalesced"):
            row[kind + "_ms"] = 1000 * max(r[kind]["median_s"] for r in ranks)
            row[kind + "_collectives"] = ranks[0][kind]["collectives"]
            row[kind + "_MB"] = ranks[0][kind]["bytes"] / 1e6
        row["speedup"] = row["per_block_ms"] / row["coalesced_ms"]
        rows.append(row)
    write_result("fourd_reduce", {"rows": rows}, args.out, indent=2)
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
        return
    print(json.dumps({"rows": rows}))
    print(f"{'hidden':>6} {'dp x grid':>12} {'per-block ms':>12} {'calls':>5} "
          f"{'coalesced ms':>12} {'calls':>5} {'MB/rank':>8} {'speedup':>7}")
    for r in rows:
        print(f"{r['hidden']:>6} {str(r['dp']) + ' x ' + ','.join(map(str, r['grid'])):>12} "
              f"{r['per_block_ms']:12.2f} {r['per_block_collectives']:>5} "
              f"{r['coalesced_ms']:12.2f} {r['coalesced_collectives']:>5} "
              f"{r['coalesced_MB']:8.3f} {r['speedup']:7.2f}")


if __name__ == "__main__":
    main()
