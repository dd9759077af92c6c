#!/usr/bin/env python
"""The huge-page allocator's block cache (``kernels.set_block_cache``): training steps with
the pages of freed blocks reused (the default), or unmapped (limit 0).

Usage::

    python -m benchmarks block_cache                      # 2-layer GCN step, 1M nodes / 16M edges
    python -m benchmarks block_cache --nodes 20000 --edges 200000 --rounds 2   # smoke run

Without the cache every large tensor of a step lands in freshly mapped pages: a page fault per
2 MiB and the kernel zeroing it. Here one training step of a 2-layer GCN (``GCNConv(F,
hidden)``, ReLU, ``GCNConv(hidden, classes)``, cross-entropy, Adam) on the kernels is timed

* in one process, ``--rounds`` rounds in ABBA order, the cache off (limit 0) and on
  (``--limit``); each timed step follows one untimed step under the same setting (which
  fills the cache, or empties it);
* for the peak memory, in two fresh processes (``--peak``, on by default), the cache off and
  on, ``--peak-steps`` steps each after a first one (the CSR, the normalization): the training
  steps' peak (``VmHWM`` reset after the first step, Linux), ``ru_maxrss`` of the whole
  process (graph generation included), the resident memory after the last step, and the
  allocator's own count of the most bytes its blocks held live at once.

Prints the JSON and a table.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from ._common import REPO, abba, add_out_argument, child_env, module_command, spread, write_result


def _setup(nodes: int, edges: int, features: int, hidden: int, classes: int, seed: int = 0):
    import torch
    import torch.nn.functional as F

    import lightning_fullgraph.kernels as K
    from .gcn_forward import _build
    from .kernels import power_law_graph

    K.cpp_available()  # loads the kernels: the huge-page allocator is installed from here on
    torch.manual_seed(seed)
    ei = power_law_graph(nodes, edges, src_skew=2.0, dst_skew=2.0, seed=seed)
    model = _build("model", features, hidden, classes)
    x = torch.randn(nodes, features)
    y = torch.randint(0, classes, (nodes,))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    K.use("auto")

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x, ei), y).backward()
        opt.step()
        return time.perf_counter() - t0

    return step


def _status_mib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) >> 10
    raise RuntimeError(f"/proc/self/status has no {field}")


def _resident_mib() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 >> 20


def child(args: argparse.Namespace) -> dict:
    r"""``--peak-steps`` steps with the cache at ``--child-limit`` bytes, in this process."""
    import lightning_fullgraph.kernels as K

    K.set_huge_pages("on")  # an opt-in: the allocator whose block cache this measures
    K.set_block_cache(args.child_limit)
    step = _setup(args.nodes, args.edges, args.features, args.hidden, args.classes)
    first = step()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM: the peak of the training steps from here on
    times = [step() for _ in range(args.peak_steps)]
    info = K.huge_pages_info()
    return {"limit": args.child_limit, "first_step_s": first, "steps_s": times,
            "training_peak_mib": _status_mib("VmHWM"),
            "process_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10,
            "resident_after_mib": _resident_mib(),
            "live_peak_mib": info["live_peak_bytes"] >> 20,
            "cached_mib": info["cached_bytes"] >> 20, "reused": info["reused"]}


def peak(args: argparse.Namespace, limit: int) -> dict:
    cmd = [*module_command("block_cache"), "--child-limit", str(limit), "--nodes", str(args.nodes),
           "--edges", str(args.edges), "--features", str(args.features), "--hidden",
           str(args.hidden), "--classes", str(args.classes), "--peak-steps",
           str(args.peak_steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=REPO, env=child_env())
    if proc.returncode != 0:
        raise RuntimeError(f"peak run with limit {limit} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict:
    import lightning_fullgraph.kernels as K
    from lightning_fullgraph.kernels import huge_pages

    limit = huge_pages._parse_bytes(args.limit)
    huge_pages.set_huge_pages("on")  # an opt-in: the allocator whose block cache this measures
    step = _setup(args.nodes, args.edges, args.features, args.hidden, args.classes)
    if not K.huge_pages_info()["active"]:
        raise RuntimeError("the huge-page allocator is not installed here: nothing to measure")
    step()  # the CSR and the normalization, once

    def timed(setting: int):
        K.set_block_cache(setting)
        step()  # fills the cache (or finds it empty)
        return step()

    reused = K.huge_pages_info()["reused"]
    t_on, t_off = abba(lambda: timed(limit), lambda: timed(0), args.rounds)
    K.set_block_cache(0)
    row = {"nodes": args.nodes, "edges": args.edges, "features": args.features,
           "hidden": args.hidden, "classes": args.classes, "rounds": args.rounds,
           "limit": limit, "cache_on": spread(t_on), "cache_off": spread(t_off),
           "reused_blocks": K.huge_pages_info()["reused"] - reused}
    row["speedup_median"] = row["cache_off"]["median"] / row["cache_on"]["median"]
    if args.peak:
        row["peak"] = {"off": peak(args, 0), "on": peak(args, limit)}
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--edges", type=int, default=16_000_000)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--limit", default="8G", help="the cache's limit when on (bytes, K/M/G)")
    parser.add_argument("--rounds", type=int, default=6, help="ABBA rounds (both ways each)")
    parser.add_argument("--no-peak", dest="peak", action="store_false",
                        help="skip the two fresh processes that measure the peak memory")
    parser.add_argument("--peak-steps", type=int, default=4)
    add_out_argument(parser)
    parser.add_argument("--child-limit", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_limit is not None:
        print(json.dumps(child(args)))
        return 0
    row = run(args)
    print(json.dumps(row, indent=2))
    write_result("block_cache", row, args.out)
    print("| 2-layer GCN step | cache off | cache on | gain | blocks reused |"
          "\n| --- | --- | --- | --- | --- |")
    print(f"| {args.nodes:,} / {args.edges:,}, F={args.features} | "
          f"{row['cache_off']['median']:.3f} s | {row['cache_on']['median']:.3f} s | "
          f"x{row['speedup_median']:.3f} | {row['reused_blocks']} |")
    if args.peak:
        print("| fresh process | training steps' peak MiB | process peak MiB | resident after "
              "MiB | allocator live peak MiB |\n| --- | --- | --- | --- | --- |")
        for name in ("off", "on"):
            p = row["peak"][name]
            print(f"| cache {name} | {p['training_peak_mib']:,} | {p['process_peak_mib']:,} | "
                  f"{p['resident_after_mib']:,} | {p['live_peak_mib']:,} |")
    print(f"median of {args.rounds} ABBA rounds per setting, one process; peak: "
          f"{args.peak_steps} steps in a fresh process per setting")
    return 0


if __name__ == "__main__":
    sys.exit(main())
