"""Shared partitions and models of the planner tests (built identically in every process)."""
import pytest
import torch
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

from lightning_fullgraph.partition import build_local_partitions, metis_partition

from ..engine.models import skewed_graph

MODELS = {"gcn": GCN, "sage": GraphSAGE, "gat": GAT, "gin": GIN}
HIDDEN, CLASSES = 16, 4


def build(kind: str, in_channels: int, seed: int = 0) -> torch.nn.Module:
    r"""A 2-layer BasicGNN (GAT with 2 heads), initialized from :obj:`seed`."""
    torch.manual_seed(seed)
    kwargs = {"heads": 2} if kind == "gat" else {}
    return MODELS[kind](in_channels, HIDDEN, 2, CLASSES, **kwargs)


def partitions(world_size: int):
    r"""The skewed test graph (directed, hubs, isolated nodes) in :obj:`world_size` parts."""
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    return data, build_local_partitions(data, parts)


@pytest.fixture(scope="module")
def parts3():
    return partitions(3)
