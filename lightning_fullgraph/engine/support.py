"""Which PyG layers partitioned execution reproduces exactly, and which it refuses.

A ``MessagePassing`` layer is exact when everything it computes per target node
depends only on the target's own row, its in-edges and the rows of its sources:
the engine supplies halo source rows (and what needs the whole graph: halo degrees for
``gcn_norm``, source out-degrees and ``lambda_max`` for ``ChebConv``, out-edges for
``DirGNNConv``).  Layers listed in :data:`EXACT_LAYERS` are verified against
single-process PyG in the test-suite (``tests/engine/test_catalogue.py`` walks PyG's whole
conv catalogue; the table is in ``docs/layers.md``).  Layers in :data:`REFUSED_LAYERS`
cannot be made exact on partitions, each for the reason given there.  Other
message-passing layers (a newer PyG, the user's own) may well be exact too, but nothing has
checked them, so :func:`check_model` refuses them by name unless the user vouches for them
(``trusted_layers``).  PyG's normalizations across nodes (graph-mode LayerNorm, GraphNorm,
PairNorm, ...) are made exact by :mod:`.graphnorm` (statistics all-reduced); only
subclasses of them, whose forward is unknown, are refused.
"""
from typing import Dict, Iterable, List, Tuple, Type

import torch
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.nn import models as pyg_models
from torch_geometric.nn.conv import MessagePassing

from .graphnorm import unreproduced_norm

__all__ = ["EXACT_LAYERS", "REFUSED_LAYERS", "TRAINING_REFUSED_LAYERS",
           "UnsupportedLayerError", "check_model", "refusal"]

#: Layers verified exact under partitioned execution (tests/engine/test_catalogue.py).
EXACT_LAYERS: Tuple[Type[torch.nn.Module], ...] = tuple(getattr(pyg_conv, name) for name in (
    "SimpleConv", "GCNConv", "ChebConv", "SAGEConv", "GraphConv", "GatedGraphConv",
    "ResGatedGraphConv", "GATConv", "GATv2Conv", "TransformerConv", "AGNNConv", "TAGConv",
    "GINConv", "GINEConv", "ARMAConv", "SGConv", "SSGConv", "APPNP", "MFConv", "RGCNConv",
    "FastRGCNConv", "RGATConv", "SignedConv", "DNAConv", "PointNetConv", "GMMConv", "NNConv",
    "CGConv", "EdgeConv", "PPFConv", "FeaStConv", "PointTransformerConv", "LEConv", "PNAConv",
    "ClusterGCNConv", "GENConv", "GCN2Conv", "WLConvContinuous", "FiLMConv", "SuperGATConv",
    "FAConv", "EGConv", "PDNConv", "GeneralConv", "HEATConv", "LGConv", "PointGNNConv",
    "AntiSymmetricConv", "DirGNNConv", "MixHopConv") if hasattr(pyg_conv, name)) + (
    # Post-processing over the whole graph (tests/engine/test_models.py).
    pyg_models.LabelPropagation, )

_KNN = ("builds its graph from the node features by k-nearest neighbours over all nodes "
        "on every call, which no rank can do from its own rows")
_CUGRAPH = ("runs on cugraph-ops (CUDA only, package pylibcugraphops) with CSC graphs it "
            "builds itself; use {0} instead, which is verified exact")
_HETERO = ("operates on heterogeneous graphs (HeteroData dictionaries), which are not "
           "partitioned; convert with data.to_homogeneous() and use RGCNConv, RGATConv, "
           "FiLMConv or HEATConv with edge_type (verified exact)")

#: Layers that cannot be made exact on partitions, with the reason (by class name, so that
#: classes missing from an installed PyG are named too).
REFUSED_LAYERS: Dict[str, str] = {
    "MessagePassing": "is the abstract base class of PyG's layers, not a layer",
    "CuGraphSAGEConv": _CUGRAPH.format("SAGEConv"),
    "CuGraphGATConv": _CUGRAPH.format("GATConv"),
    "CuGraphRGCNConv": _CUGRAPH.format("RGCNConv"),
    "FusedGATConv": ("needs the dgNN package and CSR/CSC matrices of the whole graph "
                     "built before the call; use GATConv, which is verified exact"),
    "GravNetConv": _KNN,
    "DynamicEdgeConv": _KNN,
    "XConv": _KNN + " (and needs torch-cluster)",
    "SplineConv": ("needs the compiled torch-spline-conv package, which is not a dependency; "
                   "nothing verified it (GMMConv, NNConv or PDNConv take the same edge "
                   "pseudo-coordinates and are verified exact)"),
    "HypergraphConv": ("aggregates over hyperedges, whose members span ranks; partitions hold "
                       "the in-edges of nodes, not hyperedge incidences"),
    "PANConv": ("builds a path-integral matrix from powers of the whole adjacency "
                "(torch-sparse SparseTensor), not from a node's in-edges"),
    "WLConv": ("assigns colours through a hash table filled in call order: ranks would "
               "number the same neighbourhoods differently (and it is not differentiable)"),
    "HGTConv": _HETERO,
    "HANConv": _HETERO,
    "HeteroConv": _HETERO,
    "GPSConv": ("attends from every node to every other node of the graph (global "
                "attention), which would need all rows on every rank"),
    "MeshCNNConv": "convolves the edges of a triangle mesh, not the nodes of a graph",
}

#: Layers exact in inference but refused in training mode, with the reason.
TRAINING_REFUSED_LAYERS: Dict[str, str] = {
    "SuperGATConv": ("samples positive and negative edges for its self-supervised attention "
                     "loss in training mode, over nodes this rank does not hold; it is exact "
                     "in eval mode (inference), so train a GATConv instead or call "
                     "model.eval()"),
}


def refusal(module: torch.nn.Module) -> str:
    r"""Why :obj:`module` cannot run partitioned (empty if it can as far as is known)."""
    for cls in type(module).__mro__:
        reason = REFUSED_LAYERS.get(cls.__name__)
        if reason is not None and cls.__module__.startswith("torch_geometric") \
                and cls is not MessagePassing:
            return reason
    return ""


class UnsupportedLayerError(TypeError):
    r"""A module of the model cannot be executed exactly on partitions."""


def check_model(model: torch.nn.Module, trusted_layers: Iterable[Type[torch.nn.Module]] = ()
                ) -> List[Tuple[str, MessagePassing]]:
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
    vouched = tuple(trusted_layers)
    trusted = EXACT_LAYERS + vouched
    layers = []
    for name, module in model.named_modules():
        where = f"'{name or type(model).__name__}' ({type(module).__name__})"
        reason = unreproduced_norm(module)
        if reason is not None:
            raise UnsupportedLayerError(f"{where} {reason}")
        reason = refusal(module)
        if reason and type(module) not in vouched:
            raise UnsupportedLayerError(f"{where} {reason}")
        if isinstance(module, MessagePassing):
            if type(module) not in trusted:
                raise UnsupportedLayerError(
                    f"{where} is not verified exact under partitioned execution "
                    "(docs/layers.md lists the PyG layers that are). If its "
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
