"""lightning-fullgraph: partitioned full-graph GNN training for PyG and Lightning."""
__version__ = "0.1.0"
