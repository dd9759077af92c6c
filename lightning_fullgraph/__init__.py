r"""lightning-fullgraph: partitioned full-graph GNN training for PyG under Lightning.

The Lightning layer (``FullGraphStrategy``, ``FullGraphDataModule``,
``CommunicationMonitor``) is imported on first use, so code that only needs the
engine (:mod:`lightning_fullgraph.engine`, :mod:`lightning_fullgraph.partition`)
with plain ``torch.distributed`` does not load Lightning.  The strategy name
``"fullgraph"`` is registered with Lightning when the strategy module is imported:
accessing ``lightning_fullgraph.FullGraphStrategy`` (or importing
``lightning_fullgraph.strategies``) does it, and so does importing this package
after Lightning.
"""
import importlib
import sys

__version__ = "0.1.0"

_LAZY = {
    "FullGraphStrategy": "lightning_fullgraph.strategies",
    "FourDStrategy": "lightning_fullgraph.strategies",
    "SampledNodeDataModule": "lightning_fullgraph.data.sampled",
    "FullGraphDataModule": "lightning_fullgraph.data.datamodule",
    "CommunicationMonitor": "lightning_fullgraph.callbacks",
    "FullGraphEngine": "lightning_fullgraph.engine",
    "HaloExchange": "lightning_fullgraph.engine",
    "UnsupportedLayerError": "lightning_fullgraph.engine",
}

__all__ = list(_LAZY) + ["__version__"]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lightning_fullgraph' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


if "lightning.pytorch" in sys.modules:  # Lightning is in use: make strategy="fullgraph" work
    importlib.import_module("lightning_fullgraph.strategies")
