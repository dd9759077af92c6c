"""``python -m benchmarks <topic> [options]``: run one benchmark topic (``--help``: the list).

Also ``python -m benchmarks curate ...`` (an entry of ``benchmarks/results.json`` from a result
file) and ``python -m benchmarks plot <topic> <result.json> --out FIG.png``.

Imports nothing heavy before the topic's own module: the ``fullgraph`` and ``aggregation``
topics spawn processes that import this module again (as ``__mp_main__``) and measure their
memory before importing torch.
"""
from __future__ import annotations

import ast
import re
import importlib
import sys
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
#: Commands that are not topics.
COMMANDS = {"curate": "an entry of benchmarks/results.json from a topic's result file",
            "plot": "a topic's figure (cluster, fourd, kernels) from its result file"}


def topics() -> Dict[str, str]:
    """Topic name -> the first line of its module docstring: every module of this package
    with a ``main`` function and a name that does not start with ``_``."""
    out = {}
    for path in sorted(HERE.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            para = " ".join((ast.get_docstring(tree) or "").strip().split("\n\n")[0].split())
            line = re.split(r"(?<!vs)\. ", para)[0].rstrip(".")
            out[path.stem] = line if len(line) <= 110 else line[:107].rstrip() + "..."
    return out


def usage() -> str:
    found = topics()
    width = max(map(len, [*found, *COMMANDS]))
    lines = ["usage: python -m benchmarks <topic> [options]     (python -m benchmarks <topic> --help: its options)",
             "       python -m benchmarks curate RESULT.json --topic TOPIC [--key KEY] [...]",
             "       python -m benchmarks plot TOPIC RESULT.json --out FIG.png",
             "",
             "Run from the repository root. Result files go to --out DIR, $LIGHTNING_FULLGRAPH_BENCH_DIR or",
             "~/.cache/lightning_fullgraph/benchmarks/.",
             "",
             "topics:"]
    lines += [f"  {name:<{width}}  {desc}" for name, desc in found.items()]
    lines += ["", "commands:"]
    lines += [f"  {name:<{width}}  {desc}" for name, desc in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "curate":
        from ._curate import curate_main
        return curate_main(rest)
    if name == "plot":
        from ._curate import plot_main
        return plot_main(rest)
    name = name.replace("-", "_")
    if name not in topics():
        print(f"unknown topic {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"benchmarks.{name}")
    sys.argv = [f"python -m benchmarks {name}", *rest]  # argparse's prog and the topics' argv
    result = module.main(rest)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
