"""Which partitioned layer is executing right now.

Functions that PyG layers call from ``forward`` (``gcn_norm``) cannot see the
layer; a forward pre-hook pushes it here and a forward hook pops it, so those
functions find the halo exchange of the layer that called them.
"""
import threading
from dataclasses import dataclass, field
from typing import Any, List, Optional

__all__ = ["ActiveLayer", "current_layer", "push_layer", "pop_layer"]

_local = threading.local()


@dataclass
class ActiveLayer:
    r"""A partitioned layer during its forward call."""

    key: str
    exchange: Any
    calls: int = 0  # propagate/edge_update calls so far (one per hop in SGConv, APPNP)
    owner: Any = None  # the PartitionedModel
    state: Any = None  # its LayerState
    norm_calls: int = 0  # gcn_norm calls so far
    pending: List[Any] = field(default_factory=list)  # propagate calls awaiting their combine
    training: bool = True  # the layer's mode: decisions are kept apart for train and eval
    variant: str = ""  # marks calls of a rewritten forward (e.g. ".reordered") in point names
    input_width: Optional[int] = None  # values per row of the forward's first tensor argument


def _stack() -> List[ActiveLayer]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def current_layer() -> Optional[ActiveLayer]:
    stack = _stack()
    return stack[-1] if stack else None


def push_layer(layer: ActiveLayer) -> None:
    _stack().append(layer)


def pop_layer() -> None:
    stack = _stack()
    if stack:
        stack.pop()
