import json

import torch

from lightning_fullgraph.partition import (
    PartitionStats,
    build_local_partitions,
    metis_partition,
    partition_stats,
)


def test_stats_from_parts_equals_from_locals(make_graph):
    data = make_graph(num_nodes=200, num_edges=1000)
    parts = metis_partition(data.edge_index, data.num_nodes, 4)
    a = partition_stats(parts, data.edge_index, train_mask=data.train_mask)
    b = partition_stats(build_local_partitions(data, parts))
    assert a.to_dict() == b.to_dict()

    ei = data.edge_index
    cut = int((parts[ei[0]] != parts[ei[1]]).sum())
    assert a.edge_cut == cut and abs(a.edge_cut_fraction - cut / ei.size(1)) < 1e-12
    assert a.owned == torch.bincount(parts, minlength=4).tolist()
    assert a.edges == torch.bincount(parts[ei[1]], minlength=4).tolist()
    assert a.train == torch.bincount(parts[data.train_mask], minlength=4).tolist()
    assert sum(a.halo) == a.total_halo
    assert a.comm_rows_per_epoch(num_layers=2) == 4 * a.total_halo
    assert a.node_imbalance == max(a.owned) / (sum(a.owned) / 4)
    assert [sum(row) for row in a.comm_matrix] == a.halo

    d = json.loads(json.dumps(a.to_dict()))
    assert PartitionStats.from_dict(d) == a
    table = a.format_table()
    assert "edge cut" in table and len(table.splitlines()) == 2 + 4 + 1 + 3
    assert set(a.summary()) >= {"partition/edge_cut_fraction", "partition/total_halo"}


def test_single_part_stats(make_graph):
    data = make_graph()
    s = partition_stats(torch.zeros(data.num_nodes, dtype=torch.long), data.edge_index)
    assert s.edge_cut == 0 and s.total_halo == 0 and s.node_imbalance == 1.0
    assert s.train == [] and "train" not in s.format_table().splitlines()[0]
