"""The Cora citation graph, embedded in the package and loaded offline."""
from __future__ import annotations

import functools
import os.path as osp

from torch_geometric.data import Data

__all__ = ["CORA_RAW_DIR", "load_cora"]

#: Directory holding the unmodified Planetoid ``ind.cora.*`` files.
CORA_RAW_DIR: str = osp.join(osp.dirname(osp.abspath(__file__)), "cora", "raw")


@functools.lru_cache(maxsize=1)
def _read_cora() -> Data:
    # Imported lazily: ``torch_geometric.io`` pulls in fsspec and friends, and
    # most users of ``lightning_fullgraph.data`` never touch Cora.
    from torch_geometric.io import read_planetoid_data

    # ``read_planetoid_data`` is exactly what ``Planetoid.process`` calls for
    # the public split, so the result matches ``Planetoid(root, 'Cora')[0]``
    # without ``Planetoid``'s download/processed-cache logic, which would
    # write ``processed/`` files into the (possibly read-only) package.
    return read_planetoid_data(CORA_RAW_DIR, "cora")


def load_cora() -> Data:
    r"""Loads the Cora citation graph with the public Planetoid split from the
    files shipped inside the package (no download, nothing written to disk).

    The result equals
    :obj:`torch_geometric.datasets.Planetoid(root, "Cora")[0]`:
    2,708 nodes, 10,556 directed edges (undirected, coalesced, no self-loops),
    1,433 features, 7 classes and :obj:`train_mask` / :obj:`val_mask` /
    :obj:`test_mask` with 140 / 500 / 1,000 nodes. See
    :file:`lightning_fullgraph/data/cora/README.md` for attribution and the
    licence of the data files.

    Returns:
        torch_geometric.data.Data: A fresh copy on every call, so callers may
        modify it in place.
    """
    # The pickle files take a few seconds to parse; cache once and hand out
    # clones so in-place edits by one caller never leak into another.
    return _read_cora().clone()
