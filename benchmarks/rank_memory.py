#!/usr/bin/env python
"""Where one rank's memory goes: resident set by training phase, and what stays between epochs.

Usage::

    python -m benchmarks fullgraph --kernels auto --aggregation hybrid --parts 4 --validate
    python -m benchmarks rank_memory --partition-dir /tmp/fgcache/partitions/<graph>-p4-<opts>

Runs the training loop of ``benchmarks/fullgraph.py`` (2-layer GCN or SAGE, hidden 128, Adam,
the engine with the kernels, a validation forward after every step) on a partition that
script wrote, one gloo process per part, one thread each. Rank ``--rank`` samples its own
``VmRSS`` every 0.5 ms and attributes each sample to the phase running then (forward / backward
of each top-level layer, loss, optimizer step, validation), so the table shows which phase
holds the peak. At set points it also sums ``/proc/self/smaps`` by kind (anonymous memory,
glibc heap, the partition file mapped by ``torch.load(mmap=True)``, other files: the
libraries), and at the end it lists the tensors larger than 1 MiB that Python objects hold
(storages counted once, with the class and attribute that hold them).
Reported: JSON on stdout (``--json``: only the JSON), then the tables.

RSS is sampled, so a peak shorter than the sampling period can be missed; ``fullgraph.py``'s
``ru_maxrss`` is the figure to compare against issue #8's goal.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List
from lightning_fullgraph.engine import ExchangeConfig

from ._common import add_out_argument, write_result


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def smaps_by_kind(partition_dir: str) -> Dict[str, float]:
    r"""Resident MiB of this process by kind of mapping."""
    out = {"anon": 0.0, "heap": 0.0, "partition": 0.0, "files": 0.0}
    name = None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                name = parts[5] if len(parts) > 5 else ""
            elif parts[0] == "Rss:":
                kind = ("anon" if name == "" else "heap" if name == "[heap]"
                        else "partition" if name.startswith(partition_dir) else "files")
                out[kind] += int(parts[1]) / 1024
    return {k: round(v, 1) for k, v in out.items()}


def held_tensors(min_bytes: int = 1 << 20) -> List[Dict[str, Any]]:
    r"""CPU tensors larger than :obj:`min_bytes` that Python objects hold, one per storage,
    with the attributes that hold them."""
    import torch
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    seen: Dict[int, Dict[str, Any]] = {}
    for t in tensors:
        try:
            if t.device.type != "cpu" or t.untyped_storage().nbytes() <= min_bytes:
                continue
            ptr = t.untyped_storage().data_ptr()
        except RuntimeError:  # e.g. sparse or meta tensors
            continue
        row = seen.setdefault(ptr, {"mib": round(t.untyped_storage().nbytes() / 2**20, 1),
                                    "shape": list(t.shape), "dtype": str(t.dtype),
                                    "held_by": []})
        for ref in gc.get_referrers(t):
            if not isinstance(ref, dict):  # a slotted object, or a container (not named)
                if not isinstance(ref, (list, tuple, set)) and type(ref).__name__ != "frame":
                    row["held_by"].append(type(ref).__name__)
                continue
            for owner in gc.get_referrers(ref):
                if getattr(owner, "__dict__", None) is ref:
                    row["held_by"] += [f"{type(owner).__name__}.{k}" for k, v in ref.items()
                                       if v is t]
    return sorted(seen.values(), key=lambda r: -r["mib"])


def _train(rank: int, world: int, cfg: Dict[str, Any]) -> Dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch_geometric import nn as pyg_nn

    from .fullgraph import _build_model
    from lightning_fullgraph.engine import FullGraphEngine
    from lightning_fullgraph.kernels import huge_pages
    from lightning_fullgraph.partition import load_partition

    torch.set_num_threads(1)
    me = rank == cfg["rank"]
    phase, peaks, order, points = ["load"], {}, [], []
    epoch = [""]  # "e<N> " with --by-epoch: each epoch's phases apart
    stop = [False]

    lock = threading.Lock()

    def record(name: str) -> None:
        now = _rss_mib()
        with lock:
            if name not in peaks:
                order.append(name)
            peaks[name] = max(peaks.get(name, 0.0), now)

    def sample() -> None:
        while not stop[0]:
            record(phase[0])
            time.sleep(0.0005)

    def enter(name: str) -> None:
        # One sample on entry, taken here: a phase shorter than the sampling period (or one
        # the sampler's thread is not scheduled during, on a loaded machine) is still listed.
        phase[0] = name
        if me:
            record(name)

    def point(label: str) -> None:
        if me:
            points.append({"point": label, "rss_mib": round(_rss_mib(), 1),
                           **smaps_by_kind(cfg["partition_dir"])})

    point("before loading")
    thread = threading.Thread(target=sample, daemon=True)
    if me:
        thread.start()
    huge_pages.enable_for_kernels(None)  # as FullGraphStrategy does, before the data
    part = load_partition(cfg["partition_dir"], rank, num_parts=world)
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation=cfg["aggregation"]))
    point("engine built")
    data = engine.data
    x, edge_index, y, mask = data.x, data.edge_index, data.y, data.train_mask
    torch.manual_seed(0)
    model = _build_model(torch.nn, pyg_nn, cfg["model"], x.size(1), 128,
                         int(cfg["num_classes"]), 0.0)
    enter("attach")
    engine.attach(model)
    engine.use_kernels("auto")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for name, module in model.named_children():
        def pre(_m, _a, name=name):
            enter(f"{epoch[0]}{'val' if not _m.training else 'fwd'} {name}")

        def bwd(_m, _g, name=name):
            enter(f"{epoch[0]}bwd {name}")
        module.register_forward_pre_hook(pre)
        module.register_full_backward_pre_hook(bwd)
    import torch.distributed as dist
    for e in range(int(cfg["epochs"])):
        epoch[0] = f"e{e} " if cfg["by_epoch"] else ""
        dist.barrier()
        opt.zero_grad(set_to_none=True)
        out = model(x, edge_index)
        enter("loss")
        loss = F.cross_entropy(out[mask], y[mask])
        engine.backward(loss)
        enter("optimizer step")
        opt.step()
        model.eval()
        with torch.no_grad():
            model(x, edge_index)
        model.train()
        enter("between epochs")
        del out, loss
        time.sleep(0.005)
        point(f"after epoch {e}")
    stop[0] = True
    if not me:
        return {}
    thread.join()
    held = held_tensors()
    return {"rank": rank, "phase_peaks_mib": {p: round(peaks[p], 1) for p in order},
            "points": points, "held_tensors": held,
            "held_tensors_mib": round(sum(r["mib"] for r in held), 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partition-dir", required=True,
                        help="a partition written by benchmarks/fullgraph.py (its --cache-dir)")
    parser.add_argument("--rank", type=int, default=0, help="the rank that measures itself")
    parser.add_argument("--model", choices=("gcn", "sage"), default="gcn")
    parser.add_argument("--aggregation", choices=("post", "pre", "hybrid"), default="hybrid")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--num-classes", type=int, default=16)
    parser.add_argument("--by-epoch", action="store_true",
                        help="each epoch's forward/backward/validation phases apart (e.g. the "
                             "first epoch, which builds the caches, against the later ones)")
    parser.add_argument("--json", action="store_true", help="only the JSON on stdout")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    from lightning_fullgraph.partition import read_manifest
    from lightning_fullgraph.testing import run_distributed
    world = int(read_manifest(args.partition_dir)["num_parts"])
    if not 0 <= args.rank < world:
        parser.error(f"--rank {args.rank}: the partition has {world} parts")
    cfg = {"partition_dir": str(Path(args.partition_dir).resolve()), "rank": args.rank,
           "model": args.model, "aggregation": args.aggregation, "epochs": args.epochs,
           "num_classes": args.num_classes, "by_epoch": args.by_epoch}
    os.environ["OMP_NUM_THREADS"] = "1"
    result = run_distributed(_train, world, cfg, timeout_s=1800)[args.rank]
    result.update(parts=world, **{k: v for k, v in cfg.items() if k != "rank"})
    print(json.dumps(result, indent=2))
    write_result('rank_memory', result, args.out)
    if args.json:
        return 0
    print(f"\nrank {args.rank} of {world}: peak VmRSS (MiB) by phase, in order of first sample")
    for name, mib in result["phase_peaks_mib"].items():
        print(f"  {name:<24}{mib:>9,.0f}")
    print("\nresident MiB by mapping: anon / glibc heap / partition file / other files")
    for p in result["points"]:
        print(f"  {p['point']:<24}{p['rss_mib']:>9,.0f}  = {p['anon']:,.0f} / {p['heap']:,.0f}"
              f" / {p['partition']:,.0f} / {p['files']:,.0f}")
    print(f"\ntensors > 1 MiB held at the end: {result['held_tensors_mib']:,.0f} MiB")
    for r in result["held_tensors"][:20]:
        print(f"  {r['mib']:>8,.1f}  {str(r['shape']):<18}{r['dtype']:<15}"
              f"{', '.join(sorted(set(r['held_by']))) or '(held by closures or C++)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
