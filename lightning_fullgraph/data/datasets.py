"""Resolves data set names and specs such as ``"synthetic:nodes=1e6"``."""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from torch_geometric.data import Data

from lightning_fullgraph.data.cora import load_cora
from lightning_fullgraph.data.synthetic import synthetic_graph

__all__ = ["KNOWN_DATASETS", "SYNTHETIC_KEYS", "load_dataset"]


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


def load_dataset(name_or_spec: str) -> Data:
    r"""Loads a data set by name or generates one from a spec string.

    * ``"cora"``: the embedded Cora graph (:func:`load_cora`).
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

    Args:
        name_or_spec (str): Data set name or spec.

    Returns:
        torch_geometric.data.Data: The graph, with :obj:`train_mask`,
        :obj:`val_mask` and :obj:`test_mask`.
    """
    if not isinstance(name_or_spec, str):
        raise TypeError(f"dataset must be a str, got "
                        f"{type(name_or_spec).__name__}")
    name, _, options = name_or_spec.strip().partition(":")
    name = name.strip().lower()
    if name == "cora":
        if options.strip():
            raise ValueError(f"dataset 'cora' takes no options, got "
                             f"{name_or_spec!r}")
        return load_cora()
    if name == "synthetic":
        return synthetic_graph(**_parse_synthetic(options, name_or_spec))
    raise ValueError(
        f"unknown dataset {name_or_spec!r}; known datasets: "
        f"{', '.join(KNOWN_DATASETS)} (e.g. 'cora' or "
        f"'synthetic:nodes=100000,degree=10,seed=0')")
