"""``python -m benchmarks curate`` and ``python -m benchmarks plot``: the committed numbers and the
figures, from result files.

``benchmarks/results.json`` holds the numbers the documentation cites, one entry per table::

    {"<key>": {"title": ..., "command": ..., "measured": "YYYY-MM-DD", "setup": ...,
               "columns": [...], "rows": [[...], ...], "notes": ...}}

``curate`` builds an entry's ``columns`` and ``rows`` from a topic's result file (the JSON a run
wrote to the results directory) with that topic's curator below, takes ``title``, ``setup``
and ``notes`` from the options or, when the key is already in the file, from its entry, and
``command`` and ``measured`` from the options, the result file's metadata or the entry, in
that order.  Every entry of the committed file is curated this way from a result file a run
wrote; none is copied by hand from a printed table.  To regenerate one, run the command its
``command`` field names (the result file's path is printed on stderr), then e.g.::

    python -m benchmarks curate ~/.cache/lightning_fullgraph/benchmarks/planner-<stamp>.json \\
        --topic planner --key planner --command "python -m benchmarks planner ..." \\
        --measured YYYY-MM-DD --notes "what the new run shows"

The curators (:data:`CURATORS`) are per topic; some topics feed several entries, picked by the
curator (``aggregation-rows``, ``aggregation-measured``) or by ``--where`` (e.g.
``--topic quantization --where dataset=cora``).  A topic without a curator cannot be curated,
and so has no entry.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ._common import REPO

#: The committed file of curated results.
RESULTS_JSON = REPO / "benchmarks" / "results.json"
#: Keys every entry has (``notes`` is optional).
REQUIRED = ("title", "command", "measured", "setup", "columns", "rows")


def _r(value: Optional[float], digits: int) -> Optional[float]:
    return None if value is None else round(float(value), digits)


# --- curators: result file -> (columns, rows, meta) ---------------------------------------------

CLUSTER_COLUMNS = ["model", "config", "step s", "vs reference", "exchange s", "MB/epoch", "test %",
                   "t95 ×", "predicted s", "predicted × measured"]
MODEL_NAMES = {"gcn": "GCN", "sage": "GraphSAGE", "gat": "GAT", "gin": "GIN"}


def curate_cluster(result: Dict[str, Any], where: Dict[str, str]) -> Tuple[List[str], List[list], dict]:
    """Rows of ``python -m benchmarks cluster``'s JSON (``{"meta": ..., "rows": [...]}``), those
    matching every ``where`` field (e.g. ``run=gcn`` in a file that merged several runs)."""
    meta = result.get("meta") or {}
    rows = [r for r in result["rows"] if all(str(r.get(k)) == v for k, v in where.items())]
    if not rows:
        raise SystemExit(f"no cluster rows match {where}")
    if "run" in where and isinstance(meta.get(where["run"]), dict):
        meta = meta[where["run"]]  # a merged file: one meta per run
    layers = meta.get("layers", 2)
    out = []
    for r in rows:
        model = MODEL_NAMES.get(r["model"], r["model"]) + f", {layers} layers"
        cores = r.get("node_cores") or 1
        if cores != 1:
            model += f", {cores}-core machines"
        if r.get("rate") not in (None, "1gbit"):  # the issue's link is the default
            model += f", {r['rate']} links"
        out.append([model, r["config"] + (f" (seed {r['seed']})" if r.get("seed") else ""),
                    _r(r["step_s"], 3), _r(r.get("step_vs_post"), 2), _r(r.get("exchange_s"), 3),
                    _r(r.get("sent_MB"), 2), _r(100 * r["test_acc"], 2) if r.get("test_acc") is not None else None,
                    _r(r.get("time_to_95pct_speedup"), 2), _r(r.get("predicted_step_s"), 3),
                    _r(r.get("predicted_vs_measured"), 2)])
    return list(CLUSTER_COLUMNS), out, dict(command=meta.get("command"), measured=(meta.get("date") or "")[:10])


FOURD_COLUMNS = ["configuration", "processes", "test acc (%)", "seeds (%)", "to target (s)",
                 "MB/step/rank", "train ms/epoch", "batch", "rank-0 peak RSS (MiB)"]


def curate_fourd(result: Dict[str, Any],
                 where: Dict[str, str]) -> Tuple[List[str], List[list], dict]:
    """Rows of ``python -m benchmarks fourd``'s JSON (``{"target_val_acc": ..., "rows": [...]}``),
    those matching every ``where`` field (e.g. ``config=4d grid gcn``)."""
    rows = [r for r in result["rows"] if all(str(r.get(k)) == v for k, v in where.items())]
    if not rows:
        raise SystemExit(f"no fourd rows match {where}")
    out = []
    for r in rows:
        reach = None if r.get("time_to_target_s") is None else _r(r["time_to_target_s"], 2)
        out.append([r["config"], r["processes"],
                    f"{100 * r['test_acc_mean']:.2f} ± {100 * r['test_acc_std']:.2f}",
                    " / ".join(f"{100 * a:.1f}" for a in r["test_acc"]),
                    reach if reach is not None else f"never ({r['reached_target']})",
                    _r(r["MB_per_step_per_rank"], 4), _r(1000 * r["step_s"], 1),
                    r.get("batch_size"), _r(r.get("peak_rss_MiB_rank0"), 0)])
    return list(FOURD_COLUMNS), out, {}


FOURD_MEMORY_COLUMNS = ["configuration", "processes", "test acc (%)", "train ms/epoch",
                        "largest peak RSS of a process (MiB)", "× one process",
                        "rank-0 peak RSS (MiB)"]


def curate_fourd_memory(result: Dict[str, Any],
                        where: Dict[str, str]) -> Tuple[List[str], List[list], dict]:
    """Memory rows of ``python -m benchmarks fourd``'s JSON: every process's largest peak RSS,
    as a share of ``4d single gcn``'s (one process, the whole graph)."""
    rows = [r for r in result["rows"] if all(str(r.get(k)) == v for k, v in where.items())]
    if not rows:
        raise SystemExit(f"no fourd rows match {where}")
    out = [[r["config"], r["processes"], _r(100 * r["test_acc_mean"], 2), _r(1000 * r["step_s"], 1),
            _r(r.get("peak_rss_MiB_max_rank"), 0), _r(r.get("max_rank_rss_vs_4d_single"), 2),
            _r(r.get("peak_rss_MiB_rank0"), 0)] for r in rows]
    return list(FOURD_MEMORY_COLUMNS), out, {}


# --- curators of the single-machine topics ------------------------------------------------------

def _pm(mean: float, std: float, scale: float = 100.0, digits: int = 2) -> str:
    """``mean ± std`` of a value scaled (accuracies: fractions to percent)."""
    return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"


def _span(values: Sequence[float], fmt: str = "{:,.0f}", unit: str = "") -> str:
    """``lo–hi`` of per-rank values (one value when they agree at that precision)."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return (lo if lo == hi else f"{lo}–{hi}") + unit


def _count(n: float) -> str:
    """Rows and nodes as the tables write them: 254, 491k, 1.31M."""
    if n >= 1e6:
        return f"{n / 1e6:.3g}M"
    return f"{n / 1e3:.3g}k" if n >= 1e4 else f"{n:.0f}"


def _select(rows: List[dict], where: Dict[str, str], topic: str) -> List[dict]:
    """The rows matching every ``where`` field; none is an error (a typo must not curate an
    empty table)."""
    out = [r for r in rows if all(str(r.get(k)) == v for k, v in where.items())]
    if not out:
        raise SystemExit(f"no {topic} rows match {where}")
    return out


CORA_ACCURACY_ROWS = ("1 process (plain PyG)", "{P} processes (METIS, halo exchange, kernels)")


def curate_cora_accuracy(result: Dict[str, Any],
                         where: Dict[str, str]) -> Tuple[List[str], List[list], dict]:
    """``python -m benchmarks cora_accuracy``'s JSON: test accuracy per seed (%), one row for
    the single process and one for the partitioned run, and mean ± std over the seeds."""
    columns = ["seed", *map(str, result["seeds"]), "mean ± std"]
    rows = []
    for label, key in zip(CORA_ACCURACY_ROWS, ("single", "partitioned")):
        accs = result["single_process" if key == "single" else "partitioned"]
        rows.append([label.format(P=result["processes"]), *(_r(100 * a, 1) for a in accs),
                     _pm(result[f"{key}_mean"], result[f"{key}_std"]) + " %"])
    return columns, rows, {}


def curate_fullgraph(result: Dict[str, Any],
                     where: Dict[str, str]) -> Tuple[List[str], List[list], dict]:
    """``python -m benchmarks fullgraph``'s JSON: per configuration the epoch (mean ± std over
    the timed epochs, slowest rank), each rank's share of its epoch in the halo exchange, each
    rank's peak RSS and its share of the single process's, also net of the interpreter (the RSS
    right after ``import torch, torch_geometric``, which every process pays)."""
    meta, runs = result["meta"], result["runs"]
    single = runs["single"]
    interp = single["ranks"][0]["rss_after_import_torch_pyg_kib"]
    kernels = meta.get("kernels")
    head = (f"{meta['model'].upper()}, {_count(result['graph']['num_nodes'])} nodes"
            + (f", kernels {kernels}" if kernels else ""))
    columns = [head, "epoch (s)", "exchange share", "peak RSS per rank (MiB)",
               f"of single-process peak (net of the {interp / 1024:.0f} MiB interpreter)"]
    rows = []
    for name, r in runs.items():
        label = "1 process" if r["world_size"] == 1 else (
            f"P = {r['world_size']} ({r['world_size']} × {r['threads_per_process']} thread"
            f"{'s' if r['threads_per_process'] > 1 else ''}"
            f"{', oversubscribed' if r['oversubscribed'] else ''})")
        peaks = r["peak_rss_kib_per_rank"]
        shares = [r2["exchange_fraction"] for r2 in r["ranks"] if "exchange_fraction" in r2]
        net = [(p - interp) / (single["peak_rss_kib_max"] - interp) for p in peaks]
        rows.append([label, _pm(r["epoch_s"], r["epoch_s_std"], 1.0),
                     _span([100 * s for s in shares], unit=" %") if shares else None,
                     _span([p / 1024 for p in peaks]),
                     _span([100 * p / single["peak_rss_kib_max"] for p in peaks], unit=" %")
                     + ("" if r["world_size"] == 1 else f" ({_span([100 * x for x in net], unit=' %')})")])
    return columns, rows, {}


AGGREGATION_ROWS_COLUMNS = ["rows per exchange (all ranks)", "P", "post", "hybrid", "post / hybrid",
                            "cover (all pairs)"]


def _graph_label(g: Dict[str, Any]) -> str:
    return "Cora" if g["name"] == "cora" else \
        f"{g['name']} {_count(g['num_nodes'])} / {_count(g['num_edges'])}"


def curate_aggregation_rows(result: Dict[str, Any],
                            where: Dict[str, str]) -> Tuple[List[str], List[list], dict]:
    """Part 1 of ``python -m benchmarks aggregation``'s JSON (the plan level): per data set the
    rows one exchange moves over all ranks, post against hybrid, at every P, and the seconds
    of the hybrid vertex cover of all rank pairs."""
    rows = []
    for name, g in result["plan"]["datasets"].items():
        parts = [e for e in g["partitions"].values() if "modes" in e]
        if not parts:
            continue
        parts.sort(key=lambda e: e["num_parts"])
        post = [_count(e["modes"]["post"]["rows_sum"]) for e in parts]
        hybrid = [_count(e["modes"]["hybrid"]["rows_sum"]) for e in parts]
        ratio = [f"{e['ratios']['rows_post_over_hybrid']:.3f}×" for e in parts]
        rows.append([_graph_label(g), " / ".join(str(e["num_parts"]) for e in parts),
                     " / ".join(post), " / ".join(hybrid), " / ".join(ratio),
                     _span([e["cover_s"] for e in parts], "{:.2f}", " s")])
    if not rows:
        raise SystemExit("the result holds no plan-level partitions")
    return list(AGGREGATION_ROWS_COLUMNS), rows, {}


AGGREGATION_MEASURED_COLUMNS = ["synthetic, measured", "epoch (s)", "halo MiB / epoch",
                                "peak RSS per rank (MiB)", "of single process"]


def _measured_row(label: str, r: Dict[str, Any], post: Optional[Dict[str, Any]]) -> list:
    halo = None
    if "halo" in r:
        mib = r["halo"]["bytes_per_epoch"] / 2 ** 20
        halo = f"{mib:,.0f}"
        if post is not None and post is not r:
            halo += f" ({post['halo']['bytes_per_epoch'] / r['halo']['bytes_per_epoch']:.2f}× less)"
    share = r.get("max_peak_ratio_to_single", 1.0 if r["world_size"] == 1 else None)
    return [label, _pm(r["epoch_s"], r["epoch_s_std"], 1.0, 2), halo,
            _span([p / 1024 for p in r["peak_rss_kib_per_rank"]]),
            None if share is None else f"{100 * share:.0f} %"]


def curate_aggregation_measured(result: Dict[str, Any],
                                where: Dict[str, str]) -> Tuple[List[str], List[list], dict]:
    """Parts 2 and 3 of ``python -m benchmarks aggregation``'s JSON on the synthetic graph:
    the single process, every measured (P, mode) and GCN with the engine's static-input memo
    (``--static-cache``); halo bytes against post at the same P, memory against the single
    process."""
    runs = ((result.get("measured") or {}).get("synthetic") or {}).get("runs") or {}
    rows = []
    for name, r in runs.items():
        post = runs.get(f"P={r.get('parts')} post")
        label = "1 process" if name == "single" else f"P = {r['parts']} {r['mode']}"
        rows.append(_measured_row(label, r, post))
    for name, r in ((result.get("static_cache") or {}).get("runs") or {}).items():
        if r.get("model") == "gcn" and r.get("cache_static") and r["parts"] > 1:
            post = runs.get(f"P={r['parts']} post")
            rows.append(_measured_row(f"P = {r['parts']} {r.get('aggregation') or 'default'}"
                                      " + static-input memo", r, post))
    if not rows:
        raise SystemExit("the result holds no measured synthetic runs")
    return list(AGGREGATION_MEASURED_COLUMNS), rows, {}


PLANNER_COLUMNS = ["graph", "P", "post: ping-pong / fitted", "pre", "hybrid"]


def _dataset_label(spec: str) -> str:
    """``cora`` -> Cora, ``synthetic:nodes=200000,...`` -> synthetic 200k."""
    name, _, opts = spec.partition(":")
    if name == "cora":
        return "Cora"
    nodes = dict(kv.split("=", 1) for kv in opts.split(",") if "=" in kv).get("nodes")
    return f"{name} {_count(float(nodes))}" if nodes else name


def curate_planner(result: Dict[str, Any],
                   where: Dict[str, str]) -> Tuple[List[str], List[list], dict]:
    """``python -m benchmarks planner``'s JSON: per (graph, P) and mode, predicted / measured
    exchange seconds in training, on the ping-pong link and on the link fitted to the other
    modes' training exchanges."""
    groups: Dict[Tuple[str, int], Dict[str, dict]] = {}
    for r in _select(result["rows"], where, "planner"):
        groups.setdefault((r["dataset"], r["parts"]), {})[r["mode"]] = r

    def cell(r: Optional[dict]) -> Optional[str]:
        if r is None or r.get("ratio") is None:
            return None
        fit = r.get("ratio_fit")
        return f"{r['ratio']:.2f} / " + ("-" if fit is None else f"{fit:.2f}")
    rows = [[_dataset_label(ds), P, *(cell(modes.get(m)) for m in ("post", "pre", "hybrid"))]
            for (ds, P), modes in groups.items()]
    return list(PLANNER_COLUMNS), rows, {}


#: Configuration names of the quantization and stale_halos topics -> the tables' words.
CONFIG_LABELS = {
    "fp32": "fp32 (exact)", "adaptive+schedule": "adaptive + --adaptive-bits",
    "adaptive-50/80/95": "adaptive, --level-percentiles 50,80,95",
    "adaptive2-50/80/95": "adaptive2, --level-percentiles 50,80,95",
    "cache": "cache (adaptive ε)", "cache+int2": "cache + int2", "async": "async pipeline",
    "adaptor": "adaptor (sync ↔ async)", "bns0.1": "boundary sampling p = 0.1",
    "cache+int2+bns": "cache + int2 + sampling p = 0.1", "cache+int2c": "cache + int2c",
    "cache+int2c+bns": "cache + int2c + sampling p = 0.1", "nooverlap": "fp32, no overlap",
}
QUANTIZATION_COLUMNS = ["model", "codec", "test acc (%)", "Δ vs fp32 (pp)", "MB/epoch/rank",
                        "× fewer than post fp32", "× fewer than hybrid fp32"]


def _model_label(model: str) -> str:
    return {"sage": "SAGE"}.get(model, model.upper())


def curate_quantization(result: Dict[str, Any],
                        where: Dict[str, str]) -> Tuple[List[str], List[list], dict]:
    """The accuracy runs of ``python -m benchmarks quantization``'s JSON (``where`` picks a data
    set, e.g. ``dataset=cora``): per model a post fp32 row (the baseline of the bytes), then
    every codec: test accuracy over the seeds, its difference to hybrid fp32, bytes per epoch
    and rank, and how many times fewer than post and hybrid fp32."""
    rows, seen = [], set()
    for r in _select(result["accuracy"], where, "quantization"):
        if r["model"] not in seen and r.get("post_fp32_test_acc_mean") is not None:
            seen.add(r["model"])
            rows.append([_model_label(r["model"]), "post fp32",
                         _pm(r["post_fp32_test_acc_mean"], r["post_fp32_test_acc_std"]), None,
                         _r(r["post_fp32_MB"], 4), 1.0, None])
        name = r["config"].split("@")[0]
        rows.append([_model_label(r["model"]), "fp32" if name == "fp32" else CONFIG_LABELS.get(name, name),
                     _pm(r["test_acc_mean"], r["test_acc_std"]), _r(r["delta_pp_vs_fp32"], 2),
                     _r(r["MB_per_epoch_per_rank"], 4), _r(r["reduction_vs_post_fp32"], 1),
                     _r(r["reduction_vs_hybrid_fp32"], 1)])
    return list(QUANTIZATION_COLUMNS), rows, {}


STALE_HALOS_COLUMNS = ["model", "configuration", "test acc (%)", "Δ vs fp32 (pp)", "rows skipped",
                       "MB/epoch/rank", "× fewer than post fp32", "exposed exchange ms/epoch"]


def curate_stale_halos(result: Dict[str, Any],
                       where: Dict[str, str]) -> Tuple[List[str], List[list], dict]:
    """``python -m benchmarks stale_halos``'s JSON: per (model, configuration) test accuracy
    over the seeds and its difference to exact fp32, the share of rows the cache skipped or
    sampling left out (mean over the run), bytes per epoch and rank against post fp32, and the
    exchange time a rank waited for per epoch (median over the seeds)."""
    rows = []
    for r in _select(result["rows"], where, "stale_halos"):
        skipped = r.get("rows_skipped_frac")
        rows.append([_model_label(r["model"]), CONFIG_LABELS.get(r["config"].split("@")[0], r["config"]),
                     _pm(r["test_acc_mean"], r["test_acc_std"]), _r(r["delta_pp_vs_fp32"], 2),
                     None if not skipped else f"{100 * skipped:.0f} %",
                     _r(r["MB_per_epoch_per_rank"], 4), _r(r["reduction_vs_post_fp32"], 2),
                     _r(1e3 * r["exchange_s"], 1)])
    return list(STALE_HALOS_COLUMNS), rows, {}


#: The kernels table's contenders, in its column order (the others stay in the result file).
KERNEL_METHODS = {"pyg": "PyG gather-scatter", "sparse_csr_mm": "torch.sparse.mm CSR",
                  "ours": "ours", "ours_check_every_call": "ours, validating every call"}


def curate_kernels(result: Dict[str, Any],
                   where: Dict[str, str]) -> Tuple[List[str], List[list], dict]:
    """The aggregation rows of ``python -m benchmarks kernels``'s JSON: per (case, F) the load
    average and the copy / read bandwidth measured before it, seconds forward / forward+backward
    (best of the repeats) of each contender in :data:`KERNEL_METHODS`, and ours' forward
    bandwidth under the per-edge and the minimum byte models as shares of copy and read."""
    rows = _select(result["aggregation"], where, "kernels")
    methods = [m for m in KERNEL_METHODS if any(r["method"] == m for r in rows)]
    columns = ["case", "F", "load; copy / read GB/s", *(KERNEL_METHODS[m] for m in methods),
               "ours fwd, per-edge bytes: GB/s (% copy / % read)",
               "ours fwd, minimum bytes: GB/s (% copy / % read)"]
    out = []
    for key in dict.fromkeys((r["case"], r["F"]) for r in rows):
        group = {r["method"]: r for r in rows if (r["case"], r["F"]) == key}
        r0 = next(iter(group.values()))
        cells = [f"{r0['case']} {_count(r0['nodes'])}/{_count(r0['edges'])}", key[1],
                 f"{r0['load_avg_before']:.1f}; {r0['copy_best_gbs']:.1f} / {r0['read_best_gbs']:.1f}"]
        for m in methods:
            r = group.get(m)
            if r is None:
                cells.append(None)
            elif r.get("fwd_best_s") is None:
                cells.append("not run (memory)")
            else:
                fb = r.get("fwd_bwd_best_s")
                cells.append(f"{r['fwd_best_s']:.3f} / " + (f"{fb:.3f}" if fb else "not run (memory)"))
        ours = group.get("ours") or {}
        if ours.get("fwd_best_s"):
            cells += [f"{ours['per_edge_gbs']:.1f} ({ours['per_edge_pct_copy']:.0f} % / "
                      f"{ours['per_edge_pct_read']:.0f} %)",
                      f"{ours['minimum_gbs']:.1f} ({ours['minimum_pct_copy']:.0f} % / "
                      f"{ours['minimum_pct_read']:.0f} %)"]
        else:
            cells += [None, None]
        out.append(cells)
    return columns, out, {}


#: topic -> curator(result, where) -> (columns, rows, meta with optional "command"/"measured").
CURATORS: Dict[str, Callable[[Dict[str, Any], Dict[str, str]], Tuple[List[str], List[list], dict]]] = {
    "cluster": curate_cluster,
    "fourd": curate_fourd,
    "fourd-memory": curate_fourd_memory,
    "cora_accuracy": curate_cora_accuracy,
    "fullgraph": curate_fullgraph,
    "aggregation-rows": curate_aggregation_rows,
    "aggregation-measured": curate_aggregation_measured,
    "planner": curate_planner,
    "quantization": curate_quantization,
    "stale_halos": curate_stale_halos,
    "kernels": curate_kernels,
}


def curate_entry(topic: str, result: Dict[str, Any], where: Optional[Dict[str, str]] = None,
                 base: Optional[Dict[str, Any]] = None, **text: Optional[str]) -> Dict[str, Any]:
    """One entry of ``results.json`` from a topic's result: ``columns`` and ``rows`` by the
    topic's curator; ``title``, ``setup``, ``notes`` from ``text`` or ``base`` (the entry it
    replaces); ``command`` and ``measured`` from ``text``, the result's metadata or ``base``."""
    if topic not in CURATORS:
        raise SystemExit(f"no curator for topic {topic!r} (curatable: {', '.join(CURATORS)})")
    columns, rows, meta = CURATORS[topic](result, dict(where or {}))
    base = base or {}
    entry: Dict[str, Any] = {}
    for key in ("title", "command", "measured", "setup"):
        value = text.get(key) or (meta.get(key) if key in ("command", "measured") else None) or base.get(key)
        if not value:
            raise SystemExit(f"the entry needs a {key!r} (--{key})")
        entry[key] = value
    if entry["command"].startswith("cluster.py"):  # results written before the package
        entry["command"] = "sudo python -m benchmarks cluster" + entry["command"][len("cluster.py"):]
    entry["command"] = re.sub(r" --json-out \S+", "", entry["command"])  # where it went: not the point
    entry["columns"], entry["rows"] = columns, rows
    notes = text.get("notes") or base.get("notes")
    if notes:
        entry["notes"] = notes
    return entry


def check(doc: Dict[str, Any]) -> List[str]:
    """Problems of a ``results.json`` document (empty: none)."""
    problems = []
    for key, entry in doc.items():
        for field in REQUIRED:
            if field not in entry:
                problems.append(f"{key}: no {field!r}")
        for field in ("title", "command", "measured", "setup", "notes"):
            if field in entry and not isinstance(entry[field], str):
                problems.append(f"{key}: {field!r} is not a string")
        columns = entry.get("columns") or []
        for i, row in enumerate(entry.get("rows") or []):
            if len(row) != len(columns):
                problems.append(f"{key}: row {i} has {len(row)} cells for {len(columns)} columns")
        extra = set(entry) - set(REQUIRED) - {"notes"}
        if extra:
            problems.append(f"{key}: unknown fields {sorted(extra)}")
    return problems


def dump(doc: Dict[str, Any]) -> str:
    """``results.json``'s text: one line per row, for short diffs."""
    lines = ["{"]
    for k, (key, entry) in enumerate(doc.items()):
        lines.append(f"  {json.dumps(key)}: {{")
        fields = [f for f in (*REQUIRED, "notes") if f in entry]
        for i, field in enumerate(fields):
            comma = "," if i < len(fields) - 1 else ""
            if field == "rows":
                rows = entry["rows"]
                lines.append('    "rows": [')
                for j, row in enumerate(rows):
                    lines.append("      " + json.dumps(row, ensure_ascii=False) + ("," if j < len(rows) - 1 else ""))
                lines.append("    ]" + comma)
            else:
                lines.append(f"    {json.dumps(field)}: {json.dumps(entry[field], ensure_ascii=False)}{comma}")
        lines.append("  }" + ("," if k < len(doc) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def curate_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks curate",
        description="Build an entry of benchmarks/results.json from a topic's result file "
                    f"(curatable topics: {', '.join(CURATORS)}).")
    p.add_argument("result", help="a result file the topic wrote (JSON)")
    p.add_argument("--topic", required=True, help="the topic that wrote it")
    p.add_argument("--key", default=None, help="the entry's key in results.json (default: the topic)")
    p.add_argument("--where", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="keep only the result rows with these fields (e.g. run=gcn model=sage)")
    for field in ("title", "command", "measured", "setup", "notes"):
        p.add_argument(f"--{field}", default=None)
    p.add_argument("--results", default=str(RESULTS_JSON), help="the curated file (default: %(default)s)")
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="print the entry instead of writing it into --results")
    args = p.parse_args(list(argv))
    where = dict(item.split("=", 1) for item in args.where)
    key = args.key or args.topic
    path = Path(args.results)
    doc = json.loads(path.read_text()) if path.exists() else {}
    entry = curate_entry(args.topic, json.loads(Path(args.result).read_text()), where, doc.get(key),
                         title=args.title, command=args.command, measured=args.measured,
                         setup=args.setup, notes=args.notes)
    if args.print_only:
        print(json.dumps({key: entry}, indent=2, ensure_ascii=False))
        return 0
    doc[key] = entry
    problems = check(doc)
    if problems:
        raise SystemExit("\n".join(problems))
    path.write_text(dump(doc))
    print(f"# {key}: {len(entry['rows'])} rows into {path}", file=sys.stderr)
    return 0


# --- plots ------------------------------------------------------------------------------------

def _plot_cluster(result: Dict[str, Any], out: str) -> None:
    from .cluster import plot
    plot(result["rows"], out)


def _plot_fourd(result: Dict[str, Any], out: str) -> None:
    from .fourd import plot
    plot(result["rows"], out)


def _plot_kernels(result: Dict[str, Any], out: str) -> None:
    from .kernels import plot
    rows = result.get("aggregation") or []
    if not rows:
        raise SystemExit("the result holds no aggregation rows (was it written with --no-agg?)")
    plot(rows, out)


#: topic -> plotter(result, png path): the figures under docs/ (cluster-*.png: the step per
#: configuration and model; fourd-*.png: test accuracy and bytes per step of each 4-D
#: configuration; kernels-*.png: bandwidth shares and speed-ups, the row-read floor
#: and the reachable bound when the run timed them).  docs/plan-cora.png is drawn by
#: ``lightning-fullgraph plan --plot``, not by a benchmark.
PLOTTERS: Dict[str, Callable[[Dict[str, Any], str], None]] = {
    "cluster": _plot_cluster,
    "fourd": _plot_fourd,
    "kernels": _plot_kernels,
}


def plot_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks plot",
                                description="Draw a topic's figure from its result file "
                                            f"(topics with figures: {', '.join(PLOTTERS)}).")
    p.add_argument("topic", choices=sorted(PLOTTERS))
    p.add_argument("result", help="a result file the topic wrote (JSON)")
    p.add_argument("--out", required=True, help="the figure (PNG)")
    args = p.parse_args(list(argv))
    PLOTTERS[args.topic](json.loads(Path(args.result).read_text()), args.out)
    print(f"# figure: {args.out}", file=sys.stderr)
    return 0
