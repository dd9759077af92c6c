"""Shared by the benchmark tests: a topic's module (``benchmarks.<topic>``), results kept in
the test's temporary directory, a tiny partition."""
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def results_in_tmp(tmp_path, monkeypatch):
    """Every topic run by a test (in process or in a subprocess, which inherits the
    environment) writes its result file under the test's temporary directory, not the user's
    ``~/.cache/lightning_fullgraph/benchmarks``."""
    out = tmp_path / "bench-results"
    monkeypatch.setenv("LIGHTNING_FULLGRAPH_BENCH_DIR", str(out))
    return out


@pytest.fixture
def load_benchmark():
    """``load_benchmark("kernels")`` -> the module ``benchmarks.kernels`` (the repository root
    is importable: pytest puts it on ``sys.path`` for ``tests/``, a package)."""

    def load(name: str):
        return importlib.import_module(f"benchmarks.{name}")

    return load


@pytest.fixture
def tiny_partition(tmp_path):
    """A 2-part partition of a 400-node synthetic graph (8 features, 4 classes) on disk, as
    the ``fullgraph`` topic writes them: the directory, for the per-rank scripts."""
    from lightning_fullgraph.data.synthetic import synthetic_graph
    from lightning_fullgraph.partition import partition_graph
    data = synthetic_graph(400, avg_degree=6.0, num_features=8, num_classes=4, seed=0)
    return partition_graph(data, 2, root=tmp_path, seed=0, progress=False)
