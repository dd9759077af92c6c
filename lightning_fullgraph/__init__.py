r"""lightning-fullgraph: partitioned full-graph GNN training for PyG under Lightning.

Importing the package registers ``Trainer(strategy="fullgraph")``.
"""
from .callbacks import CommunicationMonitor
from .data.datamodule import FullGraphDataModule
from .engine import FullGraphEngine, HaloExchange, UnsupportedLayerError
from .strategies import FullGraphStrategy

__version__ = "0.1.0"

__all__ = [
    "FullGraphStrategy", "FullGraphDataModule", "FullGraphEngine", "HaloExchange",
    "CommunicationMonitor", "UnsupportedLayerError", "__version__",
]
