r"""Rows per exchange, per rank, channel and peer: the aggregation plans reduced to counts.

:class:`RankCounts` keeps, for one rank and every aggregation mode, how many rows the rank
sends to and receives from each peer on the post channel (source rows) and the pre channel
(partial aggregates) -- the ``send_counts``/``recv_counts`` of its
:class:`~lightning_fullgraph.partition.AggregationPlan` -- plus the sizes the memory estimate
needs (owned, halo and pre-slot rows, edges).  It is small and JSON-able, so the counts of
every rank of a large partition can be held at once (:func:`partition_counts` loads one rank
at a time).
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from ..partition.cover import MODES
from .record import JsonRecord

__all__ = ["RankCounts", "partition_counts"]

CHANNELS = ("post", "pre")


@dataclass
class RankCounts(JsonRecord):
    r"""Per-exchange row counts of one rank, for every aggregation mode it has a plan for.

    Args:
        rank (int): The rank.
        world_size (int): Ranks :math:`P`.
        send (Dict[str, List[int]]): ``"<mode>.<channel>"`` -> rows sent to each rank.
        recv (Dict[str, List[int]]): ``"<mode>.<channel>"`` -> rows received from each rank.
        num_owned (int): Owned nodes.
        num_in_edges (int): The partition's local edges (in-edges of owned nodes).
        num_halo (Dict[str, int]): Per mode, halo rows (post channel rows received).
        num_pre_slots (Dict[str, int]): Per mode, pre slots (pre channel rows sent).
        num_edges (Dict[str, int]): Per mode, edges the rank aggregates (kept in-edges plus
            its outgoing pre edges).
    """
    rank: int
    world_size: int
    send: Dict[str, List[int]] = field(default_factory=dict)
    recv: Dict[str, List[int]] = field(default_factory=dict)
    num_owned: int = 0
    num_in_edges: int = 0
    num_halo: Dict[str, int] = field(default_factory=dict)
    num_pre_slots: Dict[str, int] = field(default_factory=dict)
    num_edges: Dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_plans(cls, plans: Mapping[str, Any], rank: int, world_size: int,
                   num_in_edges: int = 0) -> "RankCounts":
        r"""Counts of a rank's :class:`~lightning_fullgraph.partition.AggregationPlan` objects.

        Args:
            plans (Mapping[str, AggregationPlan]): Mode -> plan (e.g. ``{m: e.plan for m, e in
                engine.exchanges.items()}``).
            rank (int): The rank.
            world_size (int): Ranks.
            num_in_edges (int): The partition's local edges.

        Returns:
            RankCounts
        """
        out = cls(rank=int(rank), world_size=int(world_size), num_in_edges=int(num_in_edges))
        for mode, plan in plans.items():
            for channel in CHANNELS:
                ch = getattr(plan, channel)
                out.send[f"{mode}.{channel}"] = [int(c) for c in ch.send_counts.tolist()]
                out.recv[f"{mode}.{channel}"] = [int(c) for c in ch.recv_counts.tolist()]
            out.num_owned = int(plan.num_owned)
            out.num_halo[mode] = int(plan.halo_ids.numel())
            out.num_pre_slots[mode] = int(plan.num_pre_slots)
            out.num_edges[mode] = int(plan.edge_index.size(1))
        return out

    @classmethod
    def from_partition(cls, partition: Any, modes: Sequence[str] = MODES) -> "RankCounts":
        r"""Counts of a :class:`~lightning_fullgraph.partition.LocalPartition` in :obj:`modes`.

        Args:
            partition (LocalPartition): One rank's partition.
            modes (Sequence[str]): Aggregation modes.

        Returns:
            RankCounts
        """
        return cls.from_plans({m: partition.plan(m) for m in modes}, partition.rank,
                              partition.num_parts, partition.num_local_edges)

    @classmethod
    def from_engine(cls, engine: Any) -> "RankCounts":
        r"""Counts of the plans a :class:`~lightning_fullgraph.engine.FullGraphEngine` uses.

        Args:
            engine (FullGraphEngine): The engine.

        Returns:
            RankCounts
        """
        part = engine.partition
        exchanges = getattr(engine, "exchanges", None) or {"post": engine.exchange}
        return cls.from_plans({m: ex.plan for m, ex in exchanges.items()}, part.rank,
                              part.num_parts, part.num_local_edges)

    @property
    def modes(self) -> Tuple[str, ...]:
        return tuple(self.num_halo)

    def rows(self, mode: str, channel: str, reverse: bool = False) -> Tuple[List[int], List[int]]:
        r"""Rows the rank sends to and receives from each peer in one exchange.

        Args:
            mode (str): Aggregation mode of the plan.
            channel (str): ``"post"``, ``"pre"`` or ``"both"`` (one buffer of both).
            reverse (bool): Rows flow against the channel (backward, slot degrees).

        Returns:
            Tuple[List[int], List[int]]: ``(sent per peer, received per peer)``.
        """
        if channel == "both":  # rows and partials in one buffer (engine/one_buffer.py)
            post, pre = self.rows(mode, "post", reverse), self.rows(mode, "pre", reverse)
            return ([a + b for a, b in zip(post[0], pre[0])],
                    [a + b for a, b in zip(post[1], pre[1])])
        name = f"{mode}.{channel}"
        if name not in self.send:
            raise KeyError(f"rank {self.rank} has no {mode!r} plan (modes: {list(self.modes)})")
        send, recv = self.send[name], self.recv[name]
        return (recv, send) if reverse else (send, recv)

    def rows_per_exchange(self, mode: str) -> int:
        r"""Rows the rank receives in one feature exchange of :obj:`mode` (both channels),
        as :attr:`PartitionStats.mode_matrix` counts them.

        Args:
            mode (str): Aggregation mode.

        Returns:
            int
        """
        return sum(self.recv[f"{mode}.post"]) + sum(self.recv[f"{mode}.pre"])


def partition_counts(partitions: Union[str, Path, Iterable[Any]], modes: Sequence[str] = MODES,
                     progress: Optional[Callable[[str], None]] = None) -> List[RankCounts]:
    r"""The :class:`RankCounts` of every rank of a partition.

    Args:
        partitions: A partition directory (written by
            :func:`~lightning_fullgraph.partition.partition_graph`; ranks are loaded one at a
            time), or all ranks' :class:`~lightning_fullgraph.partition.LocalPartition`.
        modes (Sequence[str]): Aggregation modes.
        progress (Callable[[str], None], optional): Called with a line per loaded rank.

    Returns:
        List[RankCounts]: Index == rank.
    """
    if isinstance(partitions, (str, Path)):
        from ..partition import load_partition, read_manifest
        num_parts = int(read_manifest(partitions)["num_parts"])
        out = []
        for rank in range(num_parts):
            part = load_partition(partitions, rank, num_parts=num_parts)
            out.append(RankCounts.from_partition(part, modes))
            if progress is not None:
                progress(f"rank {rank + 1}/{num_parts} plans")
            del part
        return out
    out = sorted((RankCounts.from_partition(p, modes) for p in partitions), key=lambda c: c.rank)
    if [c.rank for c in out] != list(range(len(out))):
        raise ValueError(f"need every rank's partition, got ranks {[c.rank for c in out]}")
    return out
