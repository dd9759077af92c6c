r"""The 4-D process grid of ScaleGNN: data parallel x a 3-D grid for the parallel matmuls.

A world of ``dp * x * y * z`` processes is split into ``dp`` replicas (each trains on its own
mini-batch; gradients are averaged over the ``dp`` axis), and each replica into an
``x * y * z`` grid over which a layer's sparse and dense products are split (ScaleGNN §IV-C).
Ranks are numbered ``dp``-major, then ``x``, ``y``, ``z`` (``z`` fastest), so a replica
occupies consecutive ranks, as Lightning numbers the processes of consecutive nodes.
"""
import math
from dataclasses import dataclass
from itertools import product
from typing import Dict, List, Optional, Tuple

__all__ = ["AXES", "FourDDims"]

#: Axis names, slowest first.
AXES = ("dp", "x", "y", "z")


@dataclass(frozen=True)
class FourDDims:
    r"""Sizes of the four parallel axes; their product must be the world size.

    Args:
        dp (int): Data-parallel replicas (each draws its own mini-batches).
        x (int): First axis of the 3-D grid.
        y (int): Second axis of the 3-D grid.
        z (int): Third axis of the 3-D grid.

    Example::

        dims = FourDDims(dp=2, x=2, y=1, z=1).validate(world_size=4)
        dims.coordinates(3)        # {'dp': 1, 'x': 1, 'y': 0, 'z': 0}
        dims.group_ranks("dp")     # [[0, 2], [1, 3]]
    """

    dp: int = 1
    x: int = 1
    y: int = 1
    z: int = 1

    def __post_init__(self):
        for name in AXES:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"FourDDims.{name} must be a positive int, got {value!r}")

    @classmethod
    def of(cls, dp: int = 1, grid: Tuple[int, int, int] = (1, 1, 1)) -> "FourDDims":
        r"""From a replica count and an ``(x, y, z)`` grid, as the strategy takes them."""
        grid = tuple(grid)
        if len(grid) != 3:
            raise ValueError(f"grid must be (x, y, z), got {grid!r}")
        return cls(dp, *grid)

    @classmethod
    def for_world(cls, world_size: int, grid: Tuple[int, int, int] = (1, 1, 1),
                  dp: Optional[int] = None) -> "FourDDims":
        r"""The dims of :obj:`world_size` processes: :obj:`dp` replicas (default: as many as
        fit) of :obj:`grid`; a clear error when they do not multiply to the world."""
        grid = tuple(grid)
        size = math.prod(grid)
        if dp is None and world_size % size:
            raise ValueError(f"the world of {world_size} processes is not a multiple of the "
                             f"grid {grid} ({size} processes per replica)")
        return cls.of(world_size // size if dp is None else dp, grid).validate(world_size)

    @property
    def grid(self) -> Tuple[int, int, int]:
        return (self.x, self.y, self.z)

    @property
    def grid_size(self) -> int:
        return self.x * self.y * self.z

    @property
    def world_size(self) -> int:
        return self.dp * self.grid_size

    def validate(self, world_size: int) -> "FourDDims":
        r"""Raises a clear error unless the axes multiply to :obj:`world_size`."""
        if self.world_size != world_size:
            raise ValueError(
                f"4-D dims dp={self.dp} x grid {self.x}x{self.y}x{self.z} = {self.world_size} "
                f"processes, but the world has {world_size}; make dp * x * y * z equal the "
                "number of processes (devices x nodes)")
        return self

    def _strides(self) -> Dict[str, int]:
        return {"z": 1, "y": self.z, "x": self.y * self.z, "dp": self.grid_size}

    def coordinates(self, rank: int) -> Dict[str, int]:
        r"""Position of global :obj:`rank` along every axis."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        strides = self._strides()
        return {name: (rank // strides[name]) % getattr(self, name) for name in AXES}

    def rank_of(self, **coords: int) -> int:
        r"""The global rank at the given coordinates (missing axes: 0)."""
        strides = self._strides()
        return sum(int(coords.get(name, 0)) * strides[name] for name in AXES)

    def group_ranks(self, *names: str) -> List[List[int]]:
        r"""The global ranks of every group spanning the axes :obj:`names` (ranks that differ
        only in those coordinates), each group in rank order; e.g. ``group_ranks("x")`` or,
        for a replica's whole grid, ``group_ranks("x", "y", "z")``."""
        if not names:
            raise ValueError("name at least one axis")
        for name in names:
            if name not in AXES:
                raise KeyError(f"no parallel axis {name!r}; known: {', '.join(AXES)}")
        others = [a for a in AXES if a not in names]
        groups = []
        for fixed in product(*(range(getattr(self, a)) for a in others)):
            coords = dict(zip(others, fixed))
            members = [self.rank_of(**coords, **dict(zip(names, inner)))
                       for inner in product(*(range(getattr(self, a)) for a in names))]
            groups.append(sorted(members))
        return groups
