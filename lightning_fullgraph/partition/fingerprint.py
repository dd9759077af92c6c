"""Content fingerprints of graphs, used as cache keys and staleness checks."""
import hashlib
import json
from typing import Any, Dict

import torch
from torch import Tensor

__all__ = ["graph_fingerprint", "options_hash", "hash_tensor"]

# Attributes whose *content* is hashed (besides edge_index); for every other
# tensor only the name, shape and dtype enter the fingerprint, which keeps
# hashing cheap while still catching the usual "different dataset / split".
_CONTENT_KEYS = ("x", "y")


def hash_tensor(h: "hashlib._Hash", tensor: Tensor) -> None:
    r"""Feeds shape, dtype and raw bytes of :obj:`tensor` into hash :obj:`h`."""
    t = tensor.detach().cpu().contiguous()
    h.update(f"{tuple(t.shape)}|{t.dtype}|".encode())
    if t.numel() == 0:
        return
    # View the storage as bytes: works for every dtype (bool, bfloat16, ...)
    # and avoids a copy, so hashing runs at memory bandwidth.
    h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))


def graph_fingerprint(data) -> str:
    r"""Returns a sha256 fingerprint of a PyG graph.

    Covers :obj:`num_nodes`, the bytes of :obj:`edge_index`, name/shape/dtype of
    every attribute and the content of ``x``, ``y`` and every boolean mask.

    Args:
        data (torch_geometric.data.Data): The graph.

    Returns:
        str: 64 hex digits.
    """
    h = hashlib.sha256()
    h.update(b"lightning-fullgraph-graph-v1|")
    h.update(f"num_nodes={int(data.num_nodes)}|".encode())
    hash_tensor(h, data.edge_index)
    for key in sorted(k for k in data.keys() if k != "edge_index"):
        value = data[key]
        if isinstance(value, Tensor):
            h.update(f"{key}:{tuple(value.shape)}:{value.dtype}|".encode())
            if key in _CONTENT_KEYS or key.endswith("mask") or value.dtype == torch.bool:
                hash_tensor(h, value)
        elif isinstance(value, (int, float, str, bool)):
            h.update(f"{key}={value!r}|".encode())
    return h.hexdigest()


def options_hash(options: Dict[str, Any]) -> str:
    r"""Stable sha256 of a JSON-able options dict (key order does not matter)."""
    blob = json.dumps(options, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()

