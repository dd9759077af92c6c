"""FourDDims: validation, rank <-> coordinates, and the groups of every axis."""
import pytest

from lightning_fullgraph.parallel import AXES, FourDDims


def test_coordinates_round_trip_and_groups_partition_the_world():
    dims = FourDDims(dp=2, x=2, y=3, z=2)
    assert dims.world_size == 24 and dims.grid == (2, 3, 2)
    for rank in range(24):
        assert dims.rank_of(**dims.coordinates(rank)) == rank
    for axis in AXES:
        groups = dims.group_ranks(axis)
        assert sorted(r for g in groups for r in g) == list(range(24))
        assert all(len(g) == getattr(dims, axis) for g in groups)
        for g in groups:  # members differ only along the axis, ordered by it
            coords = [dims.coordinates(r) for r in g]
            assert [c[axis] for c in coords] == list(range(len(g)))
            assert all({k: v for k, v in c.items() if k != axis}
                       == {k: v for k, v in coords[0].items() if k != axis} for c in coords)


def test_replicas_are_consecutive_ranks():
    dims = FourDDims.of(dp=2, grid=(2, 1, 1))
    assert dims.group_ranks("dp") == [[0, 2], [1, 3]]
    assert dims.group_ranks("x") == [[0, 1], [2, 3]]
    assert dims.coordinates(3) == {"dp": 1, "x": 1, "y": 0, "z": 0}


def test_bad_dims_are_refused_clearly():
    with pytest.raises(ValueError, match="dp \\* x \\* y \\* z"):
        FourDDims(dp=2, x=2).validate(world_size=3)
    with pytest.raises(ValueError, match="positive int"):
        FourDDims(dp=0)
    with pytest.raises(ValueError, match="grid must be"):
        FourDDims.of(1, (2, 2))
    with pytest.raises(KeyError, match="known"):
        FourDDims().group_ranks("w")
