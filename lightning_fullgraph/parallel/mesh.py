r"""The process groups of a 4-D grid (:class:`~.dims.FourDDims`) for one rank."""
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Dict, Optional, Union

import torch.distributed as dist

from .dims import AXES, FourDDims

__all__ = ["FourDMesh"]

#: Groups every rank gets: each axis alone, and the replica's whole 3-D grid.
GROUPS = {"dp": ("dp", ), "x": ("x", ), "y": ("y", ), "z": ("z", ), "grid": ("x", "y", "z")}


@dataclass
class FourDMesh:
    r"""This rank's groups along ``dp``, ``x``, ``y``, ``z`` and over its replica's ``grid``.

    Build it with :meth:`create` (collective: every rank calls it, in the same order).
    Without an initialized process group (one process) every group is :obj:`None` and the
    collectives of :mod:`.pmm` do nothing.

    Attributes:
        dims (FourDDims): The validated dims.
        rank (int): This process's global rank.
        groups (Dict[str, ProcessGroup]): By name (``"dp"``, ``"x"``, ``"y"``, ``"z"``,
            ``"grid"``).
    """

    dims: FourDDims
    rank: int = 0
    groups: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, dims: FourDDims, timeout: Union[None, float, timedelta] = None,
               backend: Optional[str] = None) -> "FourDMesh":
        initialized = dist.is_available() and dist.is_initialized()
        world = dist.get_world_size() if initialized else 1
        dims.validate(world)
        mesh = cls(dims, dist.get_rank() if initialized else 0,
                   {name: None for name in GROUPS})
        if not initialized or world == 1:
            return mesh
        kwargs: Dict[str, Any] = {}
        if isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=float(timeout))
        if timeout is not None:
            kwargs["timeout"] = timeout
        if backend is not None:
            kwargs["backend"] = backend
        for name, axes in GROUPS.items():
            for ranks in dims.group_ranks(*axes):  # every rank creates every group, in order
                group = dist.new_group(ranks=ranks, **kwargs)
                if mesh.rank in ranks:
                    mesh.groups[name] = group
        return mesh

    def coordinate(self, axis: str) -> int:
        r"""This rank's index along :obj:`axis`."""
        return self.dims.coordinates(self.rank)[axis]

    def size(self, axis: str) -> int:
        if axis not in AXES:
            raise KeyError(f"no parallel axis {axis!r}; known: {', '.join(AXES)}")
        return getattr(self.dims, axis)

    def group(self, name: str) -> Optional[Any]:
        if name not in self.groups:
            raise KeyError(f"no process group {name!r}; known: {', '.join(self.groups)}")
        return self.groups[name]
