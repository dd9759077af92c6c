"""``ParallelDims`` and ``EngineMesh``: named process groups of the engine."""
from datetime import timedelta

import pytest
import torch

from lightning_fullgraph.engine import EngineMesh, ParallelDims
from lightning_fullgraph.testing import run_distributed


@pytest.mark.parametrize("kwargs, message", [
    (dict(graph=0), "ParallelDims.graph must be a positive int, got 0"),
    (dict(graph=-2), "ParallelDims.graph must be a positive int, got -2"),
    (dict(graph=2.0), "ParallelDims.graph must be a positive int, got 2.0"),
    (dict(graph=True), "ParallelDims.graph must be a positive int, got True"),
    (dict(graph="2"), "ParallelDims.graph must be a positive int, got '2'"),
    (dict(graph=2, data=0), "ParallelDims.data must be a positive int, got 0"),
    (dict(graph=2, data=None), "ParallelDims.data must be a positive int, got None"),
])
def test_dims_validation_messages(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        ParallelDims(**kwargs)


def test_dims_against_the_world():
    dims = ParallelDims(graph=2, data=2)
    assert dims.world_size == 4 and ParallelDims(3).world_size == 3
    assert dims.validate(4) is dims
    with pytest.raises(ValueError) as info:
        dims.validate(6)
    text = str(info.value)
    assert "graph=2 x data=2 = 4 processes, but the world has 6" in text
    assert "devices x nodes" in text  # says what to change
    with pytest.raises(ValueError, match="graph=3 x data=1 = 3 processes, but the world has 1"):
        ParallelDims(graph=3).validate(1)
    with pytest.raises(Exception):
        dims.graph = 3  # frozen: validated once, never changed


def test_group_ranks_graph_major():
    dims = ParallelDims(graph=3, data=2)
    # Replica i holds ranks i*graph ... (i+1)*graph-1 (consecutive nodes under Lightning).
    assert dims.group_ranks("graph") == [[0, 1, 2], [3, 4, 5]]
    assert dims.group_ranks("data") == [[0, 3], [1, 4], [2, 5]]
    assert ParallelDims(4).group_ranks("graph") == [[0, 1, 2, 3]]
    assert ParallelDims(4).group_ranks("data") == [[0], [1], [2], [3]]
    assert ParallelDims(1, data=3).group_ranks("data") == [[0, 1, 2]]
    with pytest.raises(KeyError, match="no parallel dimension 'tensor'; known: graph, data"):
        dims.group_ranks("tensor")
    # Every rank is in exactly one group of each dimension.
    for name in ("graph", "data"):
        flat = sorted(r for g in dims.group_ranks(name) for r in g)
        assert flat == list(range(dims.world_size))


def test_coordinates():
    dims = ParallelDims(graph=3, data=2)
    coords = [dims.coordinates(r) for r in range(6)]
    assert coords == [{"data": 0, "graph": 0}, {"data": 0, "graph": 1}, {"data": 0, "graph": 2},
                      {"data": 1, "graph": 0}, {"data": 1, "graph": 1}, {"data": 1, "graph": 2}]
    for r, c in enumerate(coords):  # the coordinates index the groups
        assert dims.group_ranks("graph")[c["data"]][c["graph"]] == r
        assert dims.group_ranks("data")[c["graph"]][c["data"]] == r


def test_mesh_without_a_process_group():
    import torch.distributed as dist
    assert not dist.is_initialized()
    mesh = EngineMesh.create(timeout=7)
    assert mesh.dims == ParallelDims(1)
    assert mesh.groups == {"graph": None, "data": None}
    assert mesh.timeout == timedelta(seconds=7)
    assert mesh.rank("graph") == mesh.rank("data") == 0
    assert mesh.size("graph") == 1 and mesh.shape() == (1, 1)
    with pytest.raises(KeyError, match=r"no process group 'tensor'; known: \['data', 'graph'\]"):
        mesh.group("tensor")
    with pytest.raises(ValueError, match="but the world has 1"):
        EngineMesh.create(ParallelDims(graph=2))
    wrapped = EngineMesh.from_group(None, timeout=timedelta(seconds=3))
    assert wrapped.dims == ParallelDims(1) and wrapped.group() is None
    assert wrapped.timeout == timedelta(seconds=3)


def _mesh(rank, world_size):
    import torch.distributed as dist
    mesh = EngineMesh.create(ParallelDims(graph=2, data=2), timeout=30)
    out = dict(timeout=mesh.timeout.total_seconds(), shape=list(mesh.shape()),
               sizes=[mesh.size("graph"), mesh.size("data")],
               coords=ParallelDims(2, 2).coordinates(rank))
    for name in ("graph", "data"):
        group = mesh.group(name)
        t = torch.tensor([2 ** rank])  # the sum names exactly the ranks that took part
        dist.all_reduce(t, group=group)
        out[name] = dict(ranks=dist.get_process_group_ranks(group), rank=mesh.rank(name),
                         size=dist.get_world_size(group), mask=int(t))
    # The world still works beside the mesh's groups, and so does a mesh around a group.
    t = torch.tensor([2 ** rank])
    dist.all_reduce(t)
    out["world_mask"] = int(t)
    wrapped = EngineMesh.from_group(mesh.group("graph"), timeout=5)
    out["wrapped"] = dict(graph=wrapped.dims.graph, data=wrapped.dims.data,
                          rank=wrapped.rank(), same=wrapped.group() is mesh.group("graph"))
    # Dims that do not fit the world are refused before any group is made.
    try:
        EngineMesh.create(ParallelDims(graph=3))
        out["bad"] = None
    except ValueError as e:
        out["bad"] = str(e)
    return out


@pytest.mark.multiprocess
def test_engine_mesh_over_gloo():
    results = run_distributed(_mesh, 4, timeout_s=90)
    graph = [[0, 1], [2, 3]]
    data = [[0, 2], [1, 3]]
    for rank, r in enumerate(results):
        g = graph[rank // 2]
        d = data[rank % 2]
        assert r["graph"]["ranks"] == g and r["data"]["ranks"] == d
        assert r["graph"]["mask"] == sum(2 ** q for q in g)
        assert r["data"]["mask"] == sum(2 ** q for q in d)
        assert r["graph"]["rank"] == g.index(rank) == r["coords"]["graph"]
        assert r["data"]["rank"] == d.index(rank) == r["coords"]["data"]
        assert r["graph"]["size"] == r["data"]["size"] == 2
        assert r["timeout"] == 30.0
        assert r["shape"] == [2, 2] and r["sizes"] == [2, 2]
        assert r["world_mask"] == 0b1111
        assert r["wrapped"] == dict(graph=2, data=1, rank=g.index(rank), same=True)
        assert "graph=3 x data=1 = 3 processes, but the world has 4" in r["bad"]
