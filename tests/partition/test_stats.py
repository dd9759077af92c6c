import json

import pytest
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
    assert "edge cut" in table and len(table.splitlines()) == 2 + 4 + 1 + 3 + 1
    assert set(a.summary()) >= {"partition/edge_cut_fraction", "partition/total_halo",
                                "partition/rows_post", "partition/rows_pre",
                                "partition/rows_hybrid"}
    # Rows per mode: totals are the sums of the per-pair matrices.
    assert set(a.mode_rows) == {"post", "pre", "hybrid"}
    for m, matrix in a.mode_matrix.items():
        assert a.mode_rows[m] == sum(map(sum, matrix))
        assert all(matrix[r][r] == 0 for r in range(4))
    assert a.mode_rows["post"] == a.total_halo and a.mode_matrix["post"] == a.comm_matrix
    assert a.mode_rows["hybrid"] <= min(a.mode_rows["post"], a.mode_rows["pre"])
    assert f"hybrid {a.mode_rows['hybrid']:,}" in table
    assert f"({a.hybrid_gain():.2f}x fewer than post)" in table
    assert a.hosts == 1 and a.intra_host_rows == a.mode_rows  # one host: all intra
    assert a.inter_host_rows == {"post": 0, "pre": 0, "hybrid": 0}


def test_single_part_stats(make_graph):
    data = make_graph()
    s = partition_stats(torch.zeros(data.num_nodes, dtype=torch.long), data.edge_index)
    assert s.edge_cut == 0 and s.total_halo == 0 and s.node_imbalance == 1.0
    assert s.mode_rows == {"post": 0, "pre": 0, "hybrid": 0} and s.hybrid_gain() == 1.0
    assert s.train == [] and "train" not in s.format_table().splitlines()[0]


def test_host_split_of_rows(make_graph):
    # Hand-made parts: ranks 0,1 on host 0 and 2,3 on host 1 (host-major).
    data = make_graph(num_nodes=120, num_edges=700, seed=4)
    ei = data.edge_index
    parts = torch.arange(data.num_nodes) % 4
    s = partition_stats(parts, ei, num_parts=4, hosts=2)
    assert s.hosts == 2
    host = parts // 2
    for m in ("post", "pre", "hybrid"):
        inter = sum(s.mode_matrix[m][r][q] for r in range(4) for q in range(4)
                    if r // 2 != q // 2)
        assert s.inter_host_rows[m] == inter
        assert s.inter_host_rows[m] + s.intra_host_rows[m] == s.mode_rows[m]
    # Brute force for post: distinct (receiver, source) over edges crossing hosts.
    cross = (host[ei[0]] != host[ei[1]])
    pairs = {(int(parts[v]), int(u)) for u, v in ei[:, cross].t()}
    assert s.inter_host_rows["post"] == len(pairs)
    same = (host[ei[0]] == host[ei[1]]) & (parts[ei[0]] != parts[ei[1]])
    pairs = {(int(parts[v]), int(u)) for u, v in ei[:, same].t()}
    assert s.intra_host_rows["post"] == len(pairs)
    assert s.host_rows(4)["intra"] == {"post": 0, "pre": 0, "hybrid": 0}
    assert s.host_rows(1)["inter"] == {"post": 0, "pre": 0, "hybrid": 0}
    assert s.host_rows(2) == {"intra": s.intra_host_rows, "inter": s.inter_host_rows}
    table = s.format_table()
    assert f"hosts 2 x 2 ranks: inter-host rows post {s.inter_host_rows['post']:,}" in table
    with pytest.raises(ValueError, match="hosts=3 must be a positive divisor"):
        s.host_rows(3)
    d = json.loads(json.dumps(s.to_dict()))
    assert PartitionStats.from_dict(d) == s
