"""LocalityOrder: a PyG transform renumbering nodes for locality, reversible through n_id."""
import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.nn import GCNConv

from lightning_fullgraph.data import LocalityOrder, torus_graph
from lightning_fullgraph.kernels import locality


@pytest.fixture
def small_window(monkeypatch):
    # a 40 x 40 torus is small: a window of 128 ids makes its locality measurable
    monkeypatch.setattr(locality, "WINDOW", 128)
    monkeypatch.setattr(locality.locality_score, "__defaults__", (128,))


def _graph(n=1600, degree=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torus_graph(n, degree, radius=2, seed=seed)
    return Data(x=torch.randn(n, 5, generator=g), y=torch.randint(0, 3, (n,), generator=g),
                train_mask=torch.rand(n, generator=g) < 0.5, edge_index=ei,
                edge_attr=torch.randn(ei.size(1), 2, generator=g))


def test_renumbers_everything_consistently(small_window):
    data = _graph()
    out = LocalityOrder()(data)
    assert out.n_id is not None
    n_id = out.n_id
    assert torch.equal(torch.sort(n_id).values, torch.arange(data.num_nodes))
    # node attributes follow their nodes, edges map back to the same edges in the same order
    assert torch.equal(out.x, data.x[n_id]) and torch.equal(out.y, data.y[n_id])
    assert torch.equal(out.train_mask, data.train_mask[n_id])
    assert torch.equal(n_id[out.edge_index], data.edge_index)
    assert torch.equal(out.edge_attr, data.edge_attr)
    before = locality.locality_score(data.edge_index[0], data.edge_index[1])
    after = locality.locality_score(out.edge_index[0], out.edge_index[1])
    assert after > before + locality.MIN_GAIN


def test_model_output_maps_back(small_window):
    data = _graph()
    out = LocalityOrder()(data)
    torch.manual_seed(0)
    conv = GCNConv(5, 4)
    ref = conv(data.x, data.edge_index)
    got = conv(out.x, out.edge_index)
    torch.testing.assert_close(got[out.n_id.argsort()], ref, rtol=1e-5, atol=1e-6)


def test_random_graph_left_alone_unless_forced(small_window):
    g = torch.Generator().manual_seed(1)
    data = Data(x=torch.randn(1600, 3), edge_index=torch.randint(0, 1600, (2, 9600), generator=g))
    kept = LocalityOrder()(data)  # (BaseTransform hands forward a shallow copy)
    assert "n_id" not in kept and torch.equal(kept.edge_index, data.edge_index)
    forced = LocalityOrder("bfs")(data)
    assert forced.n_id is not None and torch.equal(forced.x, data.x[forced.n_id])


def test_composes_n_id_and_is_kept_by_auto_afterwards(small_window, monkeypatch):
    data = _graph()
    data.n_id = torch.arange(data.num_nodes) + 100  # e.g. a subgraph's original ids
    out = LocalityOrder()(data)
    assert torch.equal(out.n_id, data.n_id[LocalityOrder()(_graph()).n_id])
    # the kernels' "auto" sees an ordered graph and computes nothing
    monkeypatch.setattr(locality, "MIN_EDGES", 0)
    monkeypatch.setattr(locality, "bfs_order", lambda *a: pytest.fail("order recomputed for an ordered graph"))
    again = LocalityOrder()(out)
    assert torch.equal(again.n_id, out.n_id) and torch.equal(again.edge_index, out.edge_index)


def test_bad_input():
    with pytest.raises(ValueError, match="mode"):
        LocalityOrder("rcm")
    with pytest.raises(TypeError, match="HeteroData"):
        LocalityOrder()(HeteroData())
