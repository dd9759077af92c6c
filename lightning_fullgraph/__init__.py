r"""lightning-fullgraph: partitioned full-graph GNN training for PyG under Lightning.

The Lightning layer (``FullGraphStrategy``, ``FullGraphDataModule``,
``CommunicationMonitor``) is imported on first use, so code that only needs the
engine (:mod:`lightning_fullgraph.engine`, :mod:`lightning_fullgraph.partition`)
with plain ``torch.distributed`` does not load Lightning.  The strategy names
``"fullgraph"`` and ``"4d"`` are registered with Lightning once both this package and
``lightning.pytorch`` are imported, in either order: importing this package after Lightning
registers them at once; before it, they are registered right after ``lightning.pytorch``
finishes importing (a one-shot import hook that removes itself).  Lightning has no entry point
for strategies, so a script that never imports ``lightning_fullgraph`` cannot name them.
"""
import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

_LAZY = {
    "FullGraphStrategy": "lightning_fullgraph.strategies",
    "FourDStrategy": "lightning_fullgraph.strategies",
    "SampledNodeDataModule": "lightning_fullgraph.data.sampled",
    "ShardedNodeDataModule": "lightning_fullgraph.data.sampled",
    "FullGraphDataModule": "lightning_fullgraph.data.datamodule",
    "CommunicationMonitor": "lightning_fullgraph.callbacks",
    "FullGraphEngine": "lightning_fullgraph.engine",
    "ExchangeConfig": "lightning_fullgraph.engine",
    "KernelConfig": "lightning_fullgraph.kernels.config",
    "TimeoutConfig": "lightning_fullgraph.strategies.faults",
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


def _register_strategies() -> None:
    importlib.import_module("lightning_fullgraph.strategies")  # registers on import


class _AfterLightning(importlib.abc.MetaPathFinder):
    r"""Registers the strategies right after ``lightning.pytorch`` is imported, then leaves
    ``sys.meta_path``: the module is found by the other finders and executed unchanged."""

    def find_spec(self, name, path, target=None):
        if name != "lightning.pytorch":
            return None
        self.remove()
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _RegisteringLoader(spec.loader)
        return spec

    def remove(self) -> None:
        while self in sys.meta_path:
            sys.meta_path.remove(self)


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _register_strategies()

    def __getattr__(self, name):  # resources, source and code queries of the real loader
        return getattr(self.loader, name)


if "lightning.pytorch" in sys.modules:  # Lightning is in use: make strategy="fullgraph" work
    _register_strategies()
elif not any(isinstance(f, _AfterLightning) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterLightning())
