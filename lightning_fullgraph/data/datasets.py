"""Resolves data set names and specs such as ``"synthetic:nodes=1e6"``."""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple, Union

from torch_geometric.data import Data

from lightning_fullgraph.data.cora import load_cora
from lightning_fullgraph.data.synthetic import synthetic_graph

__all__ = ["KNOWN_DATASETS", "SYNTHETIC_KEYS", "load_dataset", "normalizes_features"]


def _int(value: str) -> int:
    # Accept "2000000", "2_000_000" and "2e6", but not "2.5".
    try:
        return int(value)
    except ValueError:
        number = float(value)
        if not number.is_integer():
            raise
        return int(number)


def _optional_float(value: str) -> Any:
    return None if value.lower() == "none" else float(value)


#: Spec key -> (synthetic_graph argument, parser).
SYNTHETIC_KEYS: Dict[str, Tuple[str, Callable[[str], Any]]] = {
    "nodes": ("num_nodes", _int),
    "degree": ("avg_degree", float),
    "features": ("num_features", _int),
    "classes": ("num_classes", _int),
    "communities": ("num_communities", _int),
    "exponent": ("power_law_exponent", _optional_float),
    "homophily": ("homophily", float),
    "noise": ("feature_noise", float),
    "train": ("train_ratio", float),
    "val": ("val_ratio", float),
    "seed": ("seed", _int),
}
# The full argument names work too, e.g. "avg_degree=5".
_ALIASES = {arg: key for key, (arg, _) in SYNTHETIC_KEYS.items()}

#: Names accepted by :func:`load_dataset` (before any ``:options``).
KNOWN_DATASETS = ("cora", "synthetic")
#: Data sets whose features :func:`load_dataset` row-normalizes by default: the Planetoid
#: citation graphs, as PyG's own examples load them (``Planetoid(..., transform=
#: T.NormalizeFeatures())`` in ``examples/gcn.py``, ``gat.py``, ...) and as Kipf & Welling
#: trained GCN on them.
PLANETOID_DATASETS = ("cora",)


def _name(name_or_spec: str) -> str:
    return name_or_spec.strip().partition(":")[0].strip().lower()


def normalizes_features(name_or_spec: str,
                        normalize_features: Union[bool, str] = "auto") -> bool:
    r"""Whether :func:`load_dataset` row-normalizes the features of :obj:`name_or_spec`.

    Args:
        name_or_spec (str): Data set name or spec.
        normalize_features (bool or str): ``"auto"`` (yes for the Planetoid graphs, e.g.
            ``"cora"``; no for ``"synthetic:..."``), :obj:`True` or :obj:`False`.
    """
    if normalize_features not in ("auto", True, False):
        raise ValueError(f"normalize_features must be 'auto', True or False, got "
                         f"{normalize_features!r}")
    if normalize_features == "auto":
        return _name(name_or_spec) in PLANETOID_DATASETS
    return bool(normalize_features)


def _parse_synthetic(options: str, spec: str) -> Dict[str, Any]:
    kwargs: Dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in options.split(","))):
        key, sep, value = (s.strip() for s in item.partition("="))
        key = _ALIASES.get(key, key)
        if not sep or key not in SYNTHETIC_KEYS:
            raise ValueError(
                f"invalid option {item!r} in dataset spec {spec!r}; expected "
                f"key=value with key in {sorted(SYNTHETIC_KEYS)}")
        arg, parse = SYNTHETIC_KEYS[key]
        try:
            kwargs[arg] = parse(value)
        except ValueError:
            raise ValueError(
                f"invalid value {value!r} for {key!r} in dataset spec "
                f"{spec!r}; expected {parse.__name__.strip('_')}") from None
    if "num_nodes" not in kwargs:
        raise ValueError(
            f"dataset spec {spec!r} needs the number of nodes, e.g. "
            f"'synthetic:nodes=100000,degree=10,seed=0'")
    return kwargs


def load_dataset(name_or_spec: str, normalize_features: Union[bool, str] = "auto") -> Data:
    r"""Loads a data set by name or generates one from a spec string.

    * ``"cora"``: the embedded Cora graph (:func:`load_cora`) with row-normalized features
      (see :obj:`normalize_features`).
    * ``"synthetic:key=value,..."``: :func:`synthetic_graph` with keys
      ``nodes`` (required; ``num_nodes``), ``degree`` (``avg_degree``),
      ``features`` (``num_features``), ``classes`` (``num_classes``),
      ``communities`` (``num_communities``), ``exponent``
      (``power_law_exponent``; ``none`` for no degree skew), ``homophily``,
      ``noise`` (``feature_noise``), ``train`` (``train_ratio``), ``val``
      (``val_ratio``) and ``seed``. The argument names in parentheses are
      accepted as keys too, and integers may be written as ``2e6``, e.g.
      ``"synthetic:nodes=2e6,degree=10,seed=0"``.

    Names are case-insensitive.

    Every entry point that takes a data set by name (``lightning-fullgraph train``,
    ``partition`` and ``plan``, :class:`~lightning_fullgraph.FullGraphDataModule`, the Fabric
    helpers) loads it here, so they all train on the same features and share cached
    partitions.

    Args:
        name_or_spec (str): Data set name or spec.
        normalize_features (bool or str): Row-normalize the node features
            (:class:`torch_geometric.transforms.NormalizeFeatures`). ``"auto"`` (default):
            for the Planetoid graph ``"cora"``, as PyG's Planetoid examples and Kipf &
            Welling's GCN do (``load_cora()`` is the raw data,
            ``Planetoid(root, "Cora")[0]``); not for synthetic graphs, whose features are
            Gaussian. :obj:`True` or :obj:`False` decide for any data set.

    Returns:
        torch_geometric.data.Data: The graph, with :obj:`train_mask`,
        :obj:`val_mask` and :obj:`test_mask`.
    """
    if not isinstance(name_or_spec, str):
        raise TypeError(f"dataset must be a str, got "
                        f"{type(name_or_spec).__name__}")
    normalize = normalizes_features(name_or_spec, normalize_features)
    name, _, options = name_or_spec.strip().partition(":")
    name = name.strip().lower()
    if name == "cora":
        if options.strip():
            raise ValueError(f"dataset 'cora' takes no options, got "
                             f"{name_or_spec!r}")
        data = load_cora()
    elif name == "synthetic":
        data = synthetic_graph(**_parse_synthetic(options, name_or_spec))
    else:
        raise _unknown(name_or_spec)
    if normalize:
        import torch_geometric.transforms as T
        data = T.NormalizeFeatures()(data)
    return data


def _unknown(name_or_spec: str) -> ValueError:
    return ValueError(
        f"unknown dataset {name_or_spec!r}; known datasets: "
        f"{', '.join(KNOWN_DATASETS)} (e.g. 'cora' or "
        f"'synthetic:nodes=100000,degree=10,seed=0')")
