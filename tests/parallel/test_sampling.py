"""Communication-free uniform vertex sampling (ScaleGNN §III-D): deterministic per (seed,
replica, step), the same for a replica's processes and different across replicas, no
collective called, and one aggregation unbiased (Monte Carlo against the full graph)."""
import pytest
import torch
import torch.distributed as dist
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import scatter

from lightning_fullgraph.parallel import UniformVertexSampler


def _graph(n=40, e=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    return torch.cat([ei, ei.flip(0)], dim=1), n


def test_same_within_a_replica_different_across_and_deterministic():
    ei, n = _graph()
    a = UniformVertexSampler(ei, n, batch_size=12, seed=7)
    b = UniformVertexSampler(ei, n, batch_size=12, seed=7)  # another process of the replica
    s = a.sample(step=3, replica=1)
    t = b.sample(step=3, replica=1)
    assert torch.equal(s.nodes, t.nodes) and torch.equal(s.edge_index, t.edge_index)
    assert torch.equal(s.edge_weight, t.edge_weight)
    assert s.nodes.numel() == 12 and bool((s.nodes[1:] > s.nodes[:-1]).all())
    assert not torch.equal(a.nodes(3, replica=0), s.nodes)  # other replica
    assert not torch.equal(a.nodes(4, replica=1), s.nodes)  # other step
    assert not torch.equal(UniformVertexSampler(ei, n, 12, seed=8).nodes(3, 1), s.nodes)


def test_induced_subgraph_with_rescaled_full_graph_weights():
    ei, n = _graph(seed=1)
    sampler = UniformVertexSampler(ei, n, batch_size=15, seed=0)
    full_index, full_weight = gcn_norm(ei, None, n, add_self_loops=True)
    weights = {(int(u), int(v)): float(w) for u, v, w in zip(*full_index, full_weight)}
    batch = sampler.sample(step=0)
    p = (15 - 1) / (n - 1)
    assert batch.p == pytest.approx(p)
    nodes = set(batch.nodes.tolist())
    got = {}
    for (u, v), w in zip(batch.edge_index.t().tolist(), batch.edge_weight.tolist()):
        gu, gv = int(batch.nodes[u]), int(batch.nodes[v])
        got[(gu, gv)] = w
        expected = weights[(gu, gv)] / (1.0 if gu == gv else p)
        assert w == pytest.approx(expected, rel=1e-6)
    # Every full-graph edge between sampled vertices is there (self-loops included).
    assert set(got) == {(u, v) for (u, v) in weights if u in nodes and v in nodes}


def test_sampling_calls_no_collective(monkeypatch):
    calls = []
    for name in ("all_reduce", "broadcast", "all_gather", "all_to_all_single", "barrier",
                 "send", "recv", "all_gather_object", "broadcast_object_list"):
        monkeypatch.setattr(dist, name, lambda *a, _n=name, **k: calls.append(_n))
    ei, n = _graph()
    sampler = UniformVertexSampler(ei, n, batch_size=10, seed=0)
    for step in range(5):
        sampler.sample(step, replica=step % 2)
    assert calls == []


def test_one_aggregation_is_unbiased():
    # E[sum_{u in N(v) ∩ S} ã_vu x_u | v in S] = sum_u a_vu x_u, per node, by Monte Carlo.
    ei, n = _graph(n=30, e=150, seed=2)
    x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    full_index, full_weight = gcn_norm(ei, None, n, add_self_loops=True, dtype=torch.float64)
    exact = scatter(full_weight * x[full_index[0]], full_index[1], dim=0, dim_size=n)
    sampler = UniformVertexSampler(ei, n, batch_size=8, seed=0, dtype=torch.float64)
    total = torch.zeros(n, dtype=torch.float64)
    square = torch.zeros(n, dtype=torch.float64)
    plain = torch.zeros(n, dtype=torch.float64)  # the same without the 1/p rescaling
    count = torch.zeros(n, dtype=torch.float64)
    for step in range(4000):
        b = sampler.sample(step)
        src, dst = b.edge_index
        agg = scatter(b.edge_weight * x[b.nodes][src], dst, dim=0, dim_size=b.num_nodes)
        unscaled = torch.where(src == dst, b.edge_weight, b.edge_weight * b.p)
        total[b.nodes] += agg
        square[b.nodes] += agg ** 2
        plain[b.nodes] += scatter(unscaled * x[b.nodes][src], dst, dim=0, dim_size=b.num_nodes)
        count[b.nodes] += 1
    mean = total / count
    stderr = ((square / count - mean ** 2).clamp_min(0) / count).sqrt()
    assert bool((count > 700).all())
    assert bool(((mean - exact).abs() <= 5 * stderr + 1e-9).all())
    # The test has the power to see a bias: without the rescaling it fails.
    assert bool(((plain / count - exact).abs() > 5 * stderr).any())


def test_bad_batch_size_is_refused():
    ei, n = _graph()
    with pytest.raises(ValueError, match="batch_size"):
        UniformVertexSampler(ei, n, batch_size=1)
    with pytest.raises(ValueError, match="batch_size"):
        UniformVertexSampler(ei, n, batch_size=n + 1)
