import warnings

import numpy as np
import pytest
import torch
from torch_geometric.data import Data, HeteroData

from lightning_fullgraph.data import (
    GraphReport,
    GraphValidationError,
    GraphWarning,
    check_num_parts,
    validate_graph,
)


def ring(n=6):
    """A valid undirected ring with 2 classes and disjoint masks."""
    src = torch.arange(n)
    dst = (src + 1) % n
    edge_index = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    mask = torch.zeros(n, dtype=torch.bool)
    train, val, test = mask.clone(), mask.clone(), mask.clone()
    train[:2], val[2:4], test[4:] = True, True, True
    return Data(x=torch.randn(n, 3), edge_index=edge_index,
                y=torch.arange(n) % 2, train_mask=train, val_mask=val,
                test_mask=test)


def graph_warnings(data, **kwargs):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        report = validate_graph(data, **kwargs)
    return report, [str(w.message) for w in record
                    if issubclass(w.category, GraphWarning)]


def test_valid_graph_report():
    report, messages = graph_warnings(ring(), num_classes=2)
    assert messages == []
    assert isinstance(report, GraphReport)
    assert report.num_nodes == 6 and report.num_edges == 12
    assert report.num_features == 3 and report.num_classes == 2
    assert not report.is_directed
    assert (report.num_self_loops, report.num_duplicate_edges,
            report.num_isolated_nodes, report.num_unlabelled_nodes) == (0, 0,
                                                                       0, 0)
    assert report.mask_counts == {"train_mask": 2, "val_mask": 2,
                                  "test_mask": 2}
    assert (report.num_train_nodes, report.num_val_nodes,
            report.num_test_nodes) == (2, 2, 2)


def test_val_and_test_masks_are_optional():
    data = ring()
    del data.val_mask, data.test_mask
    report = validate_graph(data, strict=True)
    assert report.mask_counts == {"train_mask": 2}
    assert report.num_val_nodes == 0


def error(data, match, **kwargs):
    with pytest.raises(GraphValidationError, match=match):
        validate_graph(data, **kwargs)


def test_error_is_value_error():
    assert issubclass(GraphValidationError, ValueError)
    assert issubclass(GraphWarning, UserWarning)


def test_not_data():
    error(HeteroData(), r"expected a torch_geometric.data.Data, got "
          r"HeteroData.*to_homogeneous")


def test_empty_graph():
    data = Data(x=torch.empty(0, 3), edge_index=torch.empty(2, 0,
                                                            dtype=torch.long))
    error(data, r"empty graph: data has 0 nodes")
    error(Data(), r"empty graph")


def test_x_errors():
    data = ring()
    del data.x
    data.num_nodes = 6
    error(data, r"data.x is missing.*torch.ones")

    data = ring()
    data.x = torch.ones(6, 3, dtype=torch.long)
    error(data, r"data.x must be floating point, got torch.int64; fix: "
          r"data.x = data.x.float\(\)")

    data = ring()
    data.x = torch.randn(6)
    error(data, r"data.x must be 2-D \[num_nodes, num_features\], got shape "
          r"\(6,\)")

    data = ring()
    data.x = data.x.to_sparse()
    error(data, r"data.x must be a dense torch.Tensor.*to_dense")

    data = ring()
    data.x[2, 0] = float("nan")
    data.x[4, 1] = float("inf")
    data.x[4, 2] = -float("inf")
    error(data, r"x contains 3 NaN/inf values \(first at node 2\); fix: .*"
          r"nan_to_num")


def test_num_nodes_mismatch():
    data = ring()
    data.num_nodes = 7
    error(data, r"data.num_nodes is 7 but data.x has 6 rows")


def test_edge_index_errors():
    data = ring()
    del data.edge_index
    error(data, r"data.edge_index is missing")

    data = ring()
    data.edge_index = data.edge_index.t()
    error(data, r"edge_index must have shape \[2, num_edges\], got \(12, 2\)"
          r".*\.t\(\)\.contiguous\(\)")

    data = ring()
    data.edge_index = data.edge_index.int()
    error(data, r"edge_index must be int64 \(torch.long\), got torch.int32; "
          r"fix: data.edge_index = data.edge_index.long\(\)")

    data = ring()
    data.edge_index[1, 3] = 6
    data.edge_index[0, 7] = -1
    error(data, r"edge_index has 2 edges with node indices outside \[0, 6\) "
          r"\(first at edge 3: \(3, 6\)\)")


def test_mask_errors():
    data = ring()
    del data.train_mask
    error(data, r"data.train_mask is missing.*RandomNodeSplit")

    data = ring()
    data.val_mask = data.val_mask.long()
    error(data, r"val_mask must be a bool tensor, got torch.int64 with shape "
          r"\(6,\); fix: data.val_mask = data.val_mask.bool\(\)")

    data = ring()
    data.train_mask = torch.tensor([0, 1])  # node indices, not a mask
    error(data, r"train_mask must be a bool tensor.*index_to_mask")

    data = ring()
    data.test_mask = torch.ones(5, dtype=torch.bool)
    error(data, r"test_mask must have shape \[num_nodes\] = \[6\], got \(5,\)")

    data = ring()
    data.train_mask = data.train_mask.view(-1, 1).repeat(1, 10)
    error(data, r"train_mask has shape \(6, 10\) \(several splits\); fix: "
          r"select one split, e.g. data.train_mask = data.train_mask\[:, 0\]")

    data = ring()
    data.train_mask[:] = False
    error(data, r"train_mask selects no nodes")


def test_label_errors():
    data = ring()
    del data.y
    error(data, r"data.y is missing")

    data = ring()
    data.y = data.y.view(-1, 1)
    error(data, r"y must be 1-D \[num_nodes\] class labels, got shape "
          r"\(6, 1\); fix: data.y = data.y.view\(-1\)")

    data = ring()
    data.y = data.y[:5]
    error(data, r"y must have one entry per node \(size\(0\) = 6\)")

    data = ring()
    data.y = data.y.bool()
    error(data, r"y must hold integer class labels, got torch.bool")

    data = ring()
    data.y[3] = -2
    error(data, r"y has 1 negative labels other than -1 \(first at node 3: "
          r"-2\)")

    data = ring()
    data.y[4], data.y[5] = 2, 7
    error(data, r"y has 2 labels >= num_classes=2 \(first at node 4: 2\)",
          num_classes=2)
    # Without num_classes it is inferred from the labels (ids 3..6 unused).
    with pytest.warns(GraphWarning, match=r"ids 3..6 have no node"):
        assert validate_graph(data).num_classes == 8

    error(ring(), r"num_classes must be >= 1", num_classes=0)


def test_unlabelled_nodes_only_outside_masks():
    data = ring()
    data.y[2] = -1  # inside val_mask
    error(data, r"y has 1 unlabelled nodes \(label -1\) inside val_mask "
          r"\(first at node 2\); fix: remove them from the mask "
          r"\(data.val_mask &= data.y >= 0\) or label them")

    data.val_mask[2] = False
    report = validate_graph(data, num_classes=2, strict=True)
    assert report.num_unlabelled_nodes == 1
    assert report.num_val_nodes == 1


def test_float_targets():
    data = ring()
    data.y = torch.randn(6, 4)
    report = validate_graph(data, strict=True)
    assert report.num_classes is None
    data.y[5, 1] = float("nan")
    error(data, r"y contains NaN/inf targets on 1 nodes \(first at node 5\)")


WARNINGS = {
    "directed": (
        lambda d: setattr(d, "edge_index", d.edge_index[:, :6]),
        r"graph is directed \(6 edges lack a reverse\); METIS partitions the "
        r"symmetrized graph, message passing uses the edges as given "
        r"\(in-edges of each node\)"),
    "self_loops": (
        lambda d: setattr(d, "edge_index", torch.cat(
            [d.edge_index, torch.tensor([[1, 3], [1, 3]])], dim=1)),
        r"graph has 2 self-loops; kept as given, so results equal "
        r"single-process PyG; call torch_geometric.utils.remove_self_loops "
        r"first to drop them"),
    "duplicates": (
        lambda d: setattr(d, "edge_index", torch.cat(
            [d.edge_index, d.edge_index[:, :3]], dim=1)),
        r"graph has 3 duplicate edges; kept as given, so results equal "
        r"single-process PyG; call torch_geometric.utils.coalesce first to "
        r"drop them"),
    "isolated": (
        lambda d: setattr(d, "edge_index", d.edge_index[:, [0, 6]]),
        r"graph has 4 isolated nodes; they are assigned to partitions by "
        r"weight and receive no messages"),
    "overlap": (
        lambda d: d.test_mask.__setitem__(0, True),
        r"train_mask and test_mask overlap on 1 nodes"),
}


@pytest.mark.parametrize("name", list(WARNINGS))
def test_each_warning_once(name):
    modify, match = WARNINGS[name]
    data = ring()
    modify(data)
    with pytest.warns(GraphWarning, match=match):
        validate_graph(data)
    report, messages = graph_warnings(data)
    assert len(messages) == 1, messages
    assert report.warnings == messages


@pytest.mark.parametrize("name", list(WARNINGS))
def test_strict_turns_warnings_into_errors(name):
    modify, match = WARNINGS[name]
    data = ring()
    modify(data)
    with pytest.raises(GraphValidationError, match=match + r".*strict=True"):
        validate_graph(data, strict=True)


def test_report_counts_for_messy_graph():
    data = ring(8)
    # Node 7 isolated, one self-loop, one duplicate and one one-way edge.
    keep = (data.edge_index < 7).all(0)
    data.edge_index = torch.cat([
        data.edge_index[:, keep],
        torch.tensor([[2, 0, 0], [2, 1, 5]]),
    ], dim=1)
    report, messages = graph_warnings(data)
    assert len(messages) == 4
    assert report.num_self_loops == 1
    assert report.num_duplicate_edges == 1
    assert report.num_isolated_nodes == 1
    assert report.is_directed and report.num_edges_without_reverse == 1
    assert report.num_edges == int(keep.sum()) + 3


def test_directed_count_on_unsorted_larger_graph():
    gen = torch.Generator().manual_seed(0)
    n = 1000
    edge_index = torch.randint(0, n, (2, 5000), generator=gen)
    data = Data(x=torch.randn(n, 2), edge_index=edge_index,
                y=torch.zeros(n, dtype=torch.long),
                train_mask=torch.ones(n, dtype=torch.bool))
    key = edge_index[0] * n + edge_index[1]
    unique = set(key.tolist())
    expected = sum(1 for k in unique if (k % n) * n + k // n not in unique)
    report, _ = graph_warnings(data)
    assert report.num_edges_without_reverse == expected
    assert report.num_duplicate_edges == 5000 - len(unique)


@pytest.mark.parametrize("num_nodes, num_parts, match", [
    (10, 0, r"num_parts must be >= 1, got 0"),
    (10, -2, r"num_parts must be >= 1, got -2"),
    (4, 8, r"num_parts=8 exceeds num_nodes=4: every partition needs at "
     r"least one node; fix: use at most 4 partitions"),
    (0, 1, r"empty graph: num_nodes is 0"),
    (10, 2.0, r"num_parts must be an int, got float"),
    (10, True, r"num_parts must be an int, got bool"),
    ("10", 2, r"num_nodes must be an int, got str"),
])
def test_check_num_parts_errors(num_nodes, num_parts, match):
    with pytest.raises(GraphValidationError, match=match):
        check_num_parts(num_nodes, num_parts)


def test_check_num_parts_ok():
    assert check_num_parts(10, 10) == 10
    assert check_num_parts(np.int64(10), torch.tensor(3)) == 3
    assert type(check_num_parts(5, np.int32(1))) is int


# -- node counts: x is named when it is the odd one out ---------------------

def test_x_with_fewer_rows_than_y_and_masks_is_blamed_on_x():
    data = ring()
    data.x = data.x[:5]  # edge_index still refers to node 5
    error(data, r"data.x has 5 rows but data.y, data.train_mask, "
                r"data.val_mask and data.test_mask have 6 entries \(and "
                r"edge_index refers to node 5\): x, y, the masks and "
                r"edge_index must agree on the number of nodes, and x is the "
                r"odd one out; fix: give data.x one row per node \(6 rows\)")


def test_x_with_more_rows_than_y_and_masks_is_blamed_on_x():
    data = ring()
    data.x = torch.randn(7, 3)
    error(data, r"data.x has 7 rows but data.y, data.train_mask, "
                r"data.val_mask and data.test_mask have 6 entries: .*x is "
                r"the odd one out")


def test_x_rows_checked_before_other_x_problems():
    data = ring()
    data.x = torch.full((4, 3), float("nan"))
    data.num_nodes = 6
    error(data, r"data.x has 4 rows but data.y, data.train_mask, "
                r"data.val_mask and data.test_mask have 6 entries, and "
                r"data.num_nodes is 6")


def test_x_against_y_alone_needs_the_edges_as_witness():
    data = ring()
    del data.val_mask, data.test_mask
    data.train_mask = torch.tensor([0, 1])  # index form: its own error
    data.x = data.x[:5]
    error(data, r"data.x has 5 rows but data.y has 6 entries \(and "
                r"edge_index refers to node 5\)")


def test_odd_y_or_mask_is_still_blamed_on_itself():
    data = ring()
    data.y = data.y[:5]
    error(data, r"y must have one entry per node \(size\(0\) = 6\)")
    data = ring()
    data.val_mask = data.val_mask[:5]
    error(data, r"val_mask must have shape \[num_nodes\] = \[6\], got \(5,\)")
    data = ring()
    data.edge_index[1, 3] = 6
    error(data, r"edge_index has 1 edges with node indices outside \[0, 6\)")


# -- labels: an inferred num_classes with unused class ids ------------------

def test_stray_label_warns_when_num_classes_is_inferred():
    data = ring(8)
    data.y = torch.arange(8) % 7
    report, messages = graph_warnings(data)
    assert messages == [] and report.num_classes == 7
    assert report.label_range == (0, 6) and report.num_label_ids == 7
    assert report.num_classes_inferred

    data.y[5] = 99
    expected = (r"labels use 7 distinct class ids but the largest is 99, so "
                r"num_classes is inferred as 100 and ids 5, 7..98 have no "
                r"node; pass num_classes=... "
                r"\(FullGraphDataModule\(num_classes=...\)\) to check "
                r"labels against your model")
    with pytest.warns(GraphWarning, match=expected):
        report = validate_graph(data)
    assert report.num_classes == 100 and report.label_range == (0, 99)
    assert report.num_label_ids == 7
    assert report.warnings[-1].startswith("labels use 7")
    with pytest.raises(GraphValidationError,
                       match=expected + r".*strict=True"):
        validate_graph(data, strict=True)
    # With num_classes the stray label is an error; no warning is needed.
    error(data, r"y has 1 labels >= num_classes=7 \(first at node 5: 99\)",
          num_classes=7)
    report, messages = graph_warnings(data, num_classes=100)
    assert messages == [] and not report.num_classes_inferred


def test_unused_class_ids_listing_and_huge_labels():
    data = ring()
    data.y = torch.tensor([0, 2, 5, 5, 0, 2])
    with pytest.warns(GraphWarning,
                      match=r"labels use 3 distinct class ids but the "
                            r"largest is 5, .* ids 1, 3..4 have no node"):
        validate_graph(data)
    # A corrupted id: no bincount of 10**12 entries.
    data.y = torch.tensor([0, 1, 0, 1, 0, 10**12])
    with pytest.warns(GraphWarning,
                      match=r"inferred as 1000000000001 and ids "
                            r"2..999999999999 have no node"):
        assert validate_graph(data).num_classes == 10**12 + 1


def test_unlabelled_nodes_do_not_count_as_class_ids():
    data = ring()
    data.y[2] = -1
    data.val_mask[2] = False
    report, messages = graph_warnings(data)
    assert messages == [] and report.num_classes == 2
    assert report.label_range == (0, 1)


def test_bundled_graphs_do_not_warn_without_num_classes():
    from lightning_fullgraph.data import load_cora, synthetic_graph
    report = validate_graph(load_cora(), strict=True)
    assert report.num_classes == 7 and report.num_label_ids == 7
    for num_classes in (2, 5, 16):
        graph = synthetic_graph(500, num_classes=num_classes,
                                seed=num_classes)
        report = validate_graph(graph, strict=True)
        assert report.num_classes == num_classes


def _sparse_adjacencies():
    # What T.ToSparseTensor() gives: without torch-sparse (as here and in CI) a torch.sparse
    # CSR tensor; with it, a SparseTensor, stood in for by PyG's class of that name (an
    # isinstance check never calls its constructor, which needs torch-sparse).
    import torch_geometric.transforms as T
    from torch_geometric.typing import SparseTensor
    csr = T.ToSparseTensor()(ring())
    assert "edge_index" not in csr
    kept = T.ToSparseTensor(remove_edge_index=False)(ring())  # edge_index and adj_t
    stub = ring()
    del stub.edge_index
    stub.adj_t = SparseTensor.__new__(SparseTensor)
    return [(csr, "torch.sparse_csr"), (kept, "torch.sparse_csr"), (stub, "SparseTensor")]


@pytest.mark.parametrize("case", range(3))
def test_sparse_adjacency_is_refused_with_its_fix(case, tmp_path):
    # gcn2_cora.py's T.ToSparseTensor(): the documented SparseAdjacencyError, naming adj_t and
    # the fix, from the checks, the data module (at construction, on every rank: before any
    # collective) and partition_graph, never "edge_index must be a tensor of shape [2, E]".
    from lightning_fullgraph import FullGraphDataModule
    from lightning_fullgraph.engine import SparseAdjacencyError
    from lightning_fullgraph.partition import partition_graph
    data, what = _sparse_adjacencies()[case]
    pattern = (rf"data.adj_t is a sparse adjacency \(.*{what}.*T.ToSparseTensor\(\)\).*Fix: "
               r"drop T.ToSparseTensor\(\).*batch.edge_index.*to_edge_index\(data.adj_t\)"
               r"\[0\].flip\(0\); del data.adj_t")
    for call in (lambda: validate_graph(data), lambda: FullGraphDataModule(data),
                 lambda: partition_graph(data, 2, root=tmp_path, progress=False)):
        with pytest.raises(SparseAdjacencyError, match=pattern):
            call()
    assert not any(tmp_path.iterdir())  # nothing partitioned


def test_sparse_adjacency_fix_in_the_message_gives_back_the_edges():
    # The fix the message names, applied to what T.ToSparseTensor() made of a directed graph
    # (the transpose matters), restores its edges and passes the checks.
    import torch_geometric.transforms as T
    from torch_geometric.utils import coalesce, to_edge_index

    from lightning_fullgraph.engine import SparseAdjacencyError
    data = ring()
    data.edge_index = data.edge_index[:, :6]
    sparse = T.ToSparseTensor()(data.clone())
    with pytest.raises(SparseAdjacencyError) as info:
        validate_graph(sparse)
    fix = str(info.value).rsplit("rebuild the edges: ", 1)[1]
    exec(fix, {"torch_geometric": __import__("torch_geometric.utils"), "data": sparse})
    assert "adj_t" not in sparse
    assert torch.equal(coalesce(sparse.edge_index), coalesce(data.edge_index))
    validate_graph(sparse)
