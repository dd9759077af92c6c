"""Throughput of the wire codecs: encode + decode of float32 rows against a memory copy.

Usage::

    python -m benchmarks codecs                       # 200k x 128 float32 rows, CPU
    python -m benchmarks codecs --quick               # 20k x 128, fewer repeats
    python -m benchmarks codecs --device cuda         # Triton vs the reference on a GPU
    python -m benchmarks codecs --json out.json

For every codec (:class:`QuantizedCodec` at 1, 2, 4 and 8 bits with stochastic rounding, and
:class:`BFloat16Codec`) and implementation (C++ or Triton, and the pure-PyTorch reference),
it times ``encode`` and ``decode`` of the same rows through the codec's public methods (so the
context hashing and the output allocation are counted), and reports the throughput in GB/s
of float32 input, ``rows * F * 4 / (t_encode + t_decode)``, each time the best of R. The
baseline is ``torch.clone`` of the same rows (a fresh output, as a decode allocates one),
also reported as GB/s of input (its read + write traffic is 8 bytes per element, about what
an encode + decode moves). Contenders and the copy run round-robin, R rounds, so a shared
machine's load hits them alike; the load average is recorded. Goal: at least 50 % of the copy.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Callable, Dict, List

import torch

from lightning_fullgraph.engine.codecs import BFloat16Codec, QuantizedCodec, WireContext

from ._common import add_out_argument, write_result


def _timer(device: torch.device, inner: int) -> Callable[[Callable[[], object]], float]:
    r"""Seconds per call of ``fn``, averaged over :obj:`inner` back-to-back calls (on a GPU a
    single call is as short as the launch and the host synchronization)."""
    def run(fn):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / inner
    return run


def main(argv: List[str] = None) -> Dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7, help="rounds (best of) for fast contenders")
    p.add_argument("--reference-repeats", type=int, default=2,
                   help="rounds for the pure-PyTorch reference (slow)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--inner", type=int, default=None,
                   help="calls per timing (default: 1 on CPU, 20 on CUDA)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None, help="write the results to this file (default: codecs-<time>.json in "
                   "the results directory, see --out)")
    add_out_argument(p)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.repeats, args.reference_repeats = 20_000, 3, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    inner = args.inner or (20 if device.type == "cuda" else 1)
    timed = _timer(device, inner)
    n, f = args.rows, args.features
    x = torch.randn(n, f, generator=torch.Generator().manual_seed(0)).to(device)
    ctx = WireContext("bench.x", "forward", 1, 0, f, torch.float32, 0)
    fast = "triton" if device.type == "cuda" else "cpp"

    contenders = []  # (name, backend, codec)
    for backend in (fast, "torch"):
        for bits in (1, 2, 4, 8):
            contenders.append((f"int{bits}", backend, QuantizedCodec(bits, backend=backend)))
    contenders.append(("bf16", "torch", BFloat16Codec()))

    # Warm-up: builds the C++ extension / compiles the Triton kernels, faults pages in.
    for _, _, codec in contenders:
        codec.decode(codec.encode(x, ctx), ctx)
    x.clone()

    best: Dict[str, Dict[str, float]] = {}
    clone_best = float("inf")
    for rnd in range(args.repeats):
        clone_best = min(clone_best, timed(lambda: x.clone()))
        for name, backend, codec in contenders:
            if backend == "torch" and name != "bf16" and rnd >= args.reference_repeats:
                continue
            key = f"{name}/{backend}"
            wire = codec.encode(x, ctx)
            t_enc = timed(lambda: codec.encode(x, ctx))
            t_dec = timed(lambda: codec.decode(wire, ctx))
            entry = best.setdefault(key, {"encode_s": float("inf"), "decode_s": float("inf"),
                                          "wire_bytes": wire.numel() * wire.element_size()})
            entry["encode_s"] = min(entry["encode_s"], t_enc)
            entry["decode_s"] = min(entry["decode_s"], t_dec)

    gb = n * f * 4 / 1e9
    clone_gbs = gb / clone_best
    results = []
    for key, e in best.items():
        name, backend = key.split("/")
        total = e["encode_s"] + e["decode_s"]
        results.append(dict(codec=name, backend=backend, encode_s=e["encode_s"],
                            decode_s=e["decode_s"], encode_gbs=gb / e["encode_s"],
                            decode_gbs=gb / e["decode_s"], roundtrip_gbs=gb / total,
                            vs_clone=(gb / total) / clone_gbs,
                            compression=n * f * 4 / e["wire_bytes"]))
    report = dict(rows=n, features=f, device=str(device),
                  device_name=(torch.cuda.get_device_name(device) if device.type == "cuda"
                               else platform.processor() or platform.machine()),
                  threads=torch.get_num_threads(), repeats=args.repeats, inner=inner,
                  reference_repeats=args.reference_repeats,
                  loadavg=os.getloadavg() if hasattr(os, "getloadavg") else None,
                  clone_s=clone_best, clone_gbs=clone_gbs, results=results)

    print(f"# {n} x {f} float32 rows ({gb * 1e3:.0f} MB) on {report['device_name']}, "
          f"{report['threads']} threads, load {report['loadavg']}")
    ms, unit = ("us", 1e6) if device.type == "cuda" else ("ms", 1e3)
    print(f"# torch.clone: {clone_gbs:.2f} GB/s ({clone_best * unit:.1f} {ms})")
    head = (f"{'codec':<6} {'backend':<7} {'ratio':>6} {'enc ' + ms:>8} {'dec ' + ms:>8} "
            f"{'enc GB/s':>9} {'dec GB/s':>9} {'enc+dec GB/s':>13} {'vs clone':>9}")
    print(head)
    print("-" * len(head))
    for r in results:
        print(f"{r['codec']:<6} {r['backend']:<7} {r['compression']:>5.1f}x "
              f"{r['encode_s'] * unit:>8.1f} {r['decode_s'] * unit:>8.1f} {r['encode_gbs']:>9.2f} "
              f"{r['decode_gbs']:>9.2f} {r['roundtrip_gbs']:>13.2f} {r['vs_clone']:>8.0%}")
    print(json.dumps(report))
    write_result("codecs", report, args.out, path=args.json, indent=2)
    return report


if __name__ == "__main__":
    main()
