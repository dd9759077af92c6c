"""Quality numbers of a partition: balance, edge cut, communication volume
(per aggregation mode, and split into intra- and inter-host traffic)."""
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from torch import Tensor

from .cover import MODES, CutCover, cut_cover, post_rows

__all__ = ["PartitionStats", "partition_stats"]


def _imbalance(values: Sequence[int]) -> float:
    # max/mean: 1.0 is perfect; the slowest rank sets the step time.
    if len(values) == 0:
        return 1.0
    mean = sum(values) / len(values)
    return float(max(values) / mean) if mean > 0 else 1.0


@dataclass
class PartitionStats:
    r"""Summary of a partition.

    Args:
        num_parts (int): Number of parts :math:`P`.
        num_nodes (int): Global number of nodes.
        num_edges (int): Global number of edges.
        edge_cut (int): Edges whose endpoints lie on different parts.
        edge_cut_fraction (float): :obj:`edge_cut` / :obj:`num_edges`.
        owned (List[int]): Owned nodes per rank.
        halo (List[int]): Halo nodes per rank.
        edges (List[int]): Local edges (incoming to owned nodes) per rank.
        train (List[int]): Training nodes per rank (empty without a mask).
        node_imbalance (float): max/mean of :obj:`owned`.
        edge_imbalance (float): max/mean of :obj:`edges`.
        train_imbalance (float): max/mean of :obj:`train`.
        total_halo (int): Sum of :obj:`halo`; rows moved by *one* halo
            exchange (one message-passing layer, forward).
        comm_matrix (List[List[int]]): ``comm_matrix[r][s]`` rows rank
            :math:`r` receives from rank :math:`s` per exchange.
        mode_rows (Dict[str, int]): Rows moved by one exchange (all pairs) in
            every aggregation mode: ``"post"`` (= :obj:`total_halo`),
            ``"pre"`` and ``"hybrid"`` (minimum vertex cover per rank pair).
        mode_matrix (Dict[str, List[List[int]]]): Per mode, ``[r][s]`` rows
            rank :math:`r` receives from rank :math:`s` per exchange
            (``mode_matrix["post"] == comm_matrix``).
        hosts (int): Number of hosts :math:`H` the ranks are spread over
            (host of rank :math:`r` is ``r // (P // H)``, Lightning's
            numbering across nodes).
        intra_host_rows (Dict[str, int]): Per mode, rows exchanged between
            ranks of the same host.
        inter_host_rows (Dict[str, int]): Per mode, rows crossing hosts.
    """
    num_parts: int
    num_nodes: int
    num_edges: int
    edge_cut: int
    edge_cut_fraction: float
    owned: List[int]
    halo: List[int]
    edges: List[int]
    train: List[int] = field(default_factory=list)
    node_imbalance: float = 1.0
    edge_imbalance: float = 1.0
    train_imbalance: float = 1.0
    total_halo: int = 0
    comm_matrix: List[List[int]] = field(default_factory=list)
    mode_rows: Dict[str, int] = field(default_factory=dict)
    mode_matrix: Dict[str, List[List[int]]] = field(default_factory=dict)
    hosts: int = 1
    intra_host_rows: Dict[str, int] = field(default_factory=dict)
    inter_host_rows: Dict[str, int] = field(default_factory=dict)

    def host_rows(self, hosts: int) -> Dict[str, Dict[str, int]]:
        r"""Intra- and inter-host rows per exchange of every mode if the ranks
        were spread over :obj:`hosts` hosts (ranks numbered host-major).

        Returns:
            Dict[str, Dict[str, int]]: ``{"intra": {mode: rows}, "inter": {mode: rows}}``.
        """
        return _host_rows(self.mode_matrix, self.num_parts, hosts)

    def hybrid_gain(self) -> float:
        r"""Post-only rows over hybrid rows (how many times fewer rows the
        hybrid pre/post aggregation moves); ``1.0`` without cut edges."""
        post, hybrid = self.mode_rows.get("post", 0), self.mode_rows.get("hybrid", 0)
        return post / hybrid if hybrid else 1.0

    def comm_rows_per_epoch(self, num_layers: int = 1, backward: bool = True) -> int:
        r"""Halo rows moved per epoch (full-graph: one step per epoch).

        Every message-passing layer exchanges :obj:`total_halo` rows forward and,
        if :obj:`backward`, the same number of gradient rows back.
        """
        return self.total_halo * int(num_layers) * (2 if backward else 1)

    def comm_bytes_per_epoch(self, feature_dim: int, num_layers: int = 1,
                             bytes_per_value: int = 4, backward: bool = True) -> int:
        r"""Bytes moved per epoch for rows of width :obj:`feature_dim`."""
        return self.comm_rows_per_epoch(num_layers, backward) * feature_dim * bytes_per_value

    def to_dict(self) -> Dict[str, Any]:
        r"""JSON-able dict (for manifests and loggers)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, state: Dict[str, Any]) -> "PartitionStats":
        return cls(**state)

    def summary(self) -> Dict[str, float]:
        r"""Flat scalar metrics, e.g. for ``logger.log_metrics``."""
        return {
            "partition/num_parts": self.num_parts,
            "partition/edge_cut_fraction": self.edge_cut_fraction,
            "partition/node_imbalance": self.node_imbalance,
            "partition/edge_imbalance": self.edge_imbalance,
            "partition/train_imbalance": self.train_imbalance,
            "partition/total_halo": self.total_halo,
            **{f"partition/rows_{m}": v for m, v in self.mode_rows.items()},
        }

    def format_table(self) -> str:
        r"""Human-readable per-rank table plus totals."""
        has_train = len(self.train) == self.num_parts
        head = f"{'rank':>5} {'owned':>12} {'halo':>12} {'halo/own':>9} {'edges':>14}"
        head += f" {'train':>9}" if has_train else ""
        lines = [head, "-" * len(head)]
        for r in range(self.num_parts):
            own, halo = self.owned[r], self.halo[r]
            ratio = halo / own if own else float("nan")
            line = f"{r:>5} {own:>12,} {halo:>12,} {ratio:>9.2f} {self.edges[r]:>14,}"
            line += f" {self.train[r]:>9,}" if has_train else ""
            lines.append(line)
        lines.append("-" * len(head))
        lines.append(
            f"nodes {self.num_nodes:,}  edges {self.num_edges:,}  parts {self.num_parts}  "
            f"edge cut {self.edge_cut:,} ({100 * self.edge_cut_fraction:.1f}%)")
        imb = (f"imbalance max/mean: nodes {self.node_imbalance:.3f}  "
               f"edges {self.edge_imbalance:.3f}")
        if has_train:
            imb += f"  train {self.train_imbalance:.3f}"
        lines.append(imb)
        lines.append(f"halo rows per exchange {self.total_halo:,} "
                     f"({self.total_halo / max(self.num_nodes, 1):.2f} x nodes); "
                     f"per epoch fwd+bwd {self.comm_rows_per_epoch(1):,} rows/layer")
        if self.mode_rows:
            rows = self.mode_rows
            lines.append(f"rows per exchange by mode: post {rows.get('post', 0):,}  "
                         f"pre {rows.get('pre', 0):,}  hybrid {rows.get('hybrid', 0):,} "
                         f"({self.hybrid_gain():.2f}x fewer than post)")
        if self.hosts > 1 and self.inter_host_rows:
            per = self.num_parts // self.hosts
            lines.append(
                f"hosts {self.hosts} x {per} ranks: inter-host rows post "
                f"{self.inter_host_rows.get('post', 0):,} hybrid "
                f"{self.inter_host_rows.get('hybrid', 0):,}; intra-host post "
                f"{self.intra_host_rows.get('post', 0):,} hybrid "
                f"{self.intra_host_rows.get('hybrid', 0):,}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format_table()


def partition_stats(partitions_or_parts: Union[Sequence["LocalPartition"], Tensor],
                    edge_index: Optional[Tensor] = None, *,
                    train_mask: Optional[Tensor] = None,
                    num_parts: Optional[int] = None,
                    train_key: str = "train_mask",
                    cover: Optional[CutCover] = None,
                    hosts: Optional[int] = None) -> PartitionStats:
    r"""Computes :class:`PartitionStats`.

    Args:
        partitions_or_parts: Either all ranks' :class:`LocalPartition` objects,
            or a part id per node (shape :math:`[N]`) together with
            :obj:`edge_index`.
        edge_index (torch.Tensor, optional): Global edges, shape :math:`[2, E]`
            (only with a part vector).
        train_mask (torch.Tensor, optional): Global training mask (only with a
            part vector).
        num_parts (int, optional): Number of parts (only with a part vector;
            default ``parts.max() + 1``).
        train_key (str): Name of the training mask in ``node_attrs``.
        cover (CutCover, optional): Precomputed :func:`~.cover.cut_cover` of
            the part vector (only with a part vector; computed when
            :obj:`None`).
        hosts (int, optional): Number of hosts for the intra/inter-host split
            (a divisor of :math:`P`; default: the ``"hosts"`` option of the
            partitions, else 1).

    Returns:
        PartitionStats
    """
    if isinstance(partitions_or_parts, Tensor):
        if edge_index is None:
            raise ValueError("partition_stats(parts, edge_index) needs edge_index")
        return _stats_from_parts(partitions_or_parts, edge_index, train_mask, num_parts,
                                 cover, 1 if hosts is None else int(hosts))
    parts = sorted(partitions_or_parts, key=lambda p: p.rank)
    if not parts:
        raise ValueError("partition_stats needs at least one partition")
    P = parts[0].num_parts
    if [p.rank for p in parts] != list(range(P)):
        raise ValueError(f"partition_stats needs all {P} ranks, got ranks "
                         f"{[p.rank for p in parts]}")
    owned = [p.num_owned for p in parts]
    halo = [p.num_halo for p in parts]
    edges = [p.num_local_edges for p in parts]
    cut = sum(int((p.edge_index[0] >= p.num_owned).sum()) for p in parts)
    train = [int(p.node_attrs[train_key].reshape(p.num_owned, -1).any(1).sum())
             for p in parts if train_key in p.node_attrs]
    comm = [[int(c) for c in p.halo_counts] for p in parts]
    matrix = {}
    for m in MODES:
        plans = [p.plan(m) for p in parts]
        matrix[m] = [(pl.post.recv_counts + pl.pre.recv_counts).tolist() for pl in plans]
    if hosts is None:
        hosts = int(parts[0].options.get("hosts", 1) or 1)
    return _make(P, parts[0].num_nodes, parts[0].num_edges, cut, owned, halo, edges,
                 train, comm, matrix, int(hosts))


def _host_rows(matrix: Dict[str, List[List[int]]], P: int,
               hosts: int) -> Dict[str, Dict[str, int]]:
    hosts = int(hosts)
    if hosts < 1 or P % hosts:
        raise ValueError(f"hosts={hosts} must be a positive divisor of the number of "
                         f"parts {P}")
    host = torch.arange(P) // (P // hosts)
    same = host.view(-1, 1) == host.view(1, -1)
    out: Dict[str, Dict[str, int]] = {"intra": {}, "inter": {}}
    for m, rows in matrix.items():
        t = torch.tensor(rows, dtype=torch.long).view(P, P)
        out["intra"][m] = int(t[same].sum())
        out["inter"][m] = int(t[~same].sum())
    return out


def _stats_from_parts(parts: Tensor, edge_index: Tensor, train_mask: Optional[Tensor],
                      num_parts: Optional[int], cover: Optional[CutCover] = None,
                      hosts: int = 1) -> PartitionStats:
    parts = parts.detach().cpu().long()
    N = parts.numel()
    P = int(parts.max()) + 1 if num_parts is None else int(num_parts)
    src, dst = edge_index[0].cpu(), edge_index[1].cpu()
    ps, pd = parts[src], parts[dst]
    cut_mask = ps != pd
    owned = torch.bincount(parts, minlength=P).tolist()
    edges = torch.bincount(pd, minlength=P).tolist()
    # Halo of rank r = distinct (r, src) pairs over cut edges (receiver-major).
    comm = post_rows(edge_index, parts, P).t()
    halo = comm.sum(1).tolist()
    train: List[int] = []
    if train_mask is not None:
        m = train_mask.cpu().reshape(N, -1).any(1)
        train = torch.bincount(parts[m], minlength=P).tolist()
    if cover is None:
        cover = cut_cover(edge_index, parts, P)
    elif cover.num_parts != P:
        raise ValueError(f"cover was computed for {cover.num_parts} parts, not {P}")
    # cover.rows[m][s, d] = rows s sends to d; stats are receiver-major.
    matrix = {m: cover.rows[m].t().tolist() for m in MODES}
    return _make(P, N, int(src.numel()), int(cut_mask.sum()), owned, halo, edges,
                 train, comm.tolist(), matrix, hosts)


def _make(P, N, E, cut, owned, halo, edges, train, comm, matrix, hosts) -> PartitionStats:
    split = _host_rows(matrix, P, hosts)
    return PartitionStats(
        num_parts=P, num_nodes=N, num_edges=E, edge_cut=cut,
        edge_cut_fraction=cut / E if E else 0.0,
        owned=owned, halo=halo, edges=edges, train=train,
        node_imbalance=_imbalance(owned), edge_imbalance=_imbalance(edges),
        train_imbalance=_imbalance(train), total_halo=int(sum(halo)),
        comm_matrix=comm,
        mode_rows={m: int(sum(map(sum, rows))) for m, rows in matrix.items()},
        mode_matrix=matrix, hosts=int(hosts),
        intra_host_rows=split["intra"], inter_host_rows=split["inter"])
