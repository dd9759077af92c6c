import pytest
import torch
from torch_geometric.data import Data

from lightning_fullgraph.partition import (
    LocalPartition,
    build_local_partitions,
    iter_local_partitions,
    metis_partition,
    split_attr_keys,
)


@pytest.mark.parametrize("num_parts", [1, 2, 3, 5])
def test_invariants_random_parts(make_graph, check, num_parts):
    data = make_graph(seed=num_parts)
    g = torch.Generator().manual_seed(1)
    parts = torch.randint(0, num_parts, (data.num_nodes,), generator=g)
    parts[:num_parts] = torch.arange(num_parts)  # every part non-empty
    check(data, parts, build_local_partitions(data, parts))


@pytest.mark.parametrize("num_parts", [2, 4])
def test_invariants_metis_parts(make_graph, check, num_parts):
    data = make_graph(num_nodes=120, num_edges=600, seed=7)
    parts = metis_partition(data.edge_index, data.num_nodes, num_parts)
    check(data, parts, build_local_partitions(data, parts))


def test_undirected_no_extras(make_graph, check):
    data = make_graph(self_loops=False, duplicates=False, isolated=0, seed=3)
    from torch_geometric.utils import to_undirected
    data.edge_index = to_undirected(data.edge_index, num_nodes=data.num_nodes)
    del data.edge_weight, data.edge_attr
    data.edge_weight = torch.rand(data.edge_index.size(1))
    data.edge_attr = torch.rand(data.edge_index.size(1), 2)
    parts = metis_partition(data.edge_index, data.num_nodes, 3)
    check(data, parts, build_local_partitions(data, parts))


def test_streaming_matches_list_and_subset_of_ranks(make_graph):
    data = make_graph()
    parts = torch.arange(data.num_nodes) % 3
    full = build_local_partitions(data, parts)
    only = list(iter_local_partitions(data, parts, ranks=[2]))
    assert len(only) == 1 and only[0].rank == 2
    assert torch.equal(only[0].edge_index, full[2].edge_index)
    assert torch.equal(only[0].send_index, full[2].send_index)


def test_to_dict_roundtrip_weights_only(tmp_path, make_graph):
    data = make_graph()
    parts = torch.arange(data.num_nodes) % 2
    lp = build_local_partitions(data, parts, options={"seed": 0, "nested": {"a": [1]}})[1]
    torch.save(lp.to_dict(), tmp_path / "p.pt")
    back = LocalPartition.from_dict(torch.load(tmp_path / "p.pt", weights_only=True))
    for name in ("owned_ids", "halo_ids", "halo_counts", "send_index", "send_counts",
                 "edge_index", "edge_ids", "in_pre", "out_edge_ids", "out_src", "out_dst",
                 "out_dst_rank", "out_pre", "out_dst_in_degree"):
        assert torch.equal(getattr(back, name), getattr(lp, name))
    assert set(back.out_edge_attrs) == {"edge_weight", "edge_attr"}
    for k, v in back.out_edge_attrs.items():
        assert torch.equal(v, lp.out_edge_attrs[k])
    assert torch.equal(back.plan("hybrid").edge_index, lp.plan("hybrid").edge_index)
    old = lp.to_dict()
    old["format_version"] = 1
    with pytest.raises(ValueError, match="version 1 .*re-partition the graph"):
        LocalPartition.from_dict(old)
    assert back.global_counts == lp.global_counts and back.options == lp.options
    assert back.fingerprint == lp.fingerprint and back.rank == 1
    assert set(back.node_attrs) == {"x", "y", "train_mask", "val_mask", "test_mask"}
    assert set(back.edge_attrs) == {"edge_weight", "edge_attr"}


def test_to_data(make_graph):
    data = make_graph()
    parts = torch.arange(data.num_nodes) % 2
    lp = build_local_partitions(data, parts)[0]
    d = lp.to_data()
    assert d.num_nodes == lp.num_owned
    assert torch.equal(d.n_id, lp.owned_ids)
    assert torch.equal(d.x, data.x[lp.owned_ids])
    assert torch.equal(d.edge_attr, data.edge_attr[lp.edge_ids])
    assert int(d.edge_index[0].max()) < lp.num_owned + lp.num_halo


def test_message_passing_matches_global(make_graph):
    # GCN-style sum aggregation on local rows (owned + exchanged halo) equals the
    # global result bit for bit, because local edges keep the global order.
    from torch_geometric.nn import GraphConv
    data = make_graph(num_nodes=80, num_edges=500)
    torch.manual_seed(0)
    conv = GraphConv(8, 4, aggr="add")
    ref = conv(data.x, data.edge_index, data.edge_weight)
    parts = metis_partition(data.edge_index, data.num_nodes, 3)
    for lp in build_local_partitions(data, parts):
        x_local = torch.cat([data.x[lp.owned_ids], data.x[lp.halo_ids]])
        out = conv(x_local, lp.edge_index, lp.edge_attrs["edge_weight"])[:lp.num_owned]
        assert torch.equal(out, ref[lp.owned_ids])


def test_split_attr_keys_square_graph():
    # num_nodes == num_edges: names decide.
    data = Data(x=torch.zeros(4, 2), edge_index=torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]),
                edge_weight=torch.ones(4), train_mask=torch.ones(4, dtype=torch.bool),
                graph_label=torch.tensor([1]), num_nodes=4)
    node, edge = split_attr_keys(data)
    assert node == ["train_mask", "x"] and edge == ["edge_weight"]


def test_empty_rank_and_edgeless_graph():
    data = Data(x=torch.arange(6.).view(6, 1), edge_index=torch.empty(2, 0, dtype=torch.long),
                num_nodes=6)
    parts = torch.tensor([0, 0, 1, 1, 0, 1])
    lps = build_local_partitions(data, parts)
    assert [lp.num_halo for lp in lps] == [0, 0]
    assert [lp.edge_index.shape for lp in lps] == [(2, 0), (2, 0)]
    lps = build_local_partitions(data, parts, num_parts=3)  # rank 2 owns nothing
    assert lps[2].num_owned == 0 and lps[2].halo_counts.tolist() == [0, 0, 0]


def test_bad_inputs(make_graph):
    data = make_graph()
    with pytest.raises(ValueError, match="parts has 3 entries"):
        build_local_partitions(data, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="num_parts=1"):
        build_local_partitions(data, torch.arange(data.num_nodes) % 2, num_parts=1)
    bad = data.clone()
    bad.edge_index = bad.edge_index.clone()
    bad.edge_index[0, 0] = data.num_nodes
    with pytest.raises(ValueError, match="outside"):
        build_local_partitions(bad, torch.zeros(data.num_nodes, dtype=torch.long))


def test_boundary_levels_are_global_in_degree_quartiles_known_to_both_ends():
    from lightning_fullgraph.partition.local import boundary_levels
    deg = torch.tensor([5, 1, 1, 9, 3, 0, 7, 2])
    level = boundary_levels(deg, torch.tensor([0, 1, 2, 3, 4, 6, 6, 7]))
    # pool degrees sorted: 1 1 2 3 5 7 9 -> ECDF p = 2/7 (deg 1), 3/7, 4/7, 5/7, 6/7, 1
    assert level.tolist() == [2, 1, 1, 3, 2, -1, 3, 1]
    assert boundary_levels(deg, torch.zeros(0, dtype=torch.long)).eq(-1).all()

    g = torch.Generator().manual_seed(0)
    data = Data(edge_index=torch.randint(0, 60, (2, 300), generator=g), num_nodes=60)
    parts = torch.arange(data.num_nodes) % 3
    locals_ = build_local_partitions(data, parts)
    owned_level = torch.full((data.num_nodes, ), -2, dtype=torch.int8)
    for p in locals_:
        owned_level[p.owned_ids] = p.owned_level
    for p in locals_:
        # The receiver's level of each halo row is the sender's level of that node.
        assert torch.equal(p.halo_level, owned_level[p.halo_ids])
        assert (p.halo_level >= 0).all()
        sent = p.send_index
        assert (p.owned_level[sent] >= 0).all()


def test_boundary_levels_with_skewed_percentiles():
    from lightning_fullgraph.partition.local import (QUARTILES, boundary_levels,
                                                     check_level_percentiles)
    g = torch.Generator().manual_seed(1)
    deg = torch.randint(0, 50, (400, ), generator=g)
    boundary = torch.randint(0, 400, (300, ), generator=g)
    # The quartiles as cut points are the default rule.
    assert torch.equal(boundary_levels(deg, boundary, percentiles=QUARTILES),
                       boundary_levels(deg, boundary))
    skewed = boundary_levels(deg, boundary, percentiles=(0.5, 0.8, 0.95))
    nodes = torch.unique(boundary)
    level = skewed[nodes].long()
    assert (skewed >= 0).sum() == nodes.numel() and level.min() >= 0 and level.max() == 3
    # Levels are monotone in the degree and equal degrees share one level.
    order = torch.argsort(deg[nodes], stable=True)
    assert (level[order].diff() >= 0).all()
    # Each level holds about its share of the pool (ties move whole degree groups).
    share = torch.bincount(level, minlength=4).double() / nodes.numel()
    assert share[0] > share[1] > share[2] > share[3] > 0
    assert share[0] >= 0.4 and share[3] <= 0.1
    # The ECDF rule: level = number of cut points below p_v.
    pool = torch.sort(deg[nodes]).values
    p = torch.searchsorted(pool, deg[nodes], right=True).double() / pool.numel()
    want = (p > 0.5).long() + (p > 0.8).long() + (p > 0.95).long()
    assert torch.equal(level, want)
    # The default is SYLVIE's quartile rule, ceil(4 p_v) - 1 (the levels of older partitions).
    quartile = (torch.ceil(p * 4) - 1).clamp(0, 3).long()
    assert torch.equal(boundary_levels(deg, boundary)[nodes].long(), quartile)

    for bad in [(0.5, 0.8), (0.8, 0.5, 0.9), (0.0, 0.5, 0.9), (0.5, 0.8, 1.0), ("a", 1, 2)]:
        with pytest.raises(ValueError, match="level_percentiles"):
            check_level_percentiles(bad)
    assert check_level_percentiles(None) == QUARTILES
