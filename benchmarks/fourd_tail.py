#!/usr/bin/env python
"""ScaleGNN's element-wise tail (RMSNorm scale, ReLU, dropout, residual add) eager against torch.compile.

Usage::

    python -m benchmarks fourd_tail                 # the (2,2,1) block of a 50,000-vertex batch
    python -m benchmarks fourd_tail --batch 500000 --hidden 256 --grid 2,2,2 --json

ScaleGNN §V-C fuses the tail of each layer with ``torch.compile`` (6 % of a step on their
GPUs).  Here the tail of one layer runs on the block one process of the grid holds (the
batch's rows split over the layer's output-row axis, the hidden channels over its column axis:
``B / x`` by ``h / y`` for the first layer of an ``(x, y, z)`` grid), forward and backward,
``--repeats`` times, eager and compiled (``dynamic=False``: the blocks keep their shape from
step to step), one thread per process as the grid's ranks share a machine's cores.  Reported:
milliseconds per call of each, the first compiled call (compilation), and what compiling saves
over ``--steps`` training steps of ``--layers`` layers net of compiling once (negative: it
costs more than it saves).  The row-norm's all-reduce of the grid is not part of the tail.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from ._common import add_out_argument, write_result


def tail(xc, gamma, residual, keep, eps: float = 1e-6):
    r"""The layer's element-wise tail on a block (the squared norms summed over the grid are
    not part of it: here a local mean stands in for them)."""
    xn = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps) * gamma
    return F.relu(xn) * keep + residual


def _per_call(fn, args, repeats: int) -> float:
    for _ in range(3):
        fn(*args).sum().backward()
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*args).sum().backward()
    return (time.perf_counter() - start) / repeats


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=50000, help="vertices per step")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--grid", default="2,2,1", help="x,y,z")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--steps", type=int, default=200, help="training steps of a run")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    add_out_argument(p)
    args = p.parse_args(argv)
    x, y, _ = (int(v) for v in args.grid.split(","))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows, cols = args.batch // x, args.hidden // y
    block = (torch.randn(rows, cols, requires_grad=True), torch.ones(cols, requires_grad=True),
             torch.randn(rows, cols, requires_grad=True),
             (torch.rand(rows, cols) >= 0.5).float() * 2)
    compiled = torch.compile(tail, dynamic=False)
    start = time.perf_counter()
    compiled(*block).sum().backward()
    first = time.perf_counter() - start
    eager_s = _per_call(tail, block, args.repeats)
    compiled_s = _per_call(compiled, block, args.repeats)
    saved = (eager_s - compiled_s) * args.layers * args.steps
    result = {"batch": args.batch, "hidden": args.hidden, "grid": args.grid,
              "block": [rows, cols], "layers": args.layers, "steps": args.steps,
              "threads": args.threads, "eager_ms": 1000 * eager_s,
              "compiled_ms": 1000 * compiled_s, "speedup": eager_s / compiled_s,
              "first_compiled_call_s": first,
              "saved_per_step_ms": 1000 * (eager_s - compiled_s) * args.layers,
              "net_saved_per_run_s": saved - first}
    write_result("fourd_tail", result, args.out)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(json.dumps(result))
    print(f"block {rows} x {cols} ({args.grid} grid, batch {args.batch}, hidden {args.hidden}), "
          f"{args.threads} thread(s):")
    print(f"  eager {1000 * eager_s:.2f} ms, compiled {1000 * compiled_s:.2f} ms per layer "
          f"(forward + backward, {eager_s / compiled_s:.1f}x); compiling took {first:.1f} s")
    print(f"  saved per step ({args.layers} layers): {result['saved_per_step_ms']:.1f} ms; "
          f"over {args.steps} steps net of compiling: {result['net_saved_per_run_s']:+.1f} s")


if __name__ == "__main__":
    main()
