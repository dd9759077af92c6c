"""What the benchmark topics share: where results go, writing and printing them, timing helpers.

Results are written outside the repository: to ``--out DIR`` when a topic is given one, else to
``$LIGHTNING_FULLGRAPH_BENCH_DIR``, else to ``~/.cache/lightning_fullgraph/benchmarks/``.  Each
run writes ``<topic>-<YYYYmmdd-HHMMSS>.json`` there (the JSON the topic prints, or its rows);
``python -m benchmarks curate`` turns such files into entries of the committed
``benchmarks/results.json``, and ``python -m benchmarks plot`` draws the figures of a topic
from them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from lightning_fullgraph._paths import cache_home

#: The repository root (the directory holding ``benchmarks/``): the working directory of the
#: subprocesses a topic starts, and their ``PYTHONPATH``, so that they import this package.
REPO = Path(__file__).resolve().parent.parent
#: Environment variable naming the default results directory.
RESULTS_ENV = "LIGHTNING_FULLGRAPH_BENCH_DIR"


def child_env(base: Optional[Dict[str, str]] = None, **extra: str) -> Dict[str, str]:
    """An environment for a subprocess that imports this package: ``base`` (default: this
    process's) with the repository root first on ``PYTHONPATH``, plus ``extra``."""
    env = dict(os.environ if base is None else base)
    paths = [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


def module_command(topic: str) -> List[str]:
    """The command line that runs ``benchmarks.<topic>`` in a fresh interpreter (run it with
    ``cwd=REPO`` or :func:`child_env`)."""
    return [sys.executable, "-m", f"benchmarks.{topic}"]


def results_dir(out: Optional[os.PathLike] = None) -> Path:
    """The results directory (created): ``out``, else :func:`default_results_root`."""
    path = Path(out if out is not None and str(out) != "" else default_results_root()).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_results_root() -> Path:
    """The default results directory, not created (for defaults shown in ``--help``):
    ``$LIGHTNING_FULLGRAPH_BENCH_DIR``, else ``benchmarks/`` in the library's cache directory
    (``$LIGHTNING_FULLGRAPH_CACHE`` or ``~/.cache/lightning_fullgraph``, beside its partitions
    and compiled kernels)."""
    env = os.environ.get(RESULTS_ENV)
    if env:
        return Path(env)
    return cache_home() / "benchmarks"


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def result_path(topic: str, out: Optional[os.PathLike] = None, suffix: str = ".json") -> Path:
    """``<results dir>/<topic>-<time stamp><suffix>``.

    ``out`` names the directory; for the topics whose ``--out`` named a result file before they
    were gathered here (``aggregation``, ``fullgraph``, ``hosts``), a path ending in ``.json``
    is still taken as the file itself."""
    if out is not None and str(out).endswith(".json"):
        path = Path(out).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        return path
    return results_dir(out) / f"{topic}-{stamp()}{suffix}"


def add_out_argument(parser: argparse.ArgumentParser, *, file_ok: bool = False) -> None:
    """``--out DIR``: the directory of the result file (see :func:`results_dir`)."""
    extra = " (a path ending in .json: that file)" if file_ok else ""
    parser.add_argument("--out", default=None, metavar="DIR",
                        help=f"directory of the result file{extra}; default ${RESULTS_ENV} or "
                             "~/.cache/lightning_fullgraph/benchmarks")


def add_cluster_arguments(parser: argparse.ArgumentParser, *, node_cores: int) -> None:
    """The options of a topic that runs on emulated clusters (:func:`cluster_worker_json`):
    ``--nodes``, ``--rates``, ``--node-cores`` (default :obj:`node_cores`), ``--repeats``,
    ``--json-out`` and ``--out``."""
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rates", nargs="+", default=["1gbit"],
                        help="link rates, e.g. 1gbit 10gbit")
    parser.add_argument("--node-cores", type=int, default=node_cores,
                        help=f"cores of each emulated machine (as benchmarks cluster; default "
                             f"{node_cores})")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json-out", default=None)
    add_out_argument(parser)


def write_result(topic: str, result: Any, out: Optional[os.PathLike] = None,
                 path: Optional[os.PathLike] = None, indent: int = 1) -> Path:
    """Writes ``result`` as JSON to ``path`` (or :func:`result_path`) and says where on stderr
    (stdout keeps only what the topic prints)."""
    target = Path(path) if path is not None else result_path(topic, out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=indent))
    print(f"# result: {target}", file=sys.stderr, flush=True)
    return target


def cluster_worker_json(topic: str, cluster: Any, node_cores: int, extra: Dict[str, str],
                        port: int, timeout: float) -> Dict[str, Any]:
    """Runs ``python -m benchmarks.<topic> --worker`` under one ``torchrun`` per node of the
    emulated :obj:`cluster` (brought up and torn down here), with as many threads per rank as
    a node has cores, sleeping at once when idle, and :obj:`extra` in the environment; returns
    the JSON object rank 0 printed.  A failing node raises with rank 0's error output."""
    import subprocess
    path = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)
    env = dict(PYTHONPATH=path, OMP_NUM_THREADS=str(node_cores), OMP_WAIT_POLICY="PASSIVE",
               **extra)
    with cluster:
        procs = cluster.torchrun(["-m", f"benchmarks.{topic}", "--worker"], env=env, port=port,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        outs = [proc.communicate(timeout=timeout) for proc in procs]
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"{topic} at {cluster.rate}: exit codes "
                           f"{[proc.returncode for proc in procs]}:\n{outs[0][1][-3000:]}")
    text = outs[0][0]
    return json.loads(text[text.index("{"):])


def write_rows(topic: str, rows: List[Dict[str, Any]], opts: argparse.Namespace,
               argv: Optional[Sequence[str]]) -> Path:
    """Writes ``{"meta": ..., "rows": rows}`` to ``opts.json_out`` (or :func:`result_path`
    under ``opts.out``), the meta naming the command line, and says where on stderr."""
    out = Path(opts.json_out) if opts.json_out else result_path(topic, opts.out)
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M"), cores=os.cpu_count(),
                command=" ".join([f"python -m benchmarks {topic}"]
                                 + (sys.argv[1:] if argv is None else list(argv))))
    out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
    print(f"results: {out}", file=sys.stderr)
    return out


def print_json(result: Any, indent: Optional[int] = 2) -> None:
    print(json.dumps(result, indent=indent), flush=True)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table of ``rows`` under ``columns``."""
    out = ["| " + " | ".join(map(str, columns)) + " |", "|" + " --- |" * len(columns)]
    out += ["| " + " | ".join("-" if c is None else str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


# --- timing ---------------------------------------------------------------------------------

def timeit(fn: Callable[[], None], repeats: int, warmup: int) -> List[float]:
    """Wall times of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def best_median(times: Optional[List[float]]) -> Tuple[Optional[float], Optional[float]]:
    """``(min, median)``: the minimum because interference on a shared machine only ever adds
    time, the median to show how much it did."""
    if not times:
        return None, None
    return min(times), statistics.median(times)


def abba(first: Callable[[], float], second: Callable[[], float],
         rounds: int) -> Tuple[List[float], List[float]]:
    """Seconds of two contenders (each call returns its own seconds) timed alternately in one
    process, ``rounds`` rounds in ABBA order: the first of a pair is sometimes faster or slower
    for reasons of its own (allocation, cache state), so each takes that place equally often."""
    a, b = [], []
    for r in range(rounds):
        if r % 2 == 0:
            a.append(first())
            b.append(second())
        else:
            b.append(second())
            a.append(first())
    return a, b


def spread(times: List[float]) -> Dict[str, float]:
    """``min``, ``median`` and ``mean`` of ``times``."""
    return {"min": min(times), "median": statistics.median(times), "mean": statistics.mean(times)}
