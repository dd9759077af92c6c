"""Which PyG layers partitioned execution reproduces exactly, and which it refuses.

A ``MessagePassing`` layer is exact when everything it computes per target node
depends only on the target's own row, its in-edges and the rows of its sources:
the engine supplies halo source rows (and halo degrees for ``gcn_norm``).  Layers
listed in :data:`EXACT_LAYERS` are verified against single-process PyG in the
test-suite.  Other message-passing layers may well be exact too, but nothing has
checked them, so :func:`check_model` refuses them by name unless the user vouches
for them (``trusted_layers``).  Modules that normalize *across nodes* (PyG's
graph-mode LayerNorm, GraphNorm, PairNorm, ...) are never exact per rank.
"""
from typing import Iterable, List, Tuple, Type

import torch
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.nn import norm as pyg_norm
from torch_geometric.nn.conv import MessagePassing

__all__ = ["EXACT_LAYERS", "UnsupportedLayerError", "check_model"]

#: Layers verified exact under partitioned execution (see tests/engine).
EXACT_LAYERS: Tuple[Type[MessagePassing], ...] = (
    pyg_conv.GCNConv, pyg_conv.SAGEConv, pyg_conv.GATConv, pyg_conv.GATv2Conv,
    pyg_conv.GINConv, pyg_conv.GraphConv, pyg_conv.SGConv, pyg_conv.APPNP,
    pyg_conv.GCN2Conv, pyg_conv.TAGConv,
)

# Normalizations whose statistics span all nodes of the graph.
_CROSS_NODE_NORMS = tuple(
    getattr(pyg_norm, name) for name in (
        "GraphNorm", "PairNorm", "InstanceNorm", "MeanSubtractionNorm",
        "DiffGroupNorm", "GraphSizeNorm") if hasattr(pyg_norm, name))


class UnsupportedLayerError(TypeError):
    r"""A module of the model cannot be executed exactly on partitions."""


def check_model(model: torch.nn.Module,
                trusted_layers: Iterable[Type[torch.nn.Module]] = ()) -> List[Tuple[str, MessagePassing]]:
    r"""Validates a model for partitioned execution.

    Args:
        model (torch.nn.Module): The model (any nesting).
        trusted_layers (Iterable[type]): Extra ``MessagePassing`` classes the
            user declares exact (their output for a node depends only on its
            in-edges and the rows of its sources).

    Returns:
        ``(qualified name, layer)`` of every message-passing layer.

    Raises:
        UnsupportedLayerError: naming the first module that cannot be made exact.
    """
    trusted = EXACT_LAYERS + tuple(trusted_layers)
    layers = []
    for name, module in model.named_modules():
        where = f"'{name or type(model).__name__}' ({type(module).__name__})"
        if isinstance(module, pyg_norm.LayerNorm) and module.mode == "graph":
            raise UnsupportedLayerError(
                f"{where} normalizes over all nodes of the graph (mode='graph'); use "
                "mode='node' or torch.nn.LayerNorm for partitioned training")
        if _CROSS_NODE_NORMS and isinstance(module, _CROSS_NODE_NORMS):
            raise UnsupportedLayerError(
                f"{where} computes statistics across nodes, which partitioned "
                "training cannot reproduce; use BatchNorm1d (synchronized) instead")
        if isinstance(module, MessagePassing):
            if type(module) not in trusted:
                raise UnsupportedLayerError(
                    f"{where} is not verified exact under partitioned execution. "
                    f"Verified: {', '.join(c.__name__ for c in EXACT_LAYERS)}. If its "
                    "output for a node depends only on the node's in-edges and its "
                    "sources' rows, pass trusted_layers=[" + type(module).__name__ + "]")
            if module.flow != "source_to_target":
                raise UnsupportedLayerError(
                    f"{where} uses flow='{module.flow}'; ranks hold the in-edges of "
                    "their nodes, so only flow='source_to_target' is supported")
            if getattr(module, "decomposed_layers", 1) != 1:
                raise UnsupportedLayerError(f"{where} uses decomposed_layers > 1")
            layers.append((name, module))
    return layers
