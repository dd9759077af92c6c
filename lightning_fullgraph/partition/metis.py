"""Graph partitioning with METIS (through :mod:`pymetis`).

METIS needs an undirected simple graph, so the (possibly directed) PyG graph is
symmetrized and stripped of self-loops and duplicate edges first. Node weights
model the per-rank work: message passing costs ~ (in-degree + 1) per node and
the loss only touches training nodes, so both have to be balanced. METIS
minimizes the communication volume by default (the halo rows exchanged), not
the edge cut: see :data:`OBJECTIVES`.
"""
import itertools
import math
import warnings
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .cover import post_rows
from .errors import EmptyPartitionError

__all__ = [
    "metis_partition",
    "node_weights_for",
    "combine_constraints",
    "symmetric_csr",
    "check_objective",
    "OBJECTIVES",
    "DEFAULT_OBJECTIVE",
]

# pymetis (checked with 2025.2) always calls METIS with ncon=1 and silently
# reads only the first ``num_nodes`` entries of ``vweights``: a vertex-major
# [N * ncon] weight array is *not* treated as multiple constraints. Its
# extension module does export the METIS C API though, so for ncon > 1 we call
# ``METIS_PartGraphKway`` directly through ctypes (real multi-constraint
# balancing: ~1.04 max/mean for both degree and training nodes on power-law
# graphs, versus ~1.2-1.4 for a folded single weight). If the symbol is not
# available we fall back to :func:`combine_constraints`.
_METIS_OK = 1
_METIS_NOPTIONS = 40
# What METIS minimizes (METIS_OPTION_OBJTYPE): "cut" the number of cut edges, "vol"
# the total communication volume, i.e. the number of (node, other part) pairs
# with an edge between them -- exactly the halo rows the post-aggregation mode
# sends. "vol" gives 3-10 % fewer post rows and 4-17 % fewer hybrid rows on Cora and
# the 1M-node synthetic graph at P = 2, 4, 8 (python -m benchmarks aggregation --partition-only),
# for a slower METIS (python -m benchmarks hosts prints its seconds per objective).
OBJECTIVES = {"cut": 0, "vol": 1}
DEFAULT_OBJECTIVE = "vol"


def _metis_kway_ctypes():
    r"""Returns ``(METIS_PartGraphKway, METIS_SetDefaultOptions, idx dtype)`` from
    pymetis' extension module, or :obj:`None` if unavailable."""
    try:
        import ctypes

        import pymetis

        from ..compat import pymetis_extension_path
        lib = ctypes.CDLL(pymetis_extension_path())
        kway, defaults = lib.METIS_PartGraphKway, lib.METIS_SetDefaultOptions
        dtype = pymetis.zero_copy_dtype()
    except (ImportError, OSError, AttributeError, ValueError):
        return None
    ptr = ctypes.POINTER(ctypes.c_int64 if dtype == np.int64 else ctypes.c_int32)
    # (nvtxs, ncon, xadj, adjncy, vwgt, vsize, adjwgt, nparts, tpwgts, ubvec,
    #  options, objval, part); real_t arrays are passed as NULL (METIS defaults).
    kway.argtypes = [ptr] * 8 + [ctypes.c_void_p] * 2 + [ptr] * 3
    kway.restype = ctypes.c_int
    defaults.argtypes = [ptr]
    defaults.restype = ctypes.c_int
    return kway, defaults, dtype, ptr


def _part_graph_multi(xadj: np.ndarray, adjncy: np.ndarray, vweights: np.ndarray,
                      num_parts: int, seed: int, ufactor: Optional[int],
                      objective: str = DEFAULT_OBJECTIVE) -> Optional[np.ndarray]:
    r"""Multi-constraint k-way METIS; :obj:`None` if the C API is unreachable.

    ``vweights`` may have one column: the C API is also how the objective reaches
    METIS, which :class:`pymetis.Options` does not expose."""
    api = _metis_kway_ctypes()
    if api is None:
        return None
    kway, defaults, dtype, ptr = api
    from ..compat import pymetis_option_indices
    options_indices = pymetis_option_indices()

    def arr(a):
        return np.ascontiguousarray(a, dtype=dtype)

    n, ncon = vweights.shape
    options = np.zeros(2 * _METIS_NOPTIONS, dtype=dtype)  # slack: NOPTIONS may grow
    defaults(options.ctypes.data_as(ptr))
    options[options_indices.SEED] = seed
    options[options_indices.OBJTYPE] = OBJECTIVES[objective]
    if ufactor is not None:
        options[options_indices.UFACTOR] = ufactor
    xadj, adjncy, vwgt = arr(xadj), arr(adjncy), arr(vweights.reshape(-1))
    nvtxs, ncon_, nparts = arr([n]), arr([ncon]), arr([num_parts])
    objval, part = np.zeros(1, dtype=dtype), np.zeros(n, dtype=dtype)
    p = [a.ctypes.data_as(ptr) for a in (nvtxs, ncon_, xadj, adjncy, vwgt)]
    status = kway(*p, None, None, nparts.ctypes.data_as(ptr), None, None,
                  options.ctypes.data_as(ptr), objval.ctypes.data_as(ptr),
                  part.ctypes.data_as(ptr))
    if status != _METIS_OK:
        raise RuntimeError(f"METIS_PartGraphKway failed with status {status} "
                           f"({n} nodes, {ncon} constraints, {num_parts} parts)")
    return part.astype(np.int64, copy=False)


def _check_num_parts(num_parts: int, num_nodes: int) -> None:
    if not isinstance(num_parts, (int, np.integer)) or isinstance(num_parts, bool):
        raise TypeError(f"num_parts must be an int (got {type(num_parts).__name__})")
    if num_parts < 1:
        raise ValueError(f"num_parts must be at least 1 (got {num_parts})")
    if num_parts > num_nodes:
        raise ValueError(
            f"cannot split {num_nodes} nodes into {num_parts} parts; use at most "
            f"{max(num_nodes, 1)} parts")


def _check_hosts(hosts: Optional[int], num_parts: int) -> int:
    r"""Validates :obj:`hosts` against :obj:`num_parts`; returns it as an int (1 for
    :obj:`None`)."""
    if hosts is None:
        return 1
    if not isinstance(hosts, (int, np.integer)) or isinstance(hosts, bool):
        raise TypeError(f"hosts must be an int (got {type(hosts).__name__})")
    hosts = int(hosts)
    if hosts < 1:
        raise ValueError(f"hosts must be at least 1 (got {hosts})")
    if num_parts % hosts:
        raise ValueError(
            f"num_parts={num_parts} is not a multiple of hosts={hosts}: host-aware "
            f"partitioning gives every host the same number of ranks (Lightning numbers "
            f"ranks host-major, devices per node x nodes)")
    return hosts


def check_objective(objective: str) -> str:
    r"""Validates a METIS objective name (``"vol"`` or ``"cut"``); returns it."""
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise ValueError(f"unknown METIS objective {objective!r}; use 'vol' (minimize the "
                         f"halo rows exchanged) or 'cut' (minimize the cut edges)")
    return objective


def symmetric_csr(edge_index: Tensor, num_nodes: int) -> Tuple[np.ndarray, np.ndarray]:
    r"""Builds the CSR adjacency of the symmetrized simple graph.

    Both directions of every edge are included, self-loops and duplicates are
    dropped, neighbours are sorted ascending.

    Args:
        edge_index (torch.Tensor): Edge indices, shape :math:`[2, E]`.
        num_nodes (int): Number of nodes :math:`N`.

    Returns:
        (numpy.ndarray, numpy.ndarray): ``xadj`` of shape :math:`[N + 1]` and
        ``adjncy`` of shape :math:`[2 E']` (int64, the METIS index width).
    """
    ei = edge_index.detach().cpu().to(torch.int64)
    src, dst = ei[0], ei[1]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    # One int64 key per directed pair; a sorted unique both dedups and orders by
    # (row, col), which is exactly CSR order. torch.unique (sort based) is used
    # because numpy>=2.3's hash-based np.unique is ~30x slower on 10^7 keys.
    keys = torch.cat([src * num_nodes + dst, dst * num_nodes + src])
    del src, dst, keep
    keys = torch.unique(keys, sorted=True)
    rows = torch.div(keys, num_nodes, rounding_mode="floor")
    adjncy = (keys - rows * num_nodes).numpy()
    del keys
    xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(torch.bincount(rows, minlength=num_nodes).numpy(), out=xadj[1:])
    return xadj, adjncy.astype(np.int64, copy=False)


def combine_constraints(weights: Tensor) -> Tensor:
    r"""Folds a multi-constraint weight matrix into one integer weight per node.

    Fallback for when METIS' multi-constraint API is unreachable: every column
    is rescaled so that its total equals the total of the first column, then
    the columns are summed. Balancing the sum keeps each
    constraint within roughly ``ncon`` times the METIS tolerance of its mean in
    practice (not guaranteed). Columns that are all zero are ignored.

    Args:
        weights (torch.Tensor): Non-negative weights, shape :math:`[N, C]`.

    Returns:
        torch.Tensor: Positive int64 weights, shape :math:`[N]`.
    """
    w = weights.detach().to(torch.float64).reshape(weights.size(0), -1)
    totals = w.sum(dim=0)
    target = float(totals[0]) if float(totals[0]) > 0 else float(w.size(0))
    scale = torch.where(totals > 0, target / totals.clamp(min=1e-300),
                        torch.zeros_like(totals))
    out = torch.round((w * scale).sum(dim=1)).to(torch.int64)
    return out.clamp_(min=1)  # METIS vertices need positive weight here


def node_weights_for(data, *, train_key: Optional[str] = "train_mask",
                     degree: bool = True) -> Tensor:
    r"""Default METIS node weights for a PyG graph.

    Column 0 is the compute cost ``in_degree + 1`` (one aggregation per in-edge
    plus the node update); column 1, present when :obj:`train_key` exists, is
    ``1`` for training nodes so that every rank gets a similar share of the
    loss.

    Args:
        data (torch_geometric.data.Data): The graph.
        train_key (str, optional): Name of the training mask, or :obj:`None`.
        degree (bool): Use ``in_degree + 1`` (:obj:`True`) or ``1``.

    Returns:
        torch.Tensor: int64 weights of shape :math:`[N, C]` with
        :math:`C \in \{1, 2\}`.
    """
    num_nodes = int(data.num_nodes)
    if degree:
        dst = data.edge_index[1].detach().cpu()
        compute = torch.bincount(dst, minlength=num_nodes) + 1
    else:
        compute = torch.ones(num_nodes, dtype=torch.long)
    cols = [compute.to(torch.long)]
    mask = getattr(data, train_key, None) if train_key else None
    if isinstance(mask, Tensor) and mask.dtype == torch.bool and mask.size(0) == num_nodes:
        cols.append(mask.reshape(num_nodes, -1).any(dim=1).to(torch.long))
    return torch.stack(cols, dim=1)


def metis_partition(edge_index: Tensor, num_nodes: int, num_parts: int, *,
                    node_weights: Optional[Tensor] = None, seed: int = 0,
                    ufactor: Optional[int] = None, hosts: Optional[int] = None,
                    objective: str = DEFAULT_OBJECTIVE) -> Tensor:
    r"""Assigns every node to one of :obj:`num_parts` parts with METIS k-way.

    Args:
        edge_index (torch.Tensor): Edge indices, shape :math:`[2, E]`; the
            graph may be directed and have self-loops or duplicate edges.
        num_nodes (int): Number of nodes :math:`N`.
        num_parts (int): Number of parts :math:`P` (``1 <= P <= N``).
        node_weights (torch.Tensor, optional): Node weights of shape
            :math:`[N]` or :math:`[N, C]` (one column per balance constraint,
            e.g. from :func:`node_weights_for`). Several columns are
            balanced simultaneously (METIS multi-constraint k-way); all-zero
            columns are ignored. (default: :obj:`None`, unit weights)
        seed (int): METIS random seed; equal inputs and seeds give equal parts.
        ufactor (int, optional): Allowed imbalance in 1/1000 (METIS default 30).
        hosts (int, optional): Number of hosts :math:`H` the parts run on. With
            :math:`1 < H < P` host :math:`h` gets parts
            :math:`h P/H, \dots, (h+1) P/H - 1`, the way Lightning numbers ranks
            across nodes, and of two candidates the one with fewer post rows
            crossing hosts is returned: METIS splitting the graph into :math:`H`
            host parts and then every host part into :math:`P / H`, or the flat
            :math:`P`-way partition with its parts grouped onto hosts (never more
            inter-host post rows than flat; METIS runs twice). :math:`P` must be
            a multiple of :math:`H`. (default: :obj:`None`, flat k-way)
        objective (str): What METIS minimizes: ``"vol"``, the total
            communication volume (the number of halo rows the post-aggregation
            exchange sends: every node counts once per other part it has an edge
            to), or ``"cut"``, the number of cut edges. (default: ``"vol"``)

    Returns:
        torch.Tensor: Part id per node, int64 of shape :math:`[N]`.

    Raises:
        ValueError: If :obj:`num_parts` is out of range, or not a multiple of
            :obj:`hosts`, or :obj:`objective` is unknown.
        EmptyPartitionError: If METIS leaves a part without nodes.
    """
    num_nodes = int(num_nodes)
    _check_num_parts(num_parts, num_nodes)
    num_parts = int(num_parts)
    hosts = _check_hosts(hosts, num_parts)
    objective = check_objective(objective)
    if 1 < hosts < num_parts:
        return _host_aware(edge_index, num_nodes, num_parts, hosts,
                           node_weights=node_weights, seed=seed, ufactor=ufactor,
                           objective=objective)
    return _flat(edge_index, num_nodes, num_parts, node_weights=node_weights, seed=seed,
                 ufactor=ufactor, objective=objective)


def _host_aware(edge_index: Tensor, num_nodes: int, num_parts: int, hosts: int, *,
                node_weights: Optional[Tensor], seed: int, ufactor: Optional[int],
                objective: str) -> Tensor:
    r"""The host-major partition with the fewest halo rows crossing hosts.

    Two candidates: (a) hosts first, then ranks inside every host
    (:func:`_hierarchical`); (b) the flat :math:`P`-way partition with its parts
    grouped onto hosts by :func:`_group_onto_hosts`. Neither always wins: (a)
    fixes the host split before it knows how each host is split into ranks, so
    a node with neighbours on both ranks of the other host costs two inter-host
    rows; with the ``"vol"`` objective the flat partition is often better
    already. Rows are the post-aggregation rows (one per node and remote rank),
    what METIS' volume objective counts; ties go to (b), which has fewer rows
    in total. Since (b) starts from the flat partition's own numbering, the
    result never sends more rows across hosts than the flat partition does.
    """
    try:
        flat = _flat(edge_index, num_nodes, num_parts, node_weights=node_weights, seed=seed,
                     ufactor=ufactor, objective=objective)
    except EmptyPartitionError:  # tiny graphs: (a) may still work, or name the rank
        flat = None
    tree = _hierarchical(edge_index, num_nodes, num_parts, hosts, node_weights=node_weights,
                         seed=seed, ufactor=ufactor, objective=objective)
    if flat is None:
        return tree
    grouped = _group_onto_hosts(edge_index, flat, num_parts, hosts)
    if _inter_host_rows(edge_index, tree, num_parts, hosts) \
            < _inter_host_rows(edge_index, grouped, num_parts, hosts):
        return tree
    return grouped


def _inter_host_rows(edge_index: Tensor, parts: Tensor, num_parts: int, hosts: int) -> int:
    host = torch.arange(num_parts) // (num_parts // hosts)
    rows = post_rows(edge_index, parts, num_parts)
    return int(rows[host.view(-1, 1) != host.view(1, -1)].sum())


def _group_onto_hosts(edge_index: Tensor, parts: Tensor, num_parts: int,
                      hosts: int) -> Tensor:
    r"""Renumbers the parts of a flat partition host-major (host ``h`` gets ranks
    ``h P/H ... (h+1) P/H - 1``) so that the fewest rows cross hosts.

    Every grouping of the parts into :math:`H` hosts of :math:`P/H` is tried when
    there are at most :data:`_MAX_GROUPINGS` of them (35 for 8 parts on 2
    hosts); beyond that, pairs of parts on different hosts are swapped from the
    identity grouping while a swap lowers the inter-host rows. Deterministic; the
    identity grouping wins ties, so the flat numbering is kept unless better.
    """
    per = num_parts // hosts
    rows = post_rows(edge_index, parts, num_parts)
    sym = (rows + rows.t()).tolist()  # rows both ways between parts i and j

    def intra(groups) -> int:
        return sum(sym[p][q] for g in groups for i, p in enumerate(g) for q in g[i + 1:])

    identity = [list(range(h * per, (h + 1) * per)) for h in range(hosts)]
    if _num_groupings(num_parts, hosts) <= _MAX_GROUPINGS:
        best, best_intra = identity, intra(identity)
        for groups in _groupings(list(range(num_parts)), per):
            value = intra(groups)
            if value > best_intra:
                best, best_intra = groups, value
    else:
        best = _swap_search(sym, identity)
    label = torch.empty(num_parts, dtype=torch.long)
    for h, members in enumerate(sorted(sorted(g) for g in best)):
        label[torch.tensor(members)] = h * per + torch.arange(per)
    return label[parts]


_MAX_GROUPINGS = 20_000


def _num_groupings(num_parts: int, hosts: int) -> int:
    per = num_parts // hosts
    return math.factorial(num_parts) // (math.factorial(per) ** hosts * math.factorial(hosts))


def _groupings(items: List[int], per: int):
    r"""Every split of :obj:`items` into unordered groups of :obj:`per`, the group
    of the smallest item first (identity grouping first)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for mates in itertools.combinations(rest, per - 1):
        left = [i for i in rest if i not in mates]
        for tail in _groupings(left, per):
            yield [[first, *mates], *tail]


def _swap_search(sym: List[List[int]], groups: List[List[int]]) -> List[List[int]]:
    r"""Best-improvement swaps of two parts on different hosts (a local optimum)."""
    host = {p: h for h, g in enumerate(groups) for p in g}
    num_parts = len(host)

    def toward(p: int, h: int) -> int:  # rows p exchanges with the other parts of host h
        return sum(sym[p][q] for q in range(num_parts) if host[q] == h and q != p)

    while True:
        best, swap = 0, None
        for a in range(num_parts):
            for b in range(a + 1, num_parts):
                ha, hb = host[a], host[b]
                if ha == hb:
                    continue
                # What a and b gain next to their new hosts minus what they lose at
                # their old ones (the a-b rows stay inter-host).
                gain = toward(a, hb) + toward(b, ha) - 2 * sym[a][b] \
                    - toward(a, ha) - toward(b, hb)
                if gain > best:
                    best, swap = gain, (a, b)
        if swap is None:
            break
        a, b = swap
        host[a], host[b] = host[b], host[a]
    return [[p for p in range(num_parts) if host[p] == h] for h in range(len(groups))]


def _hierarchical(edge_index: Tensor, num_nodes: int, num_parts: int, hosts: int, *,
                  node_weights: Optional[Tensor], seed: int,
                  ufactor: Optional[int], objective: str) -> Tensor:
    r"""Hosts first, then ranks inside every host (host-major numbering)."""
    host_of = _flat(edge_index, num_nodes, hosts, node_weights=node_weights, seed=seed,
                    ufactor=ufactor, objective=objective)
    per = num_parts // hosts
    ei = edge_index.detach().cpu().to(torch.long)
    parts = torch.empty(num_nodes, dtype=torch.long)
    local = torch.full((num_nodes,), -1, dtype=torch.long)
    hs, hd = host_of[ei[0]], host_of[ei[1]]
    for h in range(hosts):
        nodes = (host_of == h).nonzero().flatten()  # ascending ids
        if nodes.numel() < per:
            raise EmptyPartitionError(h * per + int(nodes.numel()), num_parts, num_nodes)
        local[nodes] = torch.arange(nodes.numel())
        keep = (hs == h) & (hd == h)
        sub_ei = local[ei[:, keep]]
        sub_w = None if node_weights is None else node_weights[nodes]
        try:
            sub = _flat(sub_ei, int(nodes.numel()), per, node_weights=sub_w, seed=seed,
                        ufactor=ufactor, objective=objective)
        except EmptyPartitionError as e:  # name the global rank
            raise EmptyPartitionError(h * per + e.part, num_parts, num_nodes) from None
        parts[nodes] = h * per + sub
        local[nodes] = -1
    sizes = torch.bincount(parts, minlength=num_parts)
    empty = (sizes == 0).nonzero().flatten()
    if empty.numel() > 0:
        raise EmptyPartitionError(int(empty[0]), num_parts, num_nodes)
    return parts


def _flat(edge_index: Tensor, num_nodes: int, num_parts: int, *,
          node_weights: Optional[Tensor], seed: int, ufactor: Optional[int],
          objective: str) -> Tensor:
    if num_parts == 1:  # nothing to decide; METIS itself misbehaves for P=1
        return torch.zeros(num_nodes, dtype=torch.long)

    import pymetis  # local import: only needed when actually partitioning

    from ..compat import require
    require("pymetis")  # its extension module is reached into below

    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E] (got {tuple(edge_index.shape)})")
    # Out-of-range ids would corrupt the CSR handed to C code: check up front.
    if edge_index.numel() > 0 and (int(edge_index.min()) < 0
                                   or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index contains node ids outside [0, {num_nodes})")
    xadj, adjncy = symmetric_csr(edge_index, num_nodes)
    w = None
    if node_weights is not None:
        w = node_weights.detach().cpu().to(torch.int64)
        if w.size(0) != num_nodes:
            raise ValueError(f"node_weights has {w.size(0)} rows but the graph has "
                             f"{num_nodes} nodes")
        if bool((w < 0).any()):
            raise ValueError("node_weights must be non-negative")
        w = w.reshape(num_nodes, -1)
        # A constraint without weight (e.g. no training nodes) cannot be
        # balanced and makes METIS divide by zero: drop it.
        w = w[:, w.sum(dim=0) > 0]
        if w.size(1) == 0:
            w = None
    membership = None
    if (w is not None and w.size(1) > 1) or objective != "cut":
        vw = np.ones((num_nodes, 1), dtype=np.int64) if w is None else w.numpy()
        membership = _part_graph_multi(xadj, adjncy, vw, num_parts, int(seed), ufactor,
                                       objective)
        if membership is None:
            if objective != "cut":
                warnings.warn(f"METIS objective {objective!r} needs the METIS C API of "
                              f"pymetis' extension module, which is not reachable here; "
                              f"partitioning with objective 'cut' instead", RuntimeWarning)
            if w is not None:
                w = combine_constraints(w).view(-1, 1)
    if membership is None:
        options = pymetis.Options(seed=int(seed))
        if ufactor is not None:
            options.ufactor = int(ufactor)
        # recursive=False: k-way gives lower cuts/halos for P > 2 (pymetis
        # defaults to recursive bisection for P <= 8).
        _, membership = pymetis.part_graph(
            num_parts, pymetis.CSRAdjacency(xadj, adjncy),
            vweights=None if w is None else w.view(-1).numpy(),
            options=options, recursive=False)
    parts = torch.from_numpy(np.asarray(membership, dtype=np.int64))
    sizes = torch.bincount(parts, minlength=num_parts)
    empty = (sizes == 0).nonzero().flatten()
    if empty.numel() > 0:
        raise EmptyPartitionError(int(empty[0]), num_parts, num_nodes)
    return parts
