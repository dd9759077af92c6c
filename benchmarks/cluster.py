#!/usr/bin/env python
"""Training steps on an emulated cluster: what a user on N machines with a given link sees.

Every configuration is one multi-node job: ``lightning-fullgraph train`` under one ``torchrun``
per node of a :class:`~lightning_fullgraph.cluster.EmulatedCluster` (network namespaces on a
bridge, each node's link shaped to ``--rate`` with tc tbf; needs root), as a user launches it
on N machines.  Per configuration it records, from rank 0's ``--json`` summary: the median
training step of the steady state (the second half of the epochs, and none before step
aside's decision: its trial times every arm; a run that ends in the trial is flagged
``in_trial`` and marked in the table), the exchange seconds per epoch (time blocked in halo exchanges: with overlap or
the asynchronous pipeline only what was not hidden), bytes per epoch per rank, the accuracy
curve (validation accuracy against training seconds) and the final test accuracy, and from
them the step ratio against exact post-aggregation of the same model and link, and the time
to 95 % of the exact run's best validation accuracy.  With the link calibrated at each job's
fit start (``train --link calibrate``; ``--no-predict`` skips it), or fitted to the
exchanges of another configuration's run (``--link-from post+nooverlap``: the link as training
meets it), it also records the planner's step and its ratio to the measured step: the
reference run's measured compute (its training step without its blocked exchanges, the least
over ranks: the others also wait at the gradient all-reduce for the last to arrive), slowed
by the transfers the configuration keeps in flight beside it (the link's calibrated
contention, taken out of the reference's first), plus the
configuration's predicted exchange seconds that the work it runs while they are in flight
does not hide (measured windows; no less than the link is busy with the transfers the step
waits for: the asynchronous pipeline's run into the next step; for transfers in flight past
the step, the step's own collectives' wait behind them, at the link's calibrated queue wait),
plus its codec's (:func:`~lightning_fullgraph.planner.predicted_step_seconds`).

Usage::

    python -m benchmarks cluster                                   # the issue's matrix
    python -m benchmarks cluster --quick                           # Cora, 2 nodes, 2 configs
    python -m benchmarks cluster --models sage --configs post int2 --rates 1gbit 10gbit
    python -m benchmarks cluster --replot results.json --plot out.png

Configurations (``--configs``): ``post`` (exact, post-aggregation), ``hybrid`` (exact),
``auto`` (exact: per layer the mode predicted fastest on the link calibrated at start-up),
``int2`` (post rows as int2), ``int2c`` (int2-compact: the rows' zero point and scale
as bfloat16, 4 header bytes instead of 8), ``hybrid-int2c`` (the same codec on hybrid's rows
and partials, in one buffer), ``cache-int2c`` (adaptive halo cache with int2-compact rows),
``cache-int2c-budgeted`` (the same in one collective per exchange),
``pipeline`` (one-epoch-stale rows), ``pipeline-int2`` (both), ``cache-int2c-pipeline`` (the
cache's rows carried by the pipeline), ``sampling`` (boundary
sampling p = 0.1), ``sampling-int2`` (sampled rows as int2), and
``4d-grid``, ``4d-dp2-grid``, ``4d-grid-shards`` (FourDStrategy's default recipe on a
(2,2,1) grid, on dp 2 x (2,1,1), on (2,2,1) with ``--shards``) and ``neighbor-sage``
(NeighborLoader GraphSAGE with DDP: torch-sparse or pyg-lib on ``PYTHONPATH``) are other
strategies on the same machines, timed to the same accuracy (their collectives are not timed
apart from their step), and
``+nooverlap`` after any name (overlap is on by default), ``+aside`` (``--step-aside``: every
configuration runs with ``--no-step-aside`` otherwise, so that each stage is timed as
configured).
By default N nodes on fewer cores are dilated (:meth:`EmulatedCluster.dilated`): each node is
held to ``cores / N`` CPUs and ``rate * cores / N`` of link, so N one-core machines on links
of ``rate`` are emulated with every time stretched by ``N / cores`` (in the JSON:
``dilation``); ``--node-cores K`` emulates K-core machines (ranks run K threads, time is
stretched K times more, the link slowed as much); ``--no-dilate`` lets the nodes share the
cores freely.  Read ratios.  A node is a CPU quota, which charges the time OpenMP's threads
spin after each parallel region as work, where a machine's own idle cores would spin for
free: the nodes run with ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep at once) unless
``--omp-wait-policy inherit`` leaves the caller's environment's (OpenMP's default, spinning,
where it sets none); each row records the policy it ran under (``omp_wait_policy``; rows
written before cda1158 have none, or ``"default"``: they spun).

Prints a table, writes JSON (``--json-out``, default ``cluster-<time>.json`` in the results
directory: ``--out DIR``, ``$LIGHTNING_FULLGRAPH_BENCH_DIR`` or
``~/.cache/lightning_fullgraph/benchmarks``) and, with ``--plot``, a figure of step time per
configuration and model (``python -m benchmarks plot cluster RESULTS.json --out FIG.png`` draws
it again from the file).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from lightning_fullgraph.cluster import EmulatedCluster
from lightning_fullgraph.planner.step import predicted_step_seconds

from ._common import REPO, add_out_argument, result_path

#: ``train`` options of every configuration.
CONFIGS: Dict[str, List[str]] = {
    "post": ["--aggregation", "post"],
    "hybrid": ["--aggregation", "hybrid"],
    "auto": ["--aggregation", "auto", "--link", "calibrate"],
    "int2": ["--aggregation", "post", "--codec", "int2"],
    "int2c": ["--aggregation", "post", "--codec", "int2-compact"],
    "hybrid-int2c": ["--aggregation", "hybrid", "--codec", "int2-compact"],
    "cache-int2c": ["--aggregation", "post", "--codec", "int2-compact", "--cache", "adaptive"],
    "cache-int2c-budgeted": ["--aggregation", "post", "--codec", "int2-compact", "--cache",
                             "budgeted"],
    "pipeline": ["--aggregation", "post", "--pipeline", "async"],
    "sampling": ["--aggregation", "post", "--sampling", "0.1"],
    "pipeline-int2": ["--aggregation", "post", "--pipeline", "async", "--codec", "int2"],
    "cache-int2c-pipeline": ["--aggregation", "post", "--codec", "int2-compact", "--cache",
                             "adaptive", "--pipeline", "async"],
    "sampling-int2": ["--aggregation", "post", "--sampling", "0.1", "--codec", "int2"],
    # What else a user could run on the same machines (time to accuracy against exact post):
    # FourDStrategy's default recipe (sampled half-graph batches) on a grid, with replicas or
    # on shards, and PyG's NeighborLoader GraphSAGE (fan-out 25, 10) with DDP.
    "4d-grid": ["--strategy", "4d", "--grid", "2,2,1"],
    "4d-dp2-grid": ["--strategy", "4d", "--dp", "2", "--grid", "2,1,1"],
    "4d-grid-shards": ["--strategy", "4d", "--grid", "2,2,1", "--shards"],
    "neighbor-sage": ["--strategy", "pyg", "--loader", "neighbor", "--batch-size", "32",
                      "--model", "sage"],
}
MATRIX = dict(models=["gcn", "sage"], configs=[n for n, a in CONFIGS.items()
                                               if "--strategy" not in a],
              rates=["1gbit"], nodes=[4],
              dataset="synthetic:nodes=200000,degree=10", hidden=256, epochs=8, seeds=[0])
QUICK = dict(models=["gcn"], configs=["post", "hybrid"], rates=["1gbit"], nodes=[2],
             dataset="cora", hidden=16, epochs=5, seeds=[0])


#: Options a configuration name may add after ``+`` (``"int2+aside"``, ``"post+nooverlap"``;
#: overlap is on by default).
SUFFIXES = {"overlap": ["--overlap"], "nooverlap": ["--no-overlap"], "aside": ["--step-aside"],
            "4k": ["--huge-pages", "off"], "duplex": ["--duplex"]}
#: Options of every configuration before its suffixes: each stage timed as configured (``train``
#: steps aside by default; ``+aside`` turns that back on), with large CPU tensors in huge
#: pages (an opt-in of the library, which every earlier run of this benchmark had by default;
#: ``+4k`` keeps torch's allocator, to measure what the opt-in gains here).
BASE = ["--no-step-aside", "--huge-pages", "on"]


def config_args(name: str) -> List[str]:
    r"""``train`` options of a configuration name (``"hybrid+overlap"`` adds ``--overlap``,
    ``"int2+aside"`` ``--step-aside``)."""
    base, *extras = name.split("+")
    if base not in CONFIGS or any(extra not in SUFFIXES for extra in extras):
        raise ValueError(f"unknown configuration {name!r}: one of {', '.join(CONFIGS)}, "
                         f"optionally with {', '.join('+' + s for s in SUFFIXES)}")
    base_args = [] if _other_strategy(base) else BASE  # BASE: full-graph options
    return base_args + CONFIGS[base] + [arg for extra in extras for arg in SUFFIXES[extra]]


def _other_strategy(name: str) -> Optional[str]:
    r"""The ``--strategy`` of a configuration other than full-graph training, or ``None``."""
    args = CONFIGS[name.split("+")[0]]
    return args[args.index("--strategy") + 1] if "--strategy" in args else None


def run_job(cluster: EmulatedCluster, model: str, config: str, opts: argparse.Namespace,
            seed: int, port: int, link: Optional[str] = None,
            save_link: Optional[str] = None) -> Dict[str, Any]:
    r"""One multi-node training job; rank 0's JSON summary plus the wall time.  The planner
    predicts on :obj:`link` (a file written by ``train --save-link``; default: calibrated at
    fit start), and :obj:`save_link` gets the link fitted to the job's exchanges."""
    args = ["-m", "lightning_fullgraph.cli", "train", "--dataset", opts.dataset, "--model",
            model, "--hidden", str(opts.hidden), "--layers", str(opts.layers), "--dropout", "0",
            "--epochs",
            str(opts.epochs), "--val-every", "1", "--seed", str(seed), "--num-nodes",
            str(cluster.nodes), "--devices", "1", "--json", *config_args(config)]
    strategy = _other_strategy(config)
    if strategy != "pyg":
        args += ["--timeout", "600"]
    if strategy is None or "--shards" in args:
        args += ["--cache-dir", str(opts.cache_dir)]
    if opts.predict and strategy is None:
        # The planner's exchange and codec seconds per step, on the shaped link.
        args += ["--link", link or "calibrate"]
        if save_link:
            args += ["--save-link", save_link]
    # A rank runs as many threads as its emulated machine has cores (a dilated cluster), or
    # its share of this machine's.
    threads = cluster.node_cores or max(1, (os.cpu_count() or 1) // cluster.nodes)
    # The checkout's package first (then the caller's path: e.g. torch-sparse for
    # NeighborLoader, installed aside).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = dict(PYTHONPATH=path, OMP_NUM_THREADS=str(threads), **node_openmp_env(opts))
    start = time.perf_counter()
    procs = cluster.torchrun(args, env=env, port=port, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    outs = [p.communicate(timeout=opts.job_timeout) for p in procs]
    wall = time.perf_counter() - start
    codes = [p.returncode for p in procs]
    if any(codes):
        raise RuntimeError(f"{model}/{config}: exit codes {codes}:\n" + outs[0][1][-3000:])
    text = outs[0][0]
    summary = json.loads(text[text.index("{"):])
    summary["wall_s"] = round(wall, 2)
    return summary


def node_openmp_env(opts: argparse.Namespace) -> Dict[str, str]:
    r"""OpenMP settings the nodes run with beyond the caller's environment (which they
    inherit): threads that sleep at once, unless ``--omp-wait-policy inherit``.  Spinning
    costs a machine nothing on cores it does not use, but a node's CPU quota charges it as
    work (3-layer GraphSAGE, int2-compact, two-core nodes: 3.655 s a step spinning, 2.877 s
    passive), which would make the emulated machines slower than the ones they stand for."""
    return {} if opts.omp_wait_policy == "inherit" else {"OMP_WAIT_POLICY": "PASSIVE"}


def openmp_wait_policy(opts: argparse.Namespace) -> str:
    r"""The wait policy the nodes ran under, as a row records it."""
    return node_openmp_env(opts).get("OMP_WAIT_POLICY") \
        or os.environ.get("OMP_WAIT_POLICY") or "default"


def time_to(trace: List[List[float]], target: float) -> Optional[float]:
    r"""Training seconds at the first validation reaching :obj:`target` (``None``: never)."""
    for _, seconds, acc in trace:
        if acc >= target:
            return float(seconds)
    return None


def derive(rows: List[Dict[str, Any]], reference: str = "post") -> None:
    r"""Adds ratios against exact post (the :obj:`reference` configuration) of the same model,
    rate, node count and seed (any seed's where the seed's own is missing), in place."""
    for row in rows:
        ref = [r for r in rows if r["config"] == reference and r["model"] == row["model"]
               and r["rate"] == row["rate"] and r["nodes"] == row["nodes"]]
        if not ref:
            continue
        same_seed = [r for r in ref if r.get("seed") == row.get("seed")]
        base = (same_seed or ref)[0]
        row["step_vs_post"] = row["step_s"] / base["step_s"] if base["step_s"] else None
        # The planner's step (lightning_fullgraph.planner.predicted_step_seconds): the
        # reference run's measured compute (its step without its blocked exchanges, least over
        # ranks: rank 0's own also counts its wait at the gradient all-reduce for a rank whose
        # exchange took longer; older results have rank 0's only), taken back to no transfer in
        # flight and slowed by this configuration's (the link's contention; older results: 0),
        # plus this configuration's predicted exchange seconds that the work in flight does
        # not hide (no less than the link is busy with the transfers the step waits for), plus
        # its codec's.
        compute = base.get("step_compute_min_s")
        compute = base.get("step_compute_s") if compute is None else compute
        if compute is not None and row.get("predicted_exchange_s") is not None:
            ref_exchange, ref_exposed = base.get("predicted_exchange_s"), \
                base.get("predicted_exposed_s")
            hidden = (ref_exchange - ref_exposed) if ref_exposed is not None \
                and ref_exchange is not None else 0.0
            # The median over the epochs the measured step is the median of (older results:
            # the last epoch's terms; its link term, the step's busy link: every exchange).
            terms = steady_step_terms(row) or [(
                row["predicted_exchange_s"], row.get("predicted_exposed_s"),
                row.get("predicted_link_s"), row.get("predicted_codec_s"))]
            row["predicted_step_s"] = statistics.median(
                predicted_step_seconds(compute, exchange, exposed, link, codec or 0.0,
                                       contention=row.get("link_contention") or 0.0,
                                       reference_hidden=hidden)
                for exchange, exposed, link, codec in terms)
            row["predicted_vs_measured"] = row["predicted_step_s"] / row["step_s"] \
                if row["step_s"] else None
        best = max(acc for _, _, acc in base["val_trace"]) if base["val_trace"] else None
        if best is not None:
            target = 0.95 * best
            mine, theirs = time_to(row["val_trace"], target), time_to(base["val_trace"], target)
            row["time_to_95pct_s"] = mine
            row["time_to_95pct_speedup"] = theirs / mine if mine and theirs else None


def summarize(summary: Dict[str, Any], model: str, config: str, rate: str, nodes: int,
              seed: int) -> Dict[str, Any]:
    per_epoch = summary.get("per_epoch") or {}
    steps = [s for s in per_epoch.get("step_s") or [] if s is not None]
    exchanges = [s for s in per_epoch.get("exchange_s") or [] if s is not None]
    # The steady state: the epochs of the second half (after warm-up and caches filling), and
    # none before step aside's decision (its trial times every arm, the exact exchange
    # included, so its steps are no configuration's).  A run too short to reach it is
    # flagged, its figures the second half's.
    first = _first_decided_epoch(summary)
    trial = "aside" in config.split("+")[1:] and (first is None or first >= len(steps))
    start = max(len(steps) // 2, 0 if trial or first is None else first)
    return dict(model=model, config=config, rate=rate, nodes=nodes, seed=seed,
                step_s=_median_from(steps, start) or summary["train_step_seconds"],
                exchange_s=_median_from(exchanges, start) or summary["exchange_s_per_epoch"],
                steady_from_epoch=start, in_trial=trial,
                step_s_all=summary["train_step_seconds"], per_epoch=per_epoch,
                step_aside=summary.get("step_aside"),
                aggregation_choices=summary.get("aggregation_choices"),
                compute_s=summary["compute_s_per_epoch"],
                step_exchange_s=summary.get("train_step_exchange_seconds"),
                step_compute_s=summary.get("train_step_compute_seconds"),
                step_compute_min_s=summary.get("train_step_compute_seconds_min"),
                predicted_exchange_s=summary.get("predicted_step_exchange_seconds"),
                predicted_codec_s=summary.get("predicted_step_codec_seconds"),
                predicted_exposed_s=summary.get("predicted_step_exposed_seconds"),
                predicted_link_s=summary.get("predicted_step_link_seconds"),
                link_contention=summary.get("link_contention"),
                link_queue_wait=summary.get("link_queue_wait_seconds"),
                link_duplex_gain=summary.get("link_duplex_gain"),
                step_collectives=summary.get("train_step_collectives"),
                sent_MB=summary["comm_MB_per_epoch_per_rank"],
                test_acc=summary["test_acc"], val_trace=summary["val_trace"],
                fit_s=summary["fit_seconds"], wall_s=summary["wall_s"])


def median_repeats(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    r"""One row per model, configuration, rate, node count and seed: of its repeats, the one
    whose step is the median (the lower of the middle two), with every repeat's step in
    ``step_s_repeats``; rows without repeats are returned as they are."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for row in rows:
        key = (row["model"], row["config"], row["rate"], row["nodes"], row.get("seed"))
        groups.setdefault(key, []).append(row)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        ranked = sorted(group, key=lambda r: r["step_s"])
        chosen = dict(ranked[(len(ranked) - 1) // 2])
        chosen["step_s_repeats"] = [r["step_s"] for r in group]
        out.append(chosen)
    return out


def steady_step_terms(row: Dict[str, Any]) -> List[tuple]:
    r"""The planner's step terms ``(exchange, exposed, link, codec)`` of each steady epoch of
    :obj:`row` (from ``steady_from_epoch``) that logged them; empty for results without
    them per epoch (before the monitor kept them: the last epoch's, which for a bounded
    asynchronous pipeline is its synchronous one)."""
    per_epoch = row.get("per_epoch") or {}
    columns = [per_epoch.get(f"predicted_step_{name}_s")
               for name in ("exchange", "exposed", "link", "codec")]
    if any(column is None for column in columns):
        return []
    start = int(row.get("steady_from_epoch") or 0)
    return [terms for terms in list(zip(*columns))[start:] if terms[0] is not None]


def _median_from(values: List[float], start: int) -> Optional[float]:
    tail = values[start:]
    return statistics.median(tail) if tail else None


def _first_decided_epoch(summary: Dict[str, Any]) -> Optional[int]:
    r"""The first epoch whose every step runs step aside's decision (``None``: no decision)."""
    decision = summary.get("step_aside") or {}
    if decision.get("step") is None:
        return None
    per_epoch = max(1, int(summary.get("train_steps_per_epoch") or 1))
    return -(-int(decision["step"]) // per_epoch)


def table(rows: List[Dict[str, Any]]) -> str:
    head = (f"{'model':<6} {'config':<18} {'rate':>7} {'N':>2} {'step s':>8} {'vs post':>8} "
            f"{'exch s':>8} {'MB/ep':>9} {'test %':>7} {'t95 s':>7} {'t95 x':>6} "
            f"{'pred s':>7} {'pred/m':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        def f(v, spec):
            return format(v, spec) if isinstance(v, (int, float)) else "-"
        lines.append(f"{r['model']:<6} {r['config']:<18} {r['rate']:>7} {r['nodes']:>2} "
                     f"{f(r['step_s'], '8.3f')} {f(r.get('step_vs_post'), '8.2f')} "
                     f"{f(r['exchange_s'], '8.3f')} {f(r['sent_MB'], '9.2f')} "
                     f"{f(100 * r['test_acc'], '7.2f')} {f(r.get('time_to_95pct_s'), '7.1f')} "
                     f"{f(r.get('time_to_95pct_speedup'), '6.2f')} "
                     f"{f(r.get('predicted_step_s'), '7.3f')} "
                     f"{f(r.get('predicted_vs_measured'), '6.2f')}"
                     + (" *" if r.get("in_trial") else ""))
    if any(r.get("in_trial") for r in rows):
        lines.append("* still in step aside's trial at the end: the step mixes the arms' steps "
                     "(more --epochs)")
    return "\n".join(lines)


def plot(rows: List[Dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model]
        labels = [f"{r['config']}\n{r['rate']}, N={r['nodes']}"
                  + (f", {r['node_cores']} cores" if (r.get("node_cores") or 1) > 1 else "")
                  + (f", seed {r['seed']}" if r.get("seed") else "") for r in mine]
        # The training step's own exchange (exchange_s also counts validation's); other
        # strategies' collectives (4d, DDP) are not timed apart from their step.
        timed = [r.get("step_exchange_s") is not None or r["exchange_s"] is not None
                 for r in mine]
        exchange = [(r.get("step_exchange_s") if r.get("step_exchange_s") is not None
                     else r["exchange_s"]) or 0.0 for r in mine]
        rest = [max(0.0, r["step_s"] - e) if t else 0.0
                for r, e, t in zip(mine, exchange, timed)]
        ax.bar(labels, rest, label="compute (step - exposed exchange)")
        ax.bar(labels, exchange, bottom=rest, label="exposed exchange")
        if not all(timed):
            ax.bar(labels, [0.0 if t else r["step_s"] for r, t in zip(mine, timed)],
                   color="0.6", hatch="//", label="step (collectives not timed apart)")
        ax.set_title(f"{model}: median training step")
        ax.set_ylabel("seconds")
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="Cora, 2 nodes, post and hybrid")
    p.add_argument("--models", nargs="+", default=None)
    p.add_argument("--configs", nargs="+", default=None)
    p.add_argument("--rates", nargs="+", default=None, help="link rates, e.g. 1gbit 10gbit")
    p.add_argument("--nodes", nargs="+", type=int, default=None)
    p.add_argument("--dataset", default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--layers", type=int, default=2,
                   help="message-passing layers (default 2; with 3, GraphSAGE keeps a "
                        "hidden-to-hidden layer, whose rows stay hidden-wide)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--seeds", nargs="+", type=int, default=None)
    p.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "lightning_fullgraph"
                                              / "partitions"))
    p.add_argument("--job-timeout", type=float, default=3600.0)
    p.add_argument("--no-dilate", dest="dilate", action="store_false",
                   help="let the nodes share the cores freely instead of emulating one-core "
                        "machines by time dilation (EmulatedCluster.dilated)")
    p.add_argument("--node-cores", type=int, default=1,
                   help="cores of each emulated machine (dilated: each node still gets its "
                        "share of this machine's cores, and time is stretched by as much "
                        "more; ranks run this many threads; default 1)")
    p.add_argument("--omp-wait-policy", choices=["passive", "inherit"], default="passive",
                   help="OpenMP's threads on the nodes: sleep at once (passive, default: a "
                        "node's CPU quota would charge their spinning as work, which a "
                        "machine's own idle cores do for free), or the caller's environment "
                        "(inherit: OpenMP's default, spinning, where it sets none)")
    p.add_argument("--no-predict", dest="predict", action="store_false",
                   help="skip the planner's step prediction (each job calibrates the link "
                        "at fit start for it: a few seconds)")
    p.add_argument("--json-out", default=None,
                   help="result file (default: cluster-<time>.json in the results directory, see --out)")
    add_out_argument(p)
    p.add_argument("--plot", default=None)
    p.add_argument("--reference", default="post",
                   help="the configuration the ratios are against (default: post)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every job this many times, round-robin over the configurations, "
                        "and keep the repeat with the median step (a shared host's slow "
                        "spells fall on every configuration alike)")
    p.add_argument("--link-from", default=None, metavar="CONFIG",
                   help="predict on the link fitted to this configuration's exchanges (it runs "
                        "first for each model and seed, e.g. post+nooverlap: the link as "
                        "training meets it, with nothing hidden) instead of the ping-pong "
                        "calibration at each job's start")
    p.add_argument("--replot", default=None, metavar="RESULTS.json",
                   help="only print the table and plot of saved results")
    opts = p.parse_args(argv)
    if opts.replot:
        rows = json.loads(Path(opts.replot).read_text())["rows"]
        print(table(rows))
        if opts.plot:
            plot(rows, opts.plot)
        return 0
    defaults = QUICK if opts.quick else MATRIX
    for key, value in defaults.items():
        if getattr(opts, key) is None:
            setattr(opts, key, value)
    for name in opts.configs:
        config_args(name)  # refuse unknown names before anything starts
    if opts.repeats < 1:
        p.error(f"--repeats must be at least 1, got {opts.repeats}")
    if opts.link_from is not None:
        if opts.link_from not in opts.configs or _other_strategy(opts.link_from) is not None:
            p.error(f"--link-from {opts.link_from}: not a full-graph configuration of --configs")
        opts.configs = [opts.link_from] + [c for c in opts.configs if c != opts.link_from]
    links = Path(tempfile.mkdtemp(prefix="cluster-links-"))
    rows: List[Dict[str, Any]] = []
    port = 29700
    for nodes in opts.nodes:
        for rate in opts.rates:
            if opts.dilate and rate != "none":
                cluster = EmulatedCluster.dilated(nodes, rate, node_cores=opts.node_cores)
            else:
                cluster = EmulatedCluster(nodes, None if rate == "none" else rate)
            print(f"[cluster] {nodes} nodes, links {cluster.rate}, cpus per node "
                  f"{cluster.cpus or 'shared'}, dilation {cluster.dilation:g}", file=sys.stderr)
            with cluster:
                # Repeats go round every configuration before the next starts: a slow spell
                # of a shared host then falls on every configuration alike.
                for repeat, model, config, seed in (
                        (r, m, c, s) for m in opts.models for r in range(opts.repeats)
                        for c in opts.configs for s in opts.seeds):
                    port += 1
                    print(f"[cluster] {model} {config} rate={rate} nodes={nodes} "
                          f"seed={seed} repeat={repeat} ...", file=sys.stderr,
                          flush=True)
                    fitted = links / f"{model}-{rate}-{nodes}-{seed}.json"
                    source = config == opts.link_from
                    summary = run_job(
                        cluster, model, config, opts, seed, port,
                        link=str(fitted) if fitted.exists() and not source else None,
                        save_link=str(fitted) if source else None)
                    rows.append(summarize(summary, model, config, rate, nodes, seed))
                    rows[-1]["omp_wait_policy"] = openmp_wait_policy(opts)
                    if opts.link_from is not None and fitted.exists():
                        rows[-1]["link"] = json.loads(fitted.read_text()) \
                            if source else f"fitted to {opts.link_from}"
                    rows[-1]["dilation"] = cluster.dilation
                    rows[-1]["node_cores"] = cluster.node_cores
    shutil.rmtree(links, ignore_errors=True)  # the fitted links are in the rows
    rows = median_repeats(rows)
    derive(rows, opts.reference)
    print(table(rows))
    out = Path(opts.json_out) if opts.json_out else result_path("cluster", opts.out)
    meta = dict(dataset=opts.dataset, hidden=opts.hidden, layers=opts.layers, epochs=opts.epochs,
                cores=os.cpu_count(), date=time.strftime("%Y-%m-%d %H:%M"),
                command=" ".join(["python -m benchmarks cluster"]
                                 + (sys.argv[1:] if argv is None else list(argv))))
    out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
    print(f"results: {out}", file=sys.stderr)
    if opts.plot:
        plot(rows, opts.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
