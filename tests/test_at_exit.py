"""The process group is closed at exit after the library's Fabric entry points: gloo's threads
left to C++ static destruction aborted one rank of a finished ``fabric run`` now and then
("terminate called without an active exception", exit code -6)."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_fullgraph.testing import free_port

from .environment import fresh_environment

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import atexit, sys
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
    # Registered first, so it runs last: what the process group is once the library's own
    # exit handlers have run.
    atexit.register(lambda: print("OPEN AT EXIT", dist.is_initialized(), flush=True))

    class Fabric:  # what the entry points use of a launched lightning.fabric.Fabric
        global_rank, world_size, device, num_nodes = 0, 1, torch.device("cpu"), 1
        def broadcast(self, obj, src=0):
            return obj

    from lightning_fullgraph.data.synthetic import synthetic_graph
    data = synthetic_graph(num_nodes=60, num_features=4, num_classes=3, seed=0)
    entry = sys.argv[1]
    if entry == "setup_fourd":
        from lightning_fullgraph.fabric import setup_fourd
        from lightning_fullgraph.parallel import ScaleGNN
        setup_fourd(Fabric(), ScaleGNN(4, 8, 2, 3, 0.0), data, batch_size=20)
    elif entry == "setup_fullgraph":
        from torch_geometric.nn import GCNConv
        from lightning_fullgraph.fabric import setup_fullgraph
        setup_fullgraph(Fabric(), GCNConv(4, 3), data, cache_dir=sys.argv[2], kernels=None)
""")


@pytest.mark.parametrize("entry", ["setup_fourd", "setup_fullgraph", "none"])
def test_the_process_group_is_closed_at_exit_after_an_entry_point(entry, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(port=free_port()))
    proc = subprocess.run([sys.executable, str(script), entry, str(tmp_path / "cache")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=fresh_environment(PYTHONPATH=str(ROOT),
                                                LIGHTNING_FULLGRAPH_CACHE=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Without an entry point of ours the group stays open (nothing of ours ran): the check
    # can tell the two apart.
    expected = "OPEN AT EXIT True" if entry == "none" else "OPEN AT EXIT False"
    assert expected in proc.stdout, proc.stdout + proc.stderr[-3000:]
