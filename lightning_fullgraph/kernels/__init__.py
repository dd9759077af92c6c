"""Fast neighbour-aggregation kernels for PyG message passing (C++/OpenMP CPU, Triton GPU).

Quick start::

    import lightning_fullgraph.kernels as K

    K.use("auto")                 # every supported PyG layer now uses the kernels
    with K.use("torch"): ...      # temporarily the pure-PyTorch reference
    handle = K.accelerate(model)  # or wrap one model explicitly; handle.revert()
    out = K.aggregate(x, edge_index, edge_weight, "mean", num_dst)  # raw op
    K.set_locality("off")         # keep every graph's own node order (default "auto")
    K.set_static_inputs("off")    # aggregate every call, GCNConv in PyG's order (default
                                  # "auto": unchanged inputs' aggregations kept, see .kept)
    K.set_layer_order("pyg")      # every layer in PyG's order (default "auto": a narrowing
                                  # SAGEConv maps before it aggregates, see .sage_reorder)
    with K.use_huge_pages(): ...  # large CPU tensors in 2 MiB pages for the block (off by
                                  # default: it swaps torch's CPU allocator, see .huge_pages)

Set ``LIGHTNING_FULLGRAPH_NO_EXT=1`` to force the pure-PyTorch fallback.
"""
from .backend import BACKENDS, current, resolve, use
from .config import KernelConfig
from .csr import CSRGraph, build_csr, memo_info, clear_memos, get_csr, pool_info
from .functional import aggregate
from .kept import get_static_inputs, set_static_inputs
from .sage_reorder import get_layer_order, set_layer_order
from .huge_pages import (get_block_cache, get_huge_pages, huge_pages_info, set_block_cache,
                         set_huge_pages, use_huge_pages)
from .locality import NodeOrder, get_locality, locality_score, set_locality
from .pyg import AccelerationHandle, accelerate, is_accelerated, register_layer, registered_layers

__all__ = [
    "BACKENDS",
    "KernelConfig",
    "use",
    "current",
    "resolve",
    "aggregate",
    "accelerate",
    "AccelerationHandle",
    "is_accelerated",
    "register_layer",
    "registered_layers",
    "CSRGraph",
    "build_csr",
    "get_csr",
    "clear_memos",
    "memo_info",
    "pool_info",
    "set_locality",
    "set_static_inputs",
    "get_static_inputs",
    "set_layer_order",
    "get_layer_order",
    "get_locality",
    "locality_score",
    "NodeOrder",
    "use_huge_pages",
    "set_huge_pages",
    "get_huge_pages",
    "huge_pages_info",
    "set_block_cache",
    "get_block_cache",
    "cpp_available",
]


def cpp_available() -> bool:
    """Whether the C++ CPU kernels are compiled and loadable (builds them on first call)."""
    from . import cpp

    return cpp.is_available()
