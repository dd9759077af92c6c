"""``setup_fullgraph`` on several ranks: an error of rank 0 while it partitions reaches every
rank (the others used to wait in Fabric's broadcast, then print a peer's traceback)."""
import pytest
import torch
import torch.distributed as dist

from lightning_fullgraph.testing import run_distributed

from .engine.models import skewed_graph


class _Fabric:
    r"""What setup_fullgraph uses of a launched ``lightning.fabric.Fabric``."""

    def __init__(self):
        self.global_rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device, self.num_nodes = torch.device("cpu"), 1

    def broadcast(self, obj, src=0):
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]


def _setup(rank, world_size, tmp):
    from torch_geometric.nn import GCNConv

    from lightning_fullgraph.fabric import setup_fullgraph
    data = skewed_graph()
    if rank == 0:
        data.edge_index[0, 0] = data.num_nodes + 5  # only rank 0 holds a broken graph
    try:
        setup_fullgraph(_Fabric(), GCNConv(data.num_features, 4), data, cache_dir=tmp)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


@pytest.mark.multiprocess
def test_a_partitioning_error_of_rank_zero_stops_every_rank(tmp_path):
    results = run_distributed(_setup, 2, str(tmp_path), timeout_s=120)
    assert "outside [0, " in results[0] and not results[0].startswith("RuntimeError: rank 0"), \
        results[0]
    assert results[1].startswith("RuntimeError: rank 0 could not partition the graph"), \
        results[1]
    assert "edge_index contains node ids outside" in results[1]
