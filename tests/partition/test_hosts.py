"""Host-aware (hierarchical) METIS: hosts first, then ranks inside each host."""
import pytest
import torch

from lightning_fullgraph.partition import (
    EmptyPartitionError,
    load_partition,
    metis_partition,
    node_weights_for,
    partition_graph,
    partition_stats,
    read_manifest,
)


@pytest.fixture(scope="module")
def community_graph():
    from lightning_fullgraph.data import synthetic_graph
    return synthetic_graph(6000, avg_degree=8, seed=1)


def _inter_host_post_rows(data, parts, P, H):
    return partition_stats(parts, data.edge_index, num_parts=P, hosts=H).inter_host_rows["post"]


@pytest.mark.parametrize("objective", ["vol", "cut"])
@pytest.mark.parametrize("P, H", [(4, 2), (6, 2), (6, 3), (8, 2), (8, 4)])
def test_host_major_numbering_and_balance(community_graph, P, H, objective):
    data = community_graph
    w = node_weights_for(data)
    parts = metis_partition(data.edge_index, data.num_nodes, P, node_weights=w, hosts=H,
                            objective=objective)
    sizes = torch.bincount(parts, minlength=P)
    assert int(sizes.min()) > 0 and sizes.numel() == P
    work = torch.bincount(parts, weights=w[:, 0].double(), minlength=P)
    assert float(work.max() / work.mean()) < 1.15  # two 3% levels plus slack
    # Never more rows across hosts than the flat partition numbered host-major.
    flat = metis_partition(data.edge_index, data.num_nodes, P, node_weights=w,
                           objective=objective)
    assert _inter_host_post_rows(data, parts, P, H) <= _inter_host_post_rows(data, flat, P, H)
    # Deterministic.
    assert torch.equal(parts, metis_partition(data.edge_index, data.num_nodes, P,
                                              node_weights=w, hosts=H, objective=objective))


@pytest.mark.parametrize("objective, P, H", [("cut", 4, 2), ("vol", 6, 3)])
def test_fewer_rows_cross_hosts(community_graph, objective, P, H):
    # Configurations where host-awareness changes the partition (with "vol", flat
    # k-way METIS often groups its parts onto hosts optimally already: then the
    # result is the flat partition, checked above).
    data = community_graph
    w = node_weights_for(data)
    flat = metis_partition(data.edge_index, data.num_nodes, P, node_weights=w,
                           objective=objective)
    aware = metis_partition(data.edge_index, data.num_nodes, P, node_weights=w, hosts=H,
                            objective=objective)
    s_flat = partition_stats(flat, data.edge_index, num_parts=P, hosts=H)
    s_aware = partition_stats(aware, data.edge_index, num_parts=P, hosts=H)
    for m in ("post", "hybrid"):
        assert s_aware.inter_host_rows[m] < s_flat.inter_host_rows[m]


@pytest.mark.parametrize("P, H", [(4, 2), (6, 3), (8, 2), (8, 4)])
def test_grouping_onto_hosts_is_optimal(community_graph, P, H):
    import itertools

    from lightning_fullgraph.partition.cover import cut_cover, post_rows
    from lightning_fullgraph.partition.metis import _group_onto_hosts, _swap_search
    data = community_graph
    flat = metis_partition(data.edge_index, data.num_nodes, P)
    grouped = _group_onto_hosts(data.edge_index, flat, P, H)
    # A renumbering of whole parts: same part sizes as a multiset.
    assert sorted(torch.bincount(grouped).tolist()) == sorted(torch.bincount(flat).tolist())
    # Brute force over every labelling of the parts with ranks.
    rows = post_rows(data.edge_index, flat, P)
    assert torch.equal(rows, cut_cover(data.edge_index, flat, P).rows["post"])
    host = torch.tensor(list(itertools.permutations(range(P)))) // (P // H)
    crossing = host.unsqueeze(2) != host.unsqueeze(1)  # [P!, P, P]
    best = int((crossing * rows).sum(dim=(1, 2)).min())
    got = _inter_host_post_rows(data, grouped, P, H)
    assert got == best
    # The swap search (used beyond 20,000 groupings) is never worse than identity.
    sym = (rows + rows.t()).tolist()
    per = P // H
    groups = _swap_search(sym, [list(range(h * per, (h + 1) * per)) for h in range(H)])
    label = torch.empty(P, dtype=torch.long)
    for h, g in enumerate(groups):
        label[torch.tensor(sorted(g))] = h * per + torch.arange(per)
    assert got <= _inter_host_post_rows(data, label[flat], P, H) \
        <= _inter_host_post_rows(data, flat, P, H)


def test_trivial_host_counts_are_flat(community_graph):
    data = community_graph
    ei, n = data.edge_index, data.num_nodes
    flat = metis_partition(ei, n, 4)
    assert torch.equal(metis_partition(ei, n, 4, hosts=1), flat)
    assert torch.equal(metis_partition(ei, n, 4, hosts=4), flat)  # one rank per host
    assert torch.equal(metis_partition(ei, n, 4, hosts=None), flat)


def test_bad_hosts(community_graph):
    ei, n = community_graph.edge_index, community_graph.num_nodes
    with pytest.raises(ValueError, match="num_parts=6 is not a multiple of hosts=4"):
        metis_partition(ei, n, 6, hosts=4)
    with pytest.raises(ValueError, match="at least 1"):
        metis_partition(ei, n, 4, hosts=0)
    with pytest.raises(TypeError, match="hosts must be an int"):
        metis_partition(ei, n, 4, hosts=2.0)


def test_empty_rank_inside_a_host_names_the_global_rank(monkeypatch):
    import lightning_fullgraph.partition.metis as metis_mod
    real = metis_mod._flat

    def fake(edge_index, num_nodes, num_parts, **kw):
        if num_parts == 2 and num_nodes == 6:  # the host split: 5 nodes / 1 node
            return torch.tensor([0, 0, 0, 0, 0, 1])
        return real(edge_index, num_nodes, num_parts, **kw)
    monkeypatch.setattr(metis_mod, "_flat", fake)
    ei = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    with pytest.raises(EmptyPartitionError, match="empty part 3 "):
        metis_partition(ei, 6, 4, hosts=2)


def test_partition_graph_with_hosts(tmp_path, make_graph):
    data = make_graph(num_nodes=300, num_edges=1500, seed=5)
    flat = partition_graph(data, 4, root=tmp_path, progress=False)
    aware = partition_graph(data, 4, root=tmp_path, progress=False, hosts=2)
    assert aware != flat  # hosts is part of the cache key
    m = read_manifest(aware)
    assert m["options"]["hosts"] == 2 and read_manifest(flat)["options"]["hosts"] == 1
    stats = m["stats"]
    assert stats["hosts"] == 2
    assert stats["inter_host_rows"]["post"] + stats["intra_host_rows"]["post"] \
        == stats["total_halo"]
    parts = torch.empty(data.num_nodes, dtype=torch.long)
    lps = [load_partition(aware, r, num_parts=4) for r in range(4)]
    for lp in lps:
        parts[lp.owned_ids] = lp.rank
    expect = metis_partition(data.edge_index, data.num_nodes, 4,
                             node_weights=node_weights_for(data), hosts=2)
    assert torch.equal(parts, expect)
    # Stats from the loaded ranks (hosts from their options) equal the manifest's.
    assert partition_stats(lps).to_dict() == stats
    with pytest.raises(ValueError, match="not a multiple of hosts=3"):
        partition_graph(data, 4, root=tmp_path, progress=False, hosts=3)
