#!/usr/bin/env python
"""Predicted vs. measured halo exchange: bytes and seconds per epoch, per aggregation mode.

Usage::

    python -m benchmarks planner                      # Cora + synthetic 200K nodes, P = 2, 4
    python -m benchmarks planner --quick              # Cora only, P = 2
    python -m benchmarks planner --json > out.json    # only the JSON on stdout

For every dataset and part count P the graph is partitioned (the library's partition cache),
the model is profiled once per aggregation mode in this process
(:func:`~lightning_fullgraph.planner.profile_model`) and every rank's plan counts are read
(:func:`~lightning_fullgraph.planner.partition_counts`).  Then P gloo processes start; each
calibrates the link on its group (:func:`~lightning_fullgraph.planner.calibrate`: latency and
bandwidth of ``all_to_all_single``, identical on every rank) and trains the model through
:class:`~lightning_fullgraph.engine.FullGraphEngine` for a few epochs in each mode, one
training step per epoch (input dropout, as ``lightning-fullgraph train`` does), keeping the
engine's per-exchange counters of every epoch.

Reported per (dataset, P, mode):

* **bytes**: predicted bytes sent per epoch (all ranks) and whether the prediction equals the
  measured counters *exactly* for every epoch, rank, exchange point and direction (bytes and
  rows, sent and received);
* **seconds**: the predicted exchange seconds of a steady-state epoch
  (:class:`~lightning_fullgraph.planner.CommunicationModel`: per exchange
  ``alpha * (P - 1) + busiest rank's bytes / beta``) against three measurements:

  - ``replay``: after training, the exchanges of one more training step are recorded
    (:class:`~lightning_fullgraph.planner.ExchangeRecorder`) and sent again through the
    engine's transport with the same rows per peer and row widths, back to back without
    compute in between (a barrier before each of ``--replays`` rounds); per call the smallest
    time over ranks, summed, mean over rounds: the collectives alone, woken together;
  - ``train``: inside training, per exchange point the smallest time any rank spent in it
    (the rank that arrived last waits for no one's compute), summed; the mean over the epochs
    after the first, i.e. their total exchange time divided by their number (the JSON also
    has the median and every epoch's value);
  - ``rank-mean``: the mean over ranks of their total time inside the exchange during
    training (also contains waiting for slower ranks' compute).

  Means, not medians: single exchanges are heavy-tailed where ranks share cores (a peer's
  wake-up is sometimes a scheduler tick), and what a run costs is their sum.  The link model
  is calibrated the same way (:func:`~lightning_fullgraph.planner.calibrate`: ranks arriving
  at different times, the fastest rank, the mean).

  ``ratio`` = predicted / measured; the issue's target is a ratio within [0.5, 2] at P = 2
  and 4.

On a machine with fewer cores than processes (or one shared with other jobs) the ranks share
cores: times inside training then include the wake-up of descheduled processes and threads,
which no communication model of the link knows about, and vary from run to run.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Any, Dict, List
from lightning_fullgraph.engine import ExchangeConfig

from ._common import add_out_argument, write_result

MODES = ("post", "pre", "hybrid")
DATASETS = ("cora", "synthetic:nodes=200000,degree=10")


def _say(*args: Any) -> None:
    print("[planner-bench]", *args, file=sys.stderr, flush=True)


def _forward(dropout: float):
    import torch.nn.functional as F

    def forward(model, data):
        return model(F.dropout(data.x, dropout, model.training), data.edge_index)
    return forward


def _build(spec: Dict[str, Any], in_channels: int, out_channels: int):
    import torch

    from lightning_fullgraph.module import build_model
    torch.manual_seed(0)
    return build_model(spec["model"], in_channels, spec["hidden"], out_channels,
                       num_layers=spec["layers"], dropout=spec["dropout"])


def _worker(rank: int, world_size: int, path: str, spec: Dict[str, Any]) -> Dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from lightning_fullgraph.engine import FullGraphEngine
    from lightning_fullgraph.partition import load_partition
    from lightning_fullgraph.planner import ExchangeRecorder, calibrate

    part = load_partition(path, rank, num_parts=world_size)
    link = calibrate()
    forward = _forward(spec["dropout"])
    runs, replay = {}, {}
    for mode in spec["modes"]:
        # The mode under test throughout: step aside's trial would switch the aggregation
        # (and so re-normalize GCN, another degree exchange) after a few steps.
        engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation=mode,
                                                               step_aside=False))
        model = _build(spec, spec["features"], spec["classes"])
        engine.attach(model)
        data = engine.data
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        epochs = []
        for _ in range(spec["epochs"]):
            engine.stats.reset()
            opt.zero_grad()
            model.train()
            out = forward(model, data)
            engine.backward(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]))
            opt.step()
            epochs.append({f"{k}|{d}": [c.calls, c.rows_sent, c.rows_received, c.bytes_sent,
                                        c.bytes_received, c.seconds]
                           for (k, d), c in engine.stats.counters.items()})
        # The last step's exchanges once more, recorded, then replayed back to back.
        with ExchangeRecorder(engine.exchanges) as rec:
            rec.begin()
            out = forward(model, data)
            engine.backward(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]))
            calls = rec.end()
        replay[mode] = _replay(engine, calls, spec["replays"])
        engine.detach()
        runs[mode] = epochs
    return {"link": link.to_dict(), "runs": runs, "replay": replay}


def _replay(engine, calls, repeats: int) -> List[List[float]]:
    r"""Seconds of every call of :obj:`calls` exchanged again with the same rows per peer and
    row width, back to back without compute in between (one barrier before each round)."""
    import torch
    import torch.distributed as dist

    from lightning_fullgraph.engine import CommStats
    rounds = []
    for _ in range(repeats):
        stats, engine.transport.stats = engine.transport.stats, CommStats()
        dist.barrier()
        try:
            for i, call in enumerate(calls):
                plan = engine.exchanges[call.mode].plan
                channels = ("post", "pre") if call.channel == "both" else (call.channel, )
                send = [sum(c) for c in zip(*(getattr(plan, ch).send_counts.tolist()
                                              for ch in channels))]
                recv = [sum(c) for c in zip(*(getattr(plan, ch).recv_counts.tolist()
                                              for ch in channels))]
                if call.reverse:
                    send, recv = recv, send
                rows = torch.randn(sum(send), call.row_bytes // 4)
                engine.transport.exchange(rows, send, recv, key=f"replay{i}",
                                          direction=call.direction)
            rounds.append([engine.transport.stats.counters[(f"replay{i}", c.direction)].seconds
                           for i, c in enumerate(calls)])
        finally:
            engine.transport.stats = stats
    return rounds


def _compare(profile, counts, link, measured: List[Dict[str, Any]], epochs: int,
             replay: List[List[List[float]]]):
    from lightning_fullgraph.planner import CommunicationModel
    model = CommunicationModel(profile, link)
    exact = True
    for epoch in range(epochs):
        pred = model.predict(counts, train_offset=epoch)
        for rank, rank_runs in enumerate(measured):
            got = {tuple(k.split("|")): v for k, v in rank_runs[epoch].items()}
            want = pred.per_key(rank)
            if set(got) != set(want) or any(
                    got[k][:5] != [w["calls"], w["rows_sent"], w["rows_received"],
                                   w["bytes_sent"], w["bytes_received"]]
                    for k, w in want.items()):
                exact = False
    steady = model.predict(counts)
    later = range(1, epochs) if epochs > 1 else range(epochs)
    pure, mean = [], []
    for epoch in later:
        keys = measured[0][epoch].keys()
        pure.append(sum(min(r[epoch][k][5] for r in measured) for k in keys))
        mean.append(statistics.mean(sum(v[5] for v in r[epoch].values()) for r in measured))
    measured_bytes = sum(v[3] for r in measured for v in r[-1].values())
    # Replay: per round, per call the smallest time over ranks; the median round's sum.
    rounds = [sum(min(r[k][i] for r in replay) for i in range(len(replay[0][k])))
              for k in range(len(replay[0]))]
    replay_s = statistics.mean(rounds) if rounds else float("nan")
    measured_s = statistics.mean(pure)
    return {
        "bytes_exact": exact,
        "predicted_bytes": sum(steady.bytes_sent()),
        "measured_bytes": measured_bytes,
        "predicted_s": steady.seconds,
        "measured_s": measured_s,
        "measured_s_median": statistics.median(pure),
        "measured_s_epochs": pure,
        "rank_mean_s": statistics.mean(mean),
        "ratio": steady.seconds / measured_s if measured_s else None,
        "ratio_median": steady.seconds / statistics.median(pure)
        if statistics.median(pure) else None,
        "ratio_rank_mean": steady.seconds / statistics.mean(mean)
        if statistics.mean(mean) else None,
        "replay_s": replay_s,
        "replay_s_median": statistics.median(rounds) if rounds else float("nan"),
        "ratio_replay": steady.seconds / replay_s if replay_s else None,
        "exchanges": steady.summary()["exchanges"],
    }


def _observed(profile, counts, measured: List[Dict[str, Any]], epochs: int):
    r"""Per steady-state epoch and exchange point: ``(calls, busiest bytes, seconds of the
    rank that arrived last)``, for :func:`~lightning_fullgraph.planner.fit_link`."""
    from lightning_fullgraph.planner import observations, predict
    steady = predict(profile, counts)
    out = []
    for epoch in (range(1, epochs) if epochs > 1 else range(epochs)):
        seconds = {tuple(k.split("|")): min(r[epoch][k][5] for r in measured)
                   for k in measured[0][epoch]}
        out += observations(steady, seconds)
    return out


def _held_out(rows, observed, profiles, counts, link) -> None:
    r"""Per mode, the time predicted by a link fitted to the *other* modes' training
    exchanges (``fit_ms``, ``ratio_fit``): the planner's model as training meets the link,
    tested on exchange sets it was not fitted to."""
    from lightning_fullgraph.planner import CommunicationModel, fit_link
    for row in rows:
        others = [o for m, obs in observed.items() if m != row["mode"] for o in obs]
        if not others:
            continue
        fitted = fit_link(others, row["parts"], prior=link)
        seconds = CommunicationModel(profiles[row["mode"]], fitted).predict(counts).seconds
        row.update(fit_s=seconds, ratio_fit=seconds / row["measured_s"],
                   fit_alpha_us=fitted.alpha * 1e6, fit_beta_GBps=fitted.beta / 1e9)


def run(datasets, parts, spec, cache_dir=None) -> Dict[str, Any]:
    from lightning_fullgraph.data import load_dataset
    from lightning_fullgraph.partition import partition_graph
    from lightning_fullgraph.planner import LinkModel, partition_counts, profile_model
    from lightning_fullgraph.testing import run_distributed

    rows = []
    for name in datasets:
        data = load_dataset(name)
        spec = dict(spec, features=int(data.num_features), classes=int(data.y.max()) + 1)
        profiles = {m: profile_model(_build(spec, spec["features"], spec["classes"]),
                                     spec["features"], aggregation=m,
                                     forward=_forward(spec["dropout"])) for m in spec["modes"]}
        for P in parts:
            t0 = time.perf_counter()
            path = partition_graph(data, P, root=cache_dir, progress=False)
            counts = partition_counts(path)
            _say(f"{name} P={P}: training {spec['epochs']} epochs x {len(spec['modes'])} modes")
            results = run_distributed(_worker, P, str(path), spec, timeout_s=1200)
            links = [LinkModel.from_dict(r["link"]) for r in results]
            assert all(link == links[0] for link in links), "calibration differs between ranks"
            link = links[0]
            here, observed = [], {}
            for mode in spec["modes"]:
                measured = [r["runs"][mode] for r in results]
                row = _compare(profiles[mode], counts, link, measured,
                               spec["epochs"], [r["replay"][mode] for r in results])
                row.update(dataset=name, parts=P, mode=mode, alpha_us=link.alpha * 1e6,
                           beta_GBps=link.beta / 1e9)
                here.append(row)
                observed[mode] = _observed(profiles[mode], counts, measured, spec["epochs"])
            _held_out(here, observed, profiles, counts, link)
            rows += here
            _say(f"{name} P={P} done in {time.perf_counter() - t0:.0f} s "
                 f"(link: {link.describe()})")
    return {"spec": spec, "rows": rows,
            "targets": {"bytes_exact": all(r["bytes_exact"] for r in rows),
                        "time_within_2x_in_training": all(
                            r["ratio"] is not None and 0.5 <= r["ratio"] <= 2 for r in rows),
                        "time_within_2x_replay": all(
                            r["ratio_replay"] is not None and 0.5 <= r["ratio_replay"] <= 2
                            for r in rows),
                        "time_within_2x_fitted_in_training": all(
                            r.get("ratio_fit") is not None and 0.5 <= r["ratio_fit"] <= 2
                            for r in rows)}}


def table(result: Dict[str, Any]) -> str:
    head = (f"{'dataset':<10} {'P':>2} {'mode':<7} {'pred MB':>8} {'meas MB':>8} {'exact':>5} "
            f"{'calls':>5} {'pred ms':>8} {'replay ms':>9} {'ratio':>6} {'train ms':>8} "
            f"{'ratio':>6} {'rank-mean':>9} {'fit ms':>7} {'ratio':>6}  alpha us / beta GB/s "
            f"(ping-pong; fitted)")
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        name = r["dataset"].split(":")[0]
        lines.append(
            f"{name:<10} {r['parts']:>2} {r['mode']:<7} {r['predicted_bytes'] / 1e6:>8.3f} "
            f"{r['measured_bytes'] / 1e6:>8.3f} {'yes' if r['bytes_exact'] else 'NO':>5} "
            f"{r['exchanges']:>5} {r['predicted_s'] * 1e3:>8.2f} {r['replay_s'] * 1e3:>9.2f} "
            f"{r['ratio_replay']:>6.2f} {r['measured_s'] * 1e3:>8.2f} {r['ratio']:>6.2f} "
            f"{r['rank_mean_s'] * 1e3:>9.2f} {r.get('fit_s', math.nan) * 1e3:>7.2f} "
            f"{r.get('ratio_fit', math.nan):>6.2f}  {r['alpha_us']:.0f} / {r['beta_GBps']:.2f}; "
            f"{r.get('fit_alpha_us', math.nan):.0f} / {r.get('fit_beta_GBps', math.nan):.2f}")
    t = result["targets"]
    lines.append("MB: bytes sent per epoch, all ranks; ms: exchange time per epoch (steady "
                 "state); replay: the epoch's exchanges replayed back to back; train: inside "
                 "training (per exchange the fastest rank); fit: predicted by a link fitted to "
                 "the other modes' training exchanges; ratio = predicted / measured (train for "
                 "fit)")
    lines.append(f"bytes predicted == measured (every epoch, rank, point, direction): "
                 f"{t['bytes_exact']}; time within 2x: replay {t['time_within_2x_replay']}, "
                 f"in training {t['time_within_2x_in_training']} (ping-pong link), "
                 f"{t['time_within_2x_fitted_in_training']} (link fitted to the other modes)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default=";".join(DATASETS),
                        help="';'-separated dataset specs (default: Cora and synthetic 200K)")
    parser.add_argument("--parts", default="2,4")
    parser.add_argument("--model", default="gcn", choices=["gcn", "sage", "gat", "gin"])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--replays", type=int, default=7,
                        help="rounds of the back-to-back replay of a step's exchanges")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--quick", action="store_true", help="Cora only, P = 2")
    parser.add_argument("--json", action="store_true", help="only the JSON on stdout")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    datasets = ["cora"] if args.quick else [d for d in args.datasets.split(";") if d.strip()]
    parts = [2] if args.quick else [int(p) for p in args.parts.split(",")]
    spec = dict(model=args.model, hidden=args.hidden, layers=args.layers,
                dropout=args.dropout, epochs=args.epochs, modes=list(MODES),
                replays=args.replays)
    result = run(datasets, parts, spec, args.cache_dir)
    print(json.dumps(result, indent=2), flush=True)
    write_result("planner", result, args.out)
    if not args.json:
        print(table(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
