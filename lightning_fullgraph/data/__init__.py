"""Graph data: the embedded Cora graph, a large synthetic generator, data set
specs and up-front validation of user graphs."""
from lightning_fullgraph.data.cora import load_cora
from lightning_fullgraph.data.datasets import load_dataset
from lightning_fullgraph.data.locality_order import LocalityOrder
from lightning_fullgraph.data.synthetic import synthetic_graph
from lightning_fullgraph.data.torus import torus_graph
from lightning_fullgraph.data.validation import (
    GraphReport,
    GraphValidationError,
    GraphWarning,
    check_no_sparse_adjacency,
    check_num_parts,
    validate_graph,
)

__all__ = [
    "load_cora",
    "synthetic_graph",
    "torus_graph",
    "LocalityOrder",
    "load_dataset",
    "validate_graph",
    "GraphReport",
    "GraphValidationError",
    "GraphWarning",
    "check_num_parts",
    "check_no_sparse_adjacency",
]
