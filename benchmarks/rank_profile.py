#!/usr/bin/env python
"""Where one rank's training step spends its time: operators by self CPU time, and user /
system seconds and page faults per epoch on every rank.

Usage::

    python -m benchmarks fullgraph --kernels auto --parts 4
    python -m benchmarks rank_profile --partition-dir /tmp/fgcache/partitions/<graph>-p4-<opts>

Runs the training loop of ``benchmarks/fullgraph.py`` (2-layer GCN or SAGE, hidden 128, Adam,
the engine with the kernels) on a partition that script wrote, one gloo process per part, one
thread each. After ``--warmup`` steps every rank times ``--epochs`` steps (wall clock, and
``os.times()``'s user and system seconds: on a machine with fewer cores than ranks the work
done, not the wall clock, says what a change saves; and the minor page faults).
``--block-cache`` sets the huge-page allocator's block cache (``0``: off; default: the
library's, on). Then one more step runs under
``torch.profiler`` on every rank (so the collectives match), and rank ``--rank`` reports its
operators by self CPU time, with the shares of the dense products (``aten::mm``/``addmm``),
of the kernels' operators (``lightning_fullgraph::*``) and of the halo exchange's autograd
functions. JSON on stdout (``--json``: only the JSON), then the
tables.

Profiled times include waiting for the other ranks' processes when they share cores; the
shares, not the seconds, are the result.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from ._common import add_out_argument, write_result

#: The halo exchange's autograd functions, as the profiler names them (and their backwards).
EXCHANGE_OPS = ("_HaloRows", "_HaloRecv", "_PreRows", "_OneBuffer", "_RemotePart")


def _train(rank: int, world: int, cfg: Dict[str, Any]) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile
    from torch_geometric import nn as pyg_nn

    from .fullgraph import _build_model
    from lightning_fullgraph.engine import FullGraphEngine
    from lightning_fullgraph.kernels import huge_pages
    from lightning_fullgraph.partition import load_partition

    torch.set_num_threads(1)
    # As FullGraphStrategy(huge_pages=True) does, before the data: the allocator (an opt-in)
    # whose block cache --block-cache sets.
    huge_pages.enable_for_kernels(True)
    if cfg["block_cache"] is not None:
        huge_pages.set_block_cache(cfg["block_cache"])
    part = load_partition(cfg["partition_dir"], rank, num_parts=world)
    engine = FullGraphEngine(part, exchange=None if cfg["aggregation"] is None
                             else {"aggregation": cfg["aggregation"]})
    data = engine.data
    x, edge_index, y, mask = data.x, data.edge_index, data.y, data.train_mask
    torch.manual_seed(0)
    model = _build_model(torch.nn, pyg_nn, cfg["model"], x.size(1), 128,
                         int(cfg["num_classes"]), 0.0)
    engine.attach(model)
    if cfg["kernels"] != "pyg":
        engine.use_kernels(cfg["kernels"])
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x, edge_index)[mask], y[mask])
        engine.backward(loss)
        opt.step()

    for _ in range(int(cfg["warmup"])):
        dist.barrier()
        step()
    epochs: List[Dict[str, float]] = []
    for _ in range(int(cfg["epochs"])):
        dist.barrier()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0, c0 = time.perf_counter(), os.times()
        step()
        t1, c1 = time.perf_counter(), os.times()
        f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        epochs.append({"wall_s": round(t1 - t0, 4), "user_s": round(c1.user - c0.user, 3),
                       "sys_s": round(c1.system - c0.system, 3), "page_faults": f1 - f0})
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    dist.barrier()
    out: Dict[str, Any] = {"rank": rank, "epochs": epochs,
                           "huge_pages": huge_pages.huge_pages_info()}
    if rank == cfg["rank"]:
        rows = [{"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3, "calls": e.count}
                for e in prof.key_averages()]
        rows.sort(key=lambda r: -r["self_cpu_ms"])
        total = sum(r["self_cpu_ms"] for r in rows) or float("nan")
        dense = sum(r["self_cpu_ms"] for r in rows if r["op"] in ("aten::mm", "aten::addmm"))
        # The kernels: the library's custom operators and their generated backwards.
        kernels = sum(r["self_cpu_ms"] for r in rows if "lightning_fullgraph" in r["op"])
        # The halo exchange's autograd functions (waiting for the other ranks included).
        exchange = sum(r["self_cpu_ms"] for r in rows if r["op"].startswith(EXCHANGE_OPS))
        out["profile"] = {"self_cpu_ms": round(total, 1),
                          "dense_share": round(dense / total, 4),
                          "kernel_ops_share": round(kernels / total, 4),
                          "exchange_share": round(exchange / total, 4),
                          "ops": [{**r, "self_cpu_ms": round(r["self_cpu_ms"], 2),
                                   "share": round(r["self_cpu_ms"] / total, 4)}
                                  for r in rows[:int(cfg["rows"])]]}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partition-dir", required=True,
                        help="a partition written by benchmarks/fullgraph.py (its --cache-dir)")
    parser.add_argument("--rank", type=int, default=0, help="the rank whose operators are listed")
    parser.add_argument("--model", choices=("gcn", "sage"), default="gcn")
    parser.add_argument("--aggregation", choices=("post", "pre", "hybrid"), default=None,
                        help="ExchangeConfig(aggregation=...) (default: the engine's)")
    parser.add_argument("--kernels", choices=("auto", "cpp", "torch", "pyg"), default="auto",
                        help="engine.use_kernels(...), or PyG's own path")
    parser.add_argument("--block-cache", default=None,
                        help="kernels.set_block_cache(LIMIT) in every rank, e.g. 8G; 0 turns it "
                             "off (default: the library's default, on)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4, help="timed steps")
    parser.add_argument("--rows", type=int, default=25, help="operators listed")
    parser.add_argument("--num-classes", type=int, default=16)
    parser.add_argument("--json", action="store_true", help="only the JSON on stdout")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    from lightning_fullgraph.kernels.huge_pages import _parse_bytes
    from lightning_fullgraph.partition import read_manifest
    from lightning_fullgraph.testing import run_distributed
    world = int(read_manifest(args.partition_dir)["num_parts"])
    if not 0 <= args.rank < world:
        parser.error(f"--rank {args.rank}: the partition has {world} parts")
    try:
        block_cache = None if args.block_cache is None else _parse_bytes(args.block_cache)
    except ValueError as err:
        parser.error(f"--block-cache {args.block_cache!r}: {err}")
    if args.epochs < 1 or args.warmup < 0:
        parser.error("--epochs must be >= 1 and --warmup >= 0")
    cfg = {"partition_dir": str(Path(args.partition_dir).resolve()), "rank": args.rank,
           "model": args.model, "aggregation": args.aggregation, "kernels": args.kernels,
           "block_cache": block_cache, "warmup": args.warmup, "epochs": args.epochs,
           "rows": args.rows, "num_classes": args.num_classes}
    os.environ["OMP_NUM_THREADS"] = "1"
    ranks = run_distributed(_train, world, cfg, timeout_s=1800)
    result = {"parts": world, **cfg, "ranks": [{"rank": r["rank"], "epochs": r["epochs"],
                                                "huge_pages": r["huge_pages"]} for r in ranks],
              "profile": ranks[args.rank]["profile"]}
    n = args.epochs
    result["per_epoch_summed_over_ranks"] = [
        {k: round(sum(r["epochs"][i][k] for r in ranks), 3)
         for k in ("user_s", "sys_s", "page_faults")}
        | {"wall_s_slowest": max(r["epochs"][i]["wall_s"] for r in ranks)} for i in range(n)]
    print(json.dumps(result, indent=2))
    write_result('rank_profile', result, args.out)
    if args.json:
        return 0
    print(f"\n{world} ranks x 1 thread; per timed step: slowest rank's wall s; user s, "
          "system s and page faults summed over ranks")
    for i, e in enumerate(result["per_epoch_summed_over_ranks"]):
        print(f"  step {i}: wall {e['wall_s_slowest']:.3f}  user {e['user_s']:.3f}  "
              f"sys {e['sys_s']:.3f}  faults {e['page_faults']:,}")
    hp = ranks[0]["huge_pages"]
    print(f"block cache (rank 0): limit {hp['cache_limit']:,} B; {hp['reused']} of "
          f"{hp['allocations']} large blocks filled from it ({hp['reused_bytes'] / 2**20:,.0f} "
          f"MiB); {hp['cached_bytes'] / 2**20:,.0f} MiB cached after the run")
    p = result["profile"]
    print(f"\nrank {args.rank}, one profiled step: {p['self_cpu_ms']:,.0f} ms self CPU; dense "
          f"products {100 * p['dense_share']:.1f} %, the kernels' operators "
          f"{100 * p['kernel_ops_share']:.1f} %, the halo exchange (waits included) "
          f"{100 * p['exchange_share']:.1f} %")
    for r in p["ops"]:
        print(f"  {r['self_cpu_ms']:>9,.1f} ms {100 * r['share']:>5.1f} %  {r['calls']:>4}x  "
              f"{r['op'][:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
