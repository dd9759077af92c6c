"""Backend selection: the global switch :func:`use` and per-device resolution.

Backends:

* ``"cpp"``    - C++/OpenMP CPU kernels (JIT-compiled; falls back to ``"torch"`` with one
  warning when they cannot be built).
* ``"triton"`` - Triton GPU kernels (CPU tensors only under ``TRITON_INTERPRET=1``).
* ``"torch"``  - pure-PyTorch reference with identical semantics.
* ``"auto"``   - per call: ``cpp`` for CPU tensors, ``triton`` for CUDA tensors when Triton
  is installed, else ``torch``. When the C++ kernels are unavailable and ``torch_scatter``
  is installed, ``auto`` keeps PyG's own path, which then runs on torch-scatter.
* ``None`` / ``"off"`` / ``"pyg"`` - disabled: PyG's path everywhere.
"""
from __future__ import annotations

import importlib.util
import threading
from typing import Optional

import torch

__all__ = ["BACKENDS", "use", "current", "resolve", "triton_installed", "torch_scatter_installed"]

BACKENDS = ("auto", "cpp", "triton", "torch")
_OFF = (None, "off", "pyg", "none")

_state = threading.local()
_global = {"backend": None}


def _normalize(backend: Optional[str]) -> Optional[str]:
    if backend in _OFF:
        return None
    if backend not in BACKENDS:
        raise ValueError(f"unknown aggregation backend {backend!r}; expected one of {BACKENDS} or None")
    return backend


def current() -> Optional[str]:
    """The active backend name, or ``None`` when the kernels are switched off."""
    return _global["backend"]


class use:
    """Select the aggregation backend for all supported PyG layers.

    Works as a plain call (``use("cpp")`` stays in effect) and as a context manager
    (``with use("cpp"): ...`` restores the previous backend on exit). While a backend is
    active, every registered ``MessagePassing`` layer (``GCNConv``, ``SAGEConv``, ...)
    gets its per-instance ``propagate`` wrapper installed at its first forward call;
    switching off reverts those wrappers. That first call runs the layer's own ``forward``
    with the kernels' ``propagate`` (and, for layers that normalize, the memoized
    ``gcn_norm``); fused forwards such as ``SAGEConv``'s take over from the second call.
    :func:`~lightning_fullgraph.kernels.accelerate` installs everything up front.

    Args:
        backend: ``"auto"``, ``"cpp"``, ``"triton"``, ``"torch"``, or ``None``/``"off"``.
    """

    def __init__(self, backend: Optional[str] = "auto"):
        self.backend = _normalize(backend)
        self.previous = _global["backend"]
        _set(self.backend)

    def __enter__(self) -> "use":
        return self

    def __exit__(self, *exc) -> None:
        _set(self.previous)

    def __repr__(self) -> str:
        return f"use({self.backend!r})"


def _set(backend: Optional[str]) -> None:
    _global["backend"] = backend
    from . import pyg  # local import: pyg imports this module

    pyg._on_backend_change(backend)


def triton_installed() -> bool:
    """Whether the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def torch_scatter_installed() -> bool:
    """Whether the optional ``torch_scatter`` package is installed."""
    return importlib.util.find_spec("torch_scatter") is not None


def resolve(backend: Optional[str], device: torch.device) -> Optional[str]:
    """Concrete backend for tensors on ``device``; ``None`` means "use PyG's path".

    Args:
        backend: Requested backend (``"auto"`` is resolved here).
        device: Device of the node features.
    """
    if backend is None:
        return None
    if backend != "auto":
        return backend
    if device.type == "cpu":
        from . import cpp

        if cpp.is_available():
            return "cpp"
        # torch-scatter's CPU segment kernels beat the gather-based fallback; PyG uses
        # them itself when installed, so leave PyG's path in charge.
        return None if torch_scatter_installed() else "torch"
    if device.type == "cuda" and triton_installed():
        return "triton"
    return None if torch_scatter_installed() else "torch"
