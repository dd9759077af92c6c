"""Model surgery: what is refused, and that revert restores the model exactly."""
import pytest
import torch
from torch_geometric.nn import GCNConv, GraphNorm, LayerNorm
from torch_geometric.data import Data
from torch_geometric.nn.conv import gcn_conv, sg_conv

from lightning_fullgraph import compat
from lightning_fullgraph.engine import norm as engine_norm
from lightning_fullgraph.engine import (DistributedBatchNorm, HaloExchange, UnsupportedLayerError,
                                        check_model, partition_model)
from lightning_fullgraph.partition import build_local_partitions

from .models import Net


def _exchange(num_nodes):
    # One rank, no halo: enough to exercise the hooks without a process group.
    data = Data(edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=num_nodes)
    part = build_local_partitions(data, torch.zeros(num_nodes, dtype=torch.long))[0]
    return HaloExchange(part.plan("post"))


class MyConv(GCNConv):
    r"""A user's layer: a subclass may change anything, so it is not verified."""


def test_unverified_layer_is_named():
    model = torch.nn.ModuleDict({"encoder": torch.nn.ModuleList([MyConv(4, 4)])})
    with pytest.raises(UnsupportedLayerError, match=r"'encoder\.0' \(MyConv\) is not verified"):
        check_model(model)
    assert [n for n, _ in check_model(model, trusted_layers=[MyConv])] == ["encoder.0"]


@pytest.mark.parametrize("norm", [LayerNorm(8), GraphNorm(8)])
def test_cross_node_norms_are_accepted(norm):
    # Made exact by engine.graphnorm (see tests/engine/test_cross_node_norms.py).
    assert [n for n, _ in check_model(torch.nn.Sequential(GCNConv(8, 8), norm))] == ["0"]


def test_target_to_source_flow_is_refused():
    conv = GCNConv(4, 4, flow="target_to_source")
    with pytest.raises(UnsupportedLayerError, match="flow='target_to_source'"):
        check_model(conv)


def test_revert_restores_the_model():
    torch.manual_seed(0)
    model = Net("gcn", 8, 3)
    keys = list(model.state_dict())
    handle = partition_model(model, _exchange(10))
    assert isinstance(model.bn, DistributedBatchNorm)
    assert sg_conv.gcn_norm is compat.gcn_norm_router()  # routed through the dispatcher
    assert any(h is engine_norm._dispatch_gcn_norm for *_, h in compat._gcn_norm_handlers)
    assert list(model.state_dict()) == keys  # checkpoints see the same model
    handle.revert()
    assert type(model.bn) is torch.nn.BatchNorm1d
    assert sg_conv.gcn_norm is engine_norm._pyg_gcn_norm
    assert gcn_conv.gcn_norm is engine_norm._pyg_gcn_norm
    assert not compat._gcn_norm_handlers
    assert not model.conv1._propagate_forward_pre_hooks
    assert not model.conv1._forward_pre_hooks
    assert list(model.state_dict()) == keys


def test_a_model_dropped_without_revert_gives_gcn_norm_back():
    # PyG's gcn_norm is routed only while an attached (or accelerated) model exists: a model
    # its user drops without revert() gives the route back when it is collected.
    import gc

    from lightning_fullgraph import kernels
    gc.collect()
    assert gcn_conv.gcn_norm is engine_norm._pyg_gcn_norm
    model = Net("gcn", 8, 3)
    partition_model(model, _exchange(10))
    accelerated = torch.nn.Sequential(GCNConv(4, 4))
    kernels.accelerate(accelerated, "torch")
    assert gcn_conv.gcn_norm is compat.gcn_norm_router()
    del model
    gc.collect()
    assert gcn_conv.gcn_norm is compat.gcn_norm_router()  # the accelerated layer still routes
    del accelerated
    gc.collect()
    assert gcn_conv.gcn_norm is engine_norm._pyg_gcn_norm
    assert sg_conv.gcn_norm is engine_norm._pyg_gcn_norm
    assert not compat._gcn_norm_handlers


def test_global_tensor_on_a_partition_is_a_clear_error():
    model = Net("sage_mean", 8, 3)
    handle = partition_model(model, _exchange(10))
    try:
        with pytest.raises(ValueError, match="received a node tensor with 12 rows but this rank "
                                             "owns 10 nodes"):
            model(torch.randn(12, 8), torch.tensor([[0, 1], [1, 2]]))
    finally:
        handle.revert()  # leaves PyG's gcn_norm unpatched for the tests that follow


def test_one_rank_equals_plain_pyg():
    torch.manual_seed(0)
    model = Net("gat", 8, 3).eval()
    x, edge_index = torch.randn(10, 8), torch.randint(0, 10, (2, 30))
    expected = model(x, edge_index)
    handle = partition_model(model, _exchange(10))
    torch.testing.assert_close(model(x, edge_index), expected)
    handle.revert()
