import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv
from torch_geometric.utils import coalesce, homophily, is_undirected

from lightning_fullgraph.data import synthetic_graph, validate_graph


@pytest.fixture(scope="module")
def graph():
    return synthetic_graph(3000, avg_degree=10, seed=0)


def test_deterministic_by_seed(graph):
    again = synthetic_graph(3000, avg_degree=10, seed=0)
    for key in graph.keys():
        assert torch.equal(graph[key], again[key]), key
    other = synthetic_graph(3000, avg_degree=10, seed=1)
    assert not torch.equal(graph.edge_index, other.edge_index)
    assert not torch.equal(graph.x, other.x)


def test_shapes_and_dtypes(graph):
    assert graph.x.shape == (3000, 32) and graph.x.dtype == torch.float32
    assert graph.y.shape == (3000, ) and graph.y.dtype == torch.long
    assert graph.edge_index.dtype == torch.long
    assert set(graph.y.tolist()) == set(range(5))
    masks = torch.stack([graph.train_mask, graph.val_mask, graph.test_mask])
    assert masks.dtype == torch.bool
    assert torch.equal(masks.sum(0), torch.ones(3000, dtype=torch.long))
    assert masks.sum(1).tolist() == [1800, 600, 600]


def test_undirected_coalesced_no_self_loops(graph):
    ei = graph.edge_index
    assert is_undirected(ei, num_nodes=3000)
    assert torch.equal(coalesce(ei, num_nodes=3000), ei)
    assert not bool((ei[0] == ei[1]).any())
    # Target edge count is met (duplicates are replaced), nothing isolated.
    assert ei.size(1) == 30000
    assert int(torch.bincount(ei[0], minlength=3000).min()) >= 1
    validate_graph(graph, num_classes=5, strict=True)


def test_degree_skew():
    def degree(**kwargs):
        data = synthetic_graph(10000, avg_degree=10, seed=0, **kwargs)
        return torch.bincount(data.edge_index[0]).float()

    skewed, flat = degree(power_law_exponent=2.5), degree(
        power_law_exponent=None)
    assert float(skewed.max()) > 15 * float(skewed.mean())
    assert float(skewed.std() / skewed.mean()) > 1.0
    assert float(flat.std() / flat.mean()) < 0.5
    # Heavier tail for a smaller exponent.
    heavier = degree(power_law_exponent=2.1)
    assert float(heavier.std()) > float(skewed.std())


@pytest.mark.parametrize("h", [0.2, 0.5, 0.9])
def test_homophily(h):
    data = synthetic_graph(5000, homophily=h, seed=0)
    assert abs(homophily(data.edge_index, data.y, method="edge") - h) < 0.03


def test_communities_share_classes():
    data = synthetic_graph(2000, num_classes=3, num_communities=12, seed=0)
    assert set(data.y.tolist()) == {0, 1, 2}
    # Intra-community edges are always intra-class, so label homophily is at
    # least the community homophily.
    assert homophily(data.edge_index, data.y, method="edge") >= 0.78


class _GCN(torch.nn.Module):
    def __init__(self, i, h, o):
        super().__init__()
        # cached: transductive, so the normalisation is computed once.
        self.conv1 = GCNConv(i, h, cached=True)
        self.conv2 = GCNConv(h, o, cached=True)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


class _MLP(torch.nn.Module):
    def __init__(self, i, h, o):
        super().__init__()
        self.lin1, self.lin2 = torch.nn.Linear(i, h), torch.nn.Linear(h, o)

    def forward(self, x, edge_index):
        return self.lin2(F.relu(self.lin1(x)))


def _test_accuracy(model, data, epochs=30):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02,
                                 weight_decay=5e-4)
    for _ in range(epochs):
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)
        F.cross_entropy(out[data.train_mask],
                        data.y[data.train_mask]).backward()
        optimizer.step()
    with torch.no_grad():
        pred = model(data.x, data.edge_index).argmax(-1)
    return float((pred[data.test_mask] == data.y[data.test_mask]).float()
                 .mean())


def test_learnable_gcn_beats_mlp_and_chance():
    data = synthetic_graph(800, seed=0)
    torch.manual_seed(0)
    gcn = _test_accuracy(_GCN(32, 32, 5), data)
    torch.manual_seed(0)
    mlp = _test_accuracy(_MLP(32, 32, 5), data)
    chance = 1 / 5
    assert gcn > 0.8
    assert gcn > mlp + 0.25
    assert mlp > chance  # features carry some signal on their own


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_nodes=1), "num_nodes must be >= 2"),
    (dict(num_nodes=10, avg_degree=10), "avg_degree must be in"),
    (dict(num_nodes=10, avg_degree=0), "avg_degree must be in"),
    (dict(num_nodes=10, avg_degree=2, num_features=0), "num_features"),
    (dict(num_nodes=10, avg_degree=2, num_classes=0), "num_classes"),
    (dict(num_nodes=10, avg_degree=2, num_classes=4, num_communities=2),
     "num_communities"),
    (dict(num_nodes=10, avg_degree=2, power_law_exponent=1.0),
     "power_law_exponent"),
    (dict(num_nodes=10, avg_degree=2, homophily=1.5), "homophily"),
    (dict(num_nodes=10, avg_degree=2, feature_noise=-1), "feature_noise"),
    (dict(num_nodes=10, avg_degree=2, train_ratio=0.8, val_ratio=0.3),
     "train_ratio"),
])
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic_graph(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(num_nodes=2, avg_degree=1, num_classes=2),
    dict(num_nodes=50, avg_degree=49, num_classes=1),  # complete graph
    dict(num_nodes=200, avg_degree=0.5),  # sparser than one edge per node
    dict(num_nodes=300, homophily=1.0, num_communities=300, num_classes=3),
    dict(num_nodes=300, homophily=0.0),
])
def test_edge_cases_stay_valid(kwargs):
    data = synthetic_graph(**kwargs, seed=3)
    n = kwargs["num_nodes"]
    assert is_undirected(data.edge_index, num_nodes=n)
    assert torch.equal(coalesce(data.edge_index, num_nodes=n),
                       data.edge_index)
    assert not bool((data.edge_index[0] == data.edge_index[1]).any())
    assert data.edge_index.size(1) <= n * (n - 1)


def test_medium_graph_hits_target_degree():
    data = synthetic_graph(100_000, avg_degree=8, seed=0)
    assert data.edge_index.size(1) == 800_000
    assert int(data.edge_index.max()) == 99_999
