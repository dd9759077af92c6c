"""Sparse adjacency inputs of a partitioned layer are refused with a message naming the fix.

PyG's ``gcn_norm`` on a sparse adjacency silently used local degrees (wrong for halo
sources); the engine cannot add halo rows to a sparse matrix sized for the rank's nodes.
"""
import pytest
import torch
from torch_geometric.nn import GCNConv, SAGEConv
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csr_tensor

from lightning_fullgraph.engine import FullGraphEngine, SparseAdjacencyError
from lightning_fullgraph.partition import build_local_partitions

from .models import skewed_graph


def _engine():
    data = skewed_graph()
    part = build_local_partitions(data, torch.zeros(data.num_nodes, dtype=torch.long))[0]
    return FullGraphEngine(part)


@pytest.mark.parametrize("layout", ["csr", "coo"])
@pytest.mark.parametrize("conv", [GCNConv, SAGEConv])
def test_sparse_adjacency_is_refused(layout, conv):
    engine = _engine()
    local = engine.data
    layer = conv(local.x.size(1), 4)
    engine.attach(layer)
    make = to_torch_csr_tensor if layout == "csr" else to_torch_coo_tensor
    adj_t = make(local.edge_index.flip(0), size=(local.num_nodes, local.num_nodes))
    try:
        with pytest.raises(SparseAdjacencyError) as info:
            layer(local.x, adj_t)
        message = str(info.value)
        assert "received a sparse adjacency" in message and "batch.edge_index" in message
        layer(local.x, local.edge_index)  # the dense edge_index works
    finally:
        engine.detach()
    layer(local.x, adj_t)  # detached: plain PyG again
