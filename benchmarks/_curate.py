"""``python -m benchmarks curate`` and ``python -m benchmarks plot``: the committed numbers and the
figures, from result files.

``benchmarks/results.json`` holds the numbers the documentation cites, one entry per table::

    {"<key>": {"title": ..., "command": ..., "measured": "YYYY-MM-DD", "setup": ...,
               "columns": [...], "rows": [[...], ...], "notes": ...}}

``curate`` builds an entry's ``columns`` and ``rows`` from a topic's result file (the JSON a run
wrote to the results directory) with that topic's curator below, takes ``title``, ``setup``
and ``notes`` from the options or, when the key is already in the file, from its entry, and
``command`` and ``measured`` from the options, the result file's metadata or the entry, in
that order.  Only topics with a curator (:data:`CURATORS`: cluster, fourd, fourd-memory) can be curated;
entries of other topics were copied by hand from the runs' printed tables (their notes name the
logs, which are in the git history under ``benchmarks/results/``).
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


#: topic -> curator(result, where) -> (columns, rows, meta with optional "command"/"measured").
CURATORS: Dict[str, Callable[[Dict[str, Any], Dict[str, str]], Tuple[List[str], List[list], dict]]] = {
    "cluster": curate_cluster,
    "fourd": curate_fourd,
    "fourd-memory": curate_fourd_memory,
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
