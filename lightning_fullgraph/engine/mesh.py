r"""Named process groups of the engine: a validated dims object and the groups it implies.

Full-graph training splits the graph over the ``graph`` dimension; a later strategy adds
replicas along ``data`` (and a 3-D grid for ScaleGNN).  Ranks are numbered ``graph``-major
inside each replica: replica ``i`` holds global ranks ``i * graph ... (i + 1) * graph - 1``,
which is how Lightning numbers the processes of consecutive nodes.

Every group is created with ``dist.new_group(timeout=...)``, so the engine's collectives carry
their own timeout, apart from the start-up timeout of the world group.
"""
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple, Union

import torch.distributed as dist

__all__ = ["ParallelDims", "EngineMesh"]


@dataclass(frozen=True)
class ParallelDims:
    r"""Sizes of the parallel dimensions; their product must be the world size.

    Args:
        graph (int): Processes that split one graph (partitions).
        data (int): Replicas of the partitioned graph (data parallel).
    """

    graph: int
    data: int = 1

    def __post_init__(self):
        for name in ("graph", "data"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ParallelDims.{name} must be a positive int, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.graph * self.data

    def validate(self, world_size: int) -> "ParallelDims":
        r"""Raises a clear error unless the dims multiply to :obj:`world_size`."""
        if self.world_size != world_size:
            raise ValueError(
                f"parallel dims graph={self.graph} x data={self.data} = {self.world_size} "
                f"processes, but the world has {world_size}; make their product equal the "
                "number of processes (devices x nodes)")
        return self

    def group_ranks(self, name: str) -> List[List[int]]:
        r"""The global ranks of every group along dimension :obj:`name`."""
        if name == "graph":
            return [list(range(i * self.graph, (i + 1) * self.graph)) for i in range(self.data)]
        if name == "data":
            return [list(range(j, self.world_size, self.graph)) for j in range(self.graph)]
        raise KeyError(f"no parallel dimension {name!r}; known: graph, data")

    def coordinates(self, rank: int) -> Dict[str, int]:
        r"""Position of global :obj:`rank` along each dimension."""
        return {"data": rank // self.graph, "graph": rank % self.graph}


@dataclass
class EngineMesh:
    r"""The process groups of one rank, by dimension name.

    Build it with :meth:`create` (collective: every rank must call it in the same order), or
    :meth:`from_group` around an existing group.

    Attributes:
        dims (ParallelDims): The validated dims.
        groups (Dict[str, ProcessGroup]): This rank's group along each dimension
            (:obj:`None` when the world is a single process).
        timeout (timedelta, optional): The collective timeout the groups were made with.
    """

    dims: ParallelDims
    groups: Dict[str, Any] = field(default_factory=dict)
    timeout: Optional[timedelta] = None

    @classmethod
    def create(cls, dims: Optional[ParallelDims] = None,
               timeout: Union[None, float, timedelta] = None,
               backend: Optional[str] = None) -> "EngineMesh":
        r"""Creates a group per dimension with the given collective timeout.

        Args:
            dims (ParallelDims, optional): Default: every process splits the graph.
            timeout (float or timedelta, optional): Collective timeout of the groups.
            backend (str, optional): Backend of the groups (default: the world's).
        """
        initialized = dist.is_available() and dist.is_initialized()
        world = dist.get_world_size() if initialized else 1
        dims = (dims or ParallelDims(graph=world)).validate(world)
        if isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=float(timeout))
        mesh = cls(dims, {}, timeout)
        if not initialized or world == 1:
            mesh.groups = {"graph": None, "data": None}
            return mesh
        rank = dist.get_rank()
        kwargs: Dict[str, Any] = {}
        if timeout is not None:
            kwargs["timeout"] = timeout
        if backend is not None:
            kwargs["backend"] = backend
        for name in ("graph", "data"):
            for ranks in dims.group_ranks(name):  # every rank creates every group, in order
                group = dist.new_group(ranks=ranks, **kwargs)
                if rank in ranks:
                    mesh.groups[name] = group
        return mesh

    @classmethod
    def from_group(cls, group: Optional[Any] = None,
                   timeout: Union[None, float, timedelta] = None) -> "EngineMesh":
        r"""Wraps an existing group as the ``graph`` dimension (no data parallelism)."""
        initialized = dist.is_available() and dist.is_initialized()
        world = dist.get_world_size(group) if initialized else 1
        if isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=float(timeout))
        return cls(ParallelDims(graph=world), {"graph": group, "data": None}, timeout)

    def group(self, name: str = "graph") -> Optional[Any]:
        r"""This rank's group along :obj:`name`."""
        if name not in self.groups:
            raise KeyError(f"no process group {name!r}; known: {sorted(self.groups)}")
        return self.groups[name]

    def rank(self, name: str = "graph") -> int:
        r"""This rank's index inside its :obj:`name` group."""
        if not (dist.is_available() and dist.is_initialized()):
            return 0
        return dist.get_rank(self.group(name))

    def size(self, name: str = "graph") -> int:
        return getattr(self.dims, name)

    def shape(self) -> Tuple[int, int]:
        return (self.dims.data, self.dims.graph)
