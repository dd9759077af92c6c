"""Destination-sorted CSR (and its transpose) built once per graph and cached.

:class:`CSRGraph` holds everything the aggregation kernels need for forward and
backward. :func:`get_csr` converts an ``edge_index`` ``[2, E]`` (``edge_index[0]`` =
source, ``edge_index[1]`` = destination, PyG's ``source_to_target`` flow) and caches the
result. Layers such as ``GCNConv`` rebuild an equal ``edge_index`` every forward, so the
cache recognises equal *content*: identity/version first, then a shape + sampled-entries
fingerprint confirmed by :func:`torch.equal` - far cheaper than re-sorting 16M edges.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..memo import TensorMemo, signature
from .locality import NodeOrder, choose_order, get_locality

__all__ = ["CSRGraph", "SplitCSR", "build_csr", "build_split_csr", "get_csr", "get_split_csr",
           "clear_memos", "memo_info", "pool_info", "forget"]

_CACHE_SIZE = 4
_SAMPLES = 32


@dataclass(frozen=True, eq=False)
class CSRGraph:
    """CSR of the aggregation matrix ``A[dst, src]`` plus its transpose.

    Attributes:
        rowptr: ``[N_dst + 1]`` int64 row offsets (rows = destination nodes).
        col: ``[E]`` source node of each CSR edge (int32 when it fits, else int64).
        perm: ``[E]`` original edge id of each CSR position (dtype of ``col``), or ``None`` when the
            input was already destination-sorted (identity).
        t_rowptr: ``[N_src + 1]`` int64 offsets of the transpose (rows = sources).
        t_col: ``[E]`` destination node of each transposed edge.
        t_perm: ``[E]`` CSR position of each transposed edge (to permute weights; dtype of ``col``).
        order: ``None``, or the :class:`~.locality.NodeOrder` the structure is numbered in
            (graphs reordered for locality: rows of ``x`` go through ``order.src_perm``
            before the kernels, output rows back through ``order.inv``; the edges keep their
            input order, so ``perm`` still maps CSR positions to input edge ids).
        num_src: ``N_src``.
        num_dst: ``N_dst``.
    """

    rowptr: Tensor
    col: Tensor
    perm: Optional[Tensor]
    t_rowptr: Tensor
    t_col: Tensor
    t_perm: Tensor
    num_src: int
    num_dst: int
    order: Optional["NodeOrder"] = None

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    def permute_edge_values(self, values: Optional[Tensor], backend: str = "torch") -> Optional[Tensor]:
        """Reorder per-edge ``values`` ``[E]`` from input order to CSR order (differentiable;
        ``backend`` ``"cpp"`` gathers with the prefetching C++ kernel)."""
        if values is None or self.perm is None:
            return values
        from .ops import permute_values

        return permute_values(values, self.perm, backend)


def _index_dtype(n: int, e: int) -> torch.dtype:
    # int32 indices halve the index traffic of the gather; positions must fit as well.
    return torch.int32 if max(n, e) < 2**31 - 1 else torch.int64


def _offsets(index: Tensor, n: int) -> Tensor:
    rowptr = torch.zeros(n + 1, dtype=torch.long, device=index.device)
    if index.numel() > 0:
        torch.cumsum(torch.bincount(index, minlength=n), 0, out=rowptr[1:])
    return rowptr


def _stable_argsort(keys: Tensor, n: int) -> Tensor:
    # O(E) counting sort from the C++ extension on CPU; comparison argsort otherwise.
    if keys.device.type == "cpu" and keys.numel() > 0:
        from . import cpp

        mod = cpp.load()
        if mod is not None:
            return mod.counting_sort_perm(keys, n)
    return torch.argsort(keys, stable=True)


def _is_sorted(index: Tensor) -> bool:
    return index.numel() < 2 or bool((index[1:] >= index[:-1]).all())


def build_csr(edge_index: Tensor, num_src: int, num_dst: int, *, assume_sorted: bool = False) -> CSRGraph:
    """Build a :class:`CSRGraph` from ``edge_index`` (no caching).

    Args:
        edge_index: ``[2, E]`` integer tensor, row 0 sources in ``[0, num_src)``, row 1
            destinations in ``[0, num_dst)``.
        num_src: Number of source nodes ``N_src``.
        num_dst: Number of destination nodes ``N_dst`` (rectangular graphs allowed).
        assume_sorted: Skip the sortedness check (e.g. an ``EdgeIndex`` sorted by column).
    """
    src, dst = edge_index[0].long(), edge_index[1].long()
    e = src.numel()
    # Checked here in terms of edge_index (once per graph: cached). The ops validate the
    # resulting CSR again at their boundary (a hand-built CSRGraph bypasses this function).
    if e > 0:
        lo_s, hi_s = int(src.min()), int(src.max())
        lo_d, hi_d = int(dst.min()), int(dst.max())
        if lo_s < 0 or hi_s >= num_src:
            raise IndexError(f"edge_index sources must lie in [0, {num_src}); found [{lo_s}, {hi_s}]")
        if lo_d < 0 or hi_d >= num_dst:
            raise IndexError(f"edge_index destinations must lie in [0, {num_dst}); found [{lo_d}, {hi_d}]")
    if assume_sorted or _is_sorted(dst):
        perm = None  # already destination-clustered: no argsort needed
        col_sorted = src
    else:
        perm = _stable_argsort(dst, num_dst)
        col_sorted = src.index_select(0, perm)
        dst = dst.index_select(0, perm)
    idx_dtype = _index_dtype(max(num_src, num_dst), e)
    rowptr = _offsets(dst, num_dst)
    # Transpose: stable sort of CSR positions by source keeps per-row order deterministic.
    t_perm = _stable_argsort(col_sorted, num_src)
    t_col = dst.index_select(0, t_perm).to(idx_dtype)
    t_rowptr = _offsets(col_sorted, num_src)
    # The permutations only feed index_select, which takes int32: half their memory.
    if perm is not None:
        perm = perm.to(idx_dtype)
    return CSRGraph(rowptr, col_sorted.to(idx_dtype).contiguous(), perm, t_rowptr,
                    t_col.contiguous(), t_perm.to(idx_dtype), int(num_src), int(num_dst))


@dataclass(frozen=True, eq=False)
class SplitCSR:
    """A graph's edges split by source: owned sources ``[0, N_own)`` and halo sources
    (renumbered from 0), each as a :class:`CSRGraph` (see :mod:`.split`).

    Attributes:
        own: CSR of the edges with owned sources (``num_src = N_own``).
        halo: CSR of the edges with halo sources (``num_src = N_halo``).
        own_pos: ``[E_own]`` position in ``edge_index`` of every owned-source edge.
        halo_pos: ``[E_halo]`` position of every halo-source edge.
        in_degree: ``[num_dst]`` edges into every destination, both parts (a mean's divisor).
    """

    own: CSRGraph
    halo: CSRGraph
    own_pos: Tensor
    halo_pos: Tensor
    in_degree: Tensor


def build_split_csr(edge_index: Tensor, num_own: int, num_src: int, num_dst: int) -> SplitCSR:
    """Build a :class:`SplitCSR` (no caching); sources ``>= num_own`` are halo rows."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    is_own = src < num_own
    dtype = _index_dtype(max(num_src, num_dst), src.numel())
    own_pos = is_own.nonzero().flatten()
    halo_pos = (~is_own).nonzero().flatten()
    own = build_csr(torch.stack([src[own_pos], dst[own_pos]]), num_own, num_dst)
    halo = build_csr(torch.stack([src[halo_pos] - num_own, dst[halo_pos]]), num_src - num_own,
                     num_dst)
    in_degree = torch.bincount(dst, minlength=num_dst) if dst.numel() else \
        torch.zeros(num_dst, dtype=torch.long, device=dst.device)
    return SplitCSR(own, halo, own_pos.to(dtype), halo_pos.to(dtype), in_degree)


#: The built structures, keyed by the edge list's signature and what else they depend on.  The
#: memo holds each edge list (strongly: its storage cannot be reused meanwhile), so that an
#: equal list made anew in every call (gcn_norm's) is found by content and replaces it.
_memo = TensorMemo(_CACHE_SIZE, hold=True)
_lock = threading.Lock()


def _fingerprint(ei: Tensor) -> Tuple:
    e = ei.size(1)
    if e == 0:
        return (ei.device, 0)
    # Integer positions: a float32 linspace rounds e - 1 up to e beyond 2^24 edges (17M edges
    # indexed position 17,000,000).
    k = min(_SAMPLES, e)
    pos = torch.arange(k, device=ei.device) * (e - 1) // max(1, k - 1)
    return (ei.device, e, tuple(ei[:, pos].flatten().tolist()))


def _plain(edge_index: Tensor) -> Tensor:
    # EdgeIndex is a Tensor subclass; its metadata is irrelevant to the CSR content.
    if hasattr(edge_index, "as_tensor"):
        return edge_index.as_tensor()
    return edge_index


@torch.compiler.disable
def get_csr(edge_index: Tensor, num_src: int, num_dst: int) -> CSRGraph:
    """Cached :func:`build_csr`.

    Args:
        edge_index: ``[2, E]`` Tensor or ``torch_geometric.EdgeIndex``.
        num_src: ``N_src``.
        num_dst: ``N_dst``.

    Returns:
        The :class:`CSRGraph`; equal graphs share one instance.
    """
    assume_sorted = bool(getattr(edge_index, "is_sorted_by_col", False))
    mode = get_locality() if int(num_src) >= int(num_dst) else "off"
    return _cached(edge_index, ("csr", int(num_src), int(num_dst), mode),
                   lambda ei: _build_ordered(ei, num_src, num_dst, assume_sorted, mode))


def _build_ordered(ei: Tensor, num_src: int, num_dst: int, assume_sorted: bool, mode: str) -> CSRGraph:
    # The CSR in the graph's own ids, then (graphs whose locality an order improves, see
    # .locality) once more in that order.
    csr = build_csr(ei, num_src, num_dst, assume_sorted=assume_sorted)
    if mode == "off" or num_src < num_dst:
        return csr
    src, dst = ei[0].long(), ei[1].long()
    order = choose_order(src, dst, csr.rowptr, csr.col, csr.t_rowptr, csr.t_col, int(num_dst), mode,
                         num_src=int(num_src))
    if order is None:
        return csr
    relabeled = build_csr(torch.stack([order.src_inv[src], order.inv[dst]]), num_src, num_dst)
    return dataclasses.replace(relabeled, order=order)


@torch.compiler.disable
def get_split_csr(edge_index: Tensor, num_own: int, num_src: int, num_dst: int) -> SplitCSR:
    """Cached :func:`build_split_csr` (same cache as :func:`get_csr`)."""
    return _cached(edge_index, ("split", int(num_own), int(num_src), int(num_dst)),
                   lambda ei: build_split_csr(ei, num_own, num_src, num_dst))


def _owns_storage(t: Tensor) -> bool:
    # Not a view into a larger storage (keeping it would keep all of that alive).
    return t._base is None and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _cached(edge_index: Tensor, extra: Tuple, build):
    ei = _plain(edge_index)
    inference = ei.is_inference()  # no version counter to vouch for it: by content below
    with _lock:
        if not inference:  # identity fast path
            found = _memo.get((signature(ei), extra), (ei,), count=False)
            if found is not None:
                _memo.hits += 1
                return found
        fp = _fingerprint(ei)
        for key, csr, (old,), (fingerprint, old_extra) in _memo.items():
            if old_extra == extra and fingerprint == fp and _memo.matches(key, (old,)) and \
                    torch.equal(old, ei):
                if _owns_storage(ei) and not inference:
                    # Keep the newer copy: layers that rebuild an equal edge_index per call
                    # (gcn_norm) then hold one copy between calls, not the first and the newest.
                    _memo.pop(key)
                    _memo.put((signature(ei), extra), (ei,), csr, extra=(fp, extra))
                else:
                    _memo.touch(key)
                _memo.hits += 1
                return csr
    # Built as normal tensors even in inference mode (an evaluation under
    # torch.inference_mode() before training): later calls save them for backward, which inference tensors
    # refuse. An inference edge_index is kept as a private normal copy (it has no version
    # counter to reveal an in-place edit).
    with torch.inference_mode(False):
        built = build(ei)
        kept = ei.clone() if inference else ei
    with _lock:
        _memo.misses += 1
        _memo.put((signature(kept), extra), (kept,), built, extra=(fp, extra))
    return built


def clear_memos() -> None:
    """Drop the kernels' memos (CSR structures, ``GCNConv`` normalizations of :mod:`.gcn`,
    aggregations of :mod:`.kept`), the idle pooled output buffers and the huge-page
    allocator's free blocks, freeing their memory."""
    _memo.clear()
    from . import gcn, kept

    gcn.clear_memo()
    kept.clear()
    from . import cpp

    if cpp._module is not None:  # only if already loaded: never trigger a build here
        cpp._module.clear_pool()
        if hasattr(cpp._module, "huge_pages_trim"):
            cpp._module.huge_pages_trim(0)


def forget(edge_index: Tensor) -> int:
    """Drops the cached structures built for edge lists equal to :obj:`edge_index` (any
    kind), so that their memory goes now; returns how many were dropped.

    The ``GCNConv`` memo calls it when it keeps a destination-sorted copy of an edge list the
    kernels may already have met unsorted (a ``gcn_norm`` result aggregated outside the memo,
    e.g. by a layer of the user's own), so that the CSR of the unsorted list does not stay
    cached beside the sorted one's (405 MiB on 1M nodes / 16M edges)."""
    ei = _plain(edge_index)
    fp = _fingerprint(ei)
    with _lock:
        gone = [key for key, _, (old,), (fingerprint, _) in _memo.items()
                if fingerprint == fp and torch.equal(old, ei)]
        for key in gone:
            _memo.pop(key)
    return len(gone)


def memo_info() -> dict:
    """``{"hits", "misses", "size"}`` of the CSR memo."""
    return {"hits": _memo.hits, "misses": _memo.misses, "size": len(_memo)}


def pool_info() -> dict:
    """The C++ kernels' output pool (recycled buffers for outputs of at least 8 MiB):
    ``{"hits", "misses", "idle_bytes", "idle_buffers", "limit_bytes"}``; all zero when the
    extension is not loaded (never builds it) or has no pool.

    ``idle_bytes`` is memory no tensor uses, held for a later output of the same size. A size
    whose idle buffers were dropped unused more often than reused stops being kept;
    :func:`clear_memos` releases the idle buffers and forgets that history.
    """
    from . import cpp

    names = ("hits", "misses", "idle_bytes", "idle_buffers", "limit_bytes")
    ext = cpp._module
    stats = getattr(ext, "pool_stats", None)
    values = stats() if stats is not None else [0] * len(names)
    return dict(zip(names, (int(v) for v in values)))
