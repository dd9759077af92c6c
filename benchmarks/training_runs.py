"""``lightning-fullgraph train --json`` runs for the benchmarks: run, remember, summarize.

A configuration is a name and the ``train`` flags it adds (``--codec int2``, ``--cache
adaptive``, ...); every run has ``--no-step-aside``, so that the configuration's reductions
stay on and its row measures them.  Every finished run is appended to a JSON-lines file and reused by later
invocations with the same dataset, model, configuration name, seed, epochs, hidden width,
processes and aggregation, so an interrupted benchmark resumes where it stopped and two
benchmarks share their baselines (``fp32`` hybrid and ``post``).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ._common import REPO as ROOT

__all__ = ["Runs", "train", "compare", "table"]


class Runs:
    r"""The finished runs, kept in a JSON-lines file (``None``: in memory only)."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self.done: Dict[str, Dict] = {}
        if path is not None and path.is_file():
            for line in path.read_text().splitlines():
                if line.strip():
                    run = json.loads(line)
                    self.done[run["key"]] = run

    def get(self, key: str) -> Optional[Dict]:
        return self.done.get(key)

    def add(self, run: Dict) -> None:
        self.done[run["key"]] = run
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as fh:
                fh.write(json.dumps(run) + "\n")


def train(runs: Runs, parts: int, dataset: str, model: str, name: str, flags: Sequence[str],
          seed: int, epochs: int, hidden: int, aggregation: str = "hybrid") -> Dict:
    r"""One ``train --json`` run (or the stored one): its JSON summary plus ``wall_s``."""
    # Step aside off: a configuration's reductions stay on throughout, so that its row measures
    # them (with step aside on, the trial drops whatever does not shorten this machine's step,
    # and every row would read as exact). Part of the key: runs stored with it on differ.
    key = json.dumps([dataset, model, name, seed, epochs, hidden, parts, aggregation,
                      "no-step-aside"])
    if runs.get(key) is not None:
        return runs.get(key)
    cmd = [sys.executable, "-m", "lightning_fullgraph.cli", "train", "--json", "--no-progress",
           "--dataset", dataset, "--devices", str(parts), "--model", model,
           "--epochs", str(epochs), "--hidden", str(hidden), "--seed", str(seed),
           "--aggregation", aggregation, "--no-step-aside", *flags]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-3000:]}")
    out = json.loads(run.stdout[run.stdout.index("{"):])
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["key"], out["config"] = key, name
    runs.add(out)
    return out


def compare(runs: Runs, parts: int, say: Callable[[str], None], dataset: str,
            models: Sequence[str], configs: Dict[str, Sequence[str]], seeds: Sequence[int],
            epochs: int, hidden: int, extra: Sequence[str] = (),
            suffix: str = "") -> List[Dict[str, Any]]:
    r"""Every (model, configuration) over the seeds, hybrid aggregation, against a ``post``
    fp32 baseline and the configuration called ``fp32`` (the exact hybrid run).  :obj:`extra`
    flags go to every run (the baselines included) and :obj:`suffix` to their names (e.g.
    ``--dropout 0`` and ``"@dropout0"``)."""
    rows = []
    for model in models:
        baseline = [train(runs, parts, dataset, model, "fp32" + suffix, tuple(extra), s, epochs,
                          hidden, "post") for s in seeds]
        post_mb = statistics.mean(r["comm_MB_per_epoch_per_rank"] for r in baseline)
        # The baseline's accuracy too: a curated table shows post fp32 as a row of its own.
        post_acc = [r["test_acc"] for r in baseline]
        say(f"{dataset} {model} post fp32: {post_mb:.4f} MB/epoch/rank")
        fp32_acc = fp32_mb = None
        for name, flags in configs.items():
            done = []
            for seed in seeds:
                done.append(train(runs, parts, dataset, model, name + suffix,
                                  tuple(flags) + tuple(extra), seed, epochs, hidden))
                r = done[-1]
                say(f"{dataset} {model} {name} seed {seed}: test {r['test_acc']:.4f}, "
                    f"{r['comm_MB_per_epoch_per_rank']:.4f} MB/epoch/rank, {r['wall_s']} s")
            acc = [r["test_acc"] for r in done]
            mb = statistics.mean(r["comm_MB_per_epoch_per_rank"] for r in done)
            mean = statistics.mean(acc)
            if name == "fp32":
                fp32_acc, fp32_mb = mean, mb
            skipped = [r.get("rows_skipped_frac") for r in done]
            by_direction = {d: [r.get(f"rows_skipped_frac_{d}") for r in done]
                            for d in ("forward", "backward")}
            rows.append({
                "dataset": dataset, "model": model, "config": name + suffix,
                "flags": list(flags) + list(extra),
                "aggregation": "hybrid", "seeds": list(seeds), "epochs": epochs,
                "hidden": hidden, "test_acc": acc, "test_acc_mean": mean,
                "test_acc_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                "delta_pp_vs_fp32": None if fp32_acc is None else 100 * (mean - fp32_acc),
                "MB_per_epoch_per_rank": mb, "post_fp32_MB": post_mb,
                "post_fp32_test_acc_mean": statistics.mean(post_acc),
                "post_fp32_test_acc_std": statistics.stdev(post_acc) if len(post_acc) > 1 else 0.0,
                "reduction_vs_post_fp32": post_mb / mb if mb else None,
                "reduction_vs_hybrid_fp32": fp32_mb / mb if mb and fp32_mb else None,
                "bits_mean": statistics.mean(r.get("bits_mean") or 32.0 for r in done),
                "rows_skipped_frac": None if None in skipped else statistics.mean(skipped),
                **{f"rows_skipped_frac_{d}": None if None in v else statistics.mean(v)
                   for d, v in by_direction.items()},
                "exchange_s": statistics.median(r["exchange_s_per_epoch"] for r in done),
                "step_s": statistics.median(r["train_step_seconds"] for r in done),
            })
    return rows


def table(rows: List[Dict[str, Any]]) -> str:
    r"""The rows of :func:`compare` as a text table."""
    lines = [f"{'dataset':10} {'model':5} {'config':17} {'test acc':>15} {'Δ pp':>6} "
             f"{'bits':>5} {'skip %':>6} {'fwd/bwd %':>9} {'MB/ep/rank':>10} {'×post fp32':>10} "
             f"{'×hyb fp32':>9} {'exch ms':>8} {'step ms':>8}"]

    def percent(value) -> str:
        return "" if value is None else f"{100 * value:.0f}"

    for r in rows:
        delta = "" if r["delta_pp_vs_fp32"] is None else f"{r['delta_pp_vs_fp32']:+.2f}"
        skip = "" if r["rows_skipped_frac"] is None else f"{100 * r['rows_skipped_frac']:.1f}"
        fwd, bwd = r.get("rows_skipped_frac_forward"), r.get("rows_skipped_frac_backward")
        split = "" if fwd is None or bwd is None else f"{percent(fwd)}/{percent(bwd)}"
        lines.append(f"{r['dataset'][:10]:10} {r['model']:5} {r['config']:17} "
                     f"{100 * r['test_acc_mean']:7.2f} ± {100 * r['test_acc_std']:5.2f} "
                     f"{delta:>6} {r['bits_mean']:5.2f} {skip:>6} {split:>9} "
                     f"{r['MB_per_epoch_per_rank']:10.4f} {r['reduction_vs_post_fp32']:10.2f} "
                     f"{r['reduction_vs_hybrid_fp32'] or 1.0:9.2f} "
                     f"{1e3 * r['exchange_s']:8.1f} {1e3 * r['step_s']:8.1f}")
    return "\n".join(lines)
