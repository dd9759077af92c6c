"""Shared by the benchmark script tests: load a script under benchmarks/ as a module."""
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "benchmarks"


@pytest.fixture
def load_benchmark():
    """``load_benchmark("kernels")`` -> the module of ``benchmarks/kernels.py`` (its directory on
    ``sys.path`` while it loads, for the scripts that import each other)."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"{name}_bench", SCRIPTS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(SCRIPTS))
        try:
            spec.loader.exec_module(mod)
        finally:
            sys.path.remove(str(SCRIPTS))
        return mod

    return load


@pytest.fixture
def tiny_partition(tmp_path):
    """A 2-part partition of a 400-node synthetic graph (8 features, 4 classes) on disk, as
    ``benchmarks/fullgraph.py`` writes them: the directory, for the per-rank scripts."""
    from lightning_fullgraph.data.synthetic import synthetic_graph
    from lightning_fullgraph.partition import partition_graph
    data = synthetic_graph(400, avg_degree=6.0, num_features=8, num_classes=4, seed=0)
    return partition_graph(data, 2, root=tmp_path, seed=0, progress=False)
