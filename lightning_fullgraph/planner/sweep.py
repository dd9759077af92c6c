r"""Predictions for one graph and model over several part counts and aggregation modes.

:func:`plan_sweep` is what ``lightning-fullgraph plan`` runs: it profiles the model once per
aggregation mode (:func:`~.profile.profile_model`), partitions the graph for every part count
(:func:`~lightning_fullgraph.partition.partition_graph`, reusing the partition cache that
``partition`` and ``train`` use), reads every rank's plan counts and predicts one epoch of
each mode (:class:`~.model.CommunicationModel`).  :func:`format_sweep` prints the result as a
table.  The epoch is one training step (forward + backward) in the steady state, as in
full-graph training after its first steps.
"""
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from ..partition.cover import MODES
from ..partition.metis import DEFAULT_OBJECTIVE
from .counts import partition_counts
from .link import LinkModel
from .model import CommunicationModel
from .profile import ExchangeProfile, profile_model

__all__ = ["plan_sweep", "format_sweep", "model_profiles"]


def model_profiles(model: str, in_channels: int, out_channels: int, *, hidden: int = 16,
                   layers: int = 2, dropout: float = 0.5, modes: Sequence[str] = MODES,
                   seed: int = 0, codec: Any = None) -> Dict[str, ExchangeProfile]:
    r"""Profiles of one of the library's models (:func:`~lightning_fullgraph.module.build_model`)
    per aggregation mode, called as ``NodeClassifier`` calls it (dropout on the input
    features, then the model).

    Args:
        model (str): ``"gcn"``, ``"sage"``, ``"gat"`` or ``"gin"``.
        in_channels (int): Input features.
        out_channels (int): Classes.
        hidden (int): Hidden channels.
        layers (int): Message-passing layers.
        dropout (float): Dropout (also on the input, as ``lightning-fullgraph train``).
        modes (Sequence[str]): Aggregation modes.
        seed (int): Seed of the model's initialization.
        codec (str, Codec or ExchangePolicy, optional): The wire format (row widths).

    Returns:
        Dict[str, ExchangeProfile]
    """
    import torch.nn.functional as F

    from ..module import build_model

    def forward(m, data):
        return m(F.dropout(data.x, dropout, m.training), data.edge_index)

    out = {}
    for mode in modes:
        torch.manual_seed(seed)
        net = build_model(model, in_channels, hidden, out_channels, num_layers=layers,
                          dropout=dropout)
        out[mode] = profile_model(net, in_channels, aggregation=mode, forward=forward,
                                  codec=codec)
    return out


def plan_sweep(data: Any, parts: Sequence[int], *, dataset: str = "", model: str = "gcn",
               hidden: int = 16, layers: int = 2, dropout: float = 0.5,
               modes: Sequence[str] = MODES, hosts: int = 1, link: Optional[LinkModel] = None,
               cache_dir: Optional[str] = None, seed: int = 0, codec: Any = None,
               objective: str = DEFAULT_OBJECTIVE,
               progress: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    r"""Predicts bytes, exchange time and memory per epoch for every part count and mode.

    Args:
        data (torch_geometric.data.Data): The global graph (as ``partition`` loads it).
        parts (Sequence[int]): Part counts (process counts).
        dataset (str): Its name, for the report.
        model, hidden, layers, dropout: The model (see :func:`model_profiles`).
        modes (Sequence[str]): Aggregation modes to predict.
        hosts (int): Hosts the ranks run on (host-aware partitions, inter-host bytes).
        link (LinkModel, optional): Measured link (no seconds without one).
        cache_dir (str, optional): Partition cache root.
        seed (int): METIS seed.
        objective (str): METIS objective, ``"vol"`` or ``"cut"`` (see
            :func:`~lightning_fullgraph.partition.metis_partition`).
        codec (str, Codec or ExchangePolicy, optional): The wire format (``"int2"``, ...);
            fixed-width codecs only (per-node widths are not predicted yet).
        progress (Callable[[str], None], optional): Called with a line per stage.

    Returns:
        Dict[str, Any]: JSON-able: ``dataset``, graph sizes, ``model``, ``link``,
        ``widths`` (per mode: exchange points and widths per layer) and ``results`` (one entry
        per part count with, per mode, the prediction's summary, per-rank bytes and memory,
        per-layer figures).
    """
    from ..partition import partition_graph

    say = progress or (lambda line: None)
    parts = [int(p) for p in parts]
    num_features = int(data.num_features)
    num_classes = int(data.y.max()) + 1 if getattr(data, "y", None) is not None else 2
    say(f"profiling {model} (hidden {hidden}, {layers} layers) in {', '.join(modes)} "
        "aggregation")
    profiles = model_profiles(model, num_features, num_classes, hidden=hidden, layers=layers,
                              dropout=dropout, modes=modes, seed=seed, codec=codec)
    any_profile = next(iter(profiles.values()))
    results: List[Dict[str, Any]] = []
    for P in parts:
        t0 = time.perf_counter()
        say(f"partitioning into {P} parts (cached partitions are reused) ...")
        path = partition_graph(data, P, root=cache_dir, seed=seed, hosts=hosts,
                               objective=objective, progress=False)
        counts = partition_counts(path, modes=tuple(dict.fromkeys(("post", *modes))))
        say(f"{P} parts ready in {time.perf_counter() - t0:.1f} s: {path}")
        entry: Dict[str, Any] = {"parts": P, "partition": str(path), "modes": {}}
        for mode in modes:
            pred = CommunicationModel(profiles[mode], link).predict(counts, hosts=hosts)
            summary = pred.summary()
            summary.update(bytes_sent=pred.bytes_sent(), bytes_received=pred.bytes_received(),
                           memory_bytes=[m["total"] for m in pred.memory],
                           memory=pred.memory[max(range(P), key=lambda r: pred.memory[r][
                               "total"])], layers=pred.layers())
            entry["modes"][mode] = summary
        results.append(entry)
    return {
        "dataset": dataset,
        "nodes": int(data.num_nodes),
        "edges": int(data.edge_index.size(1)),
        "features": num_features,
        "classes": num_classes,
        "model": {"name": model, "hidden": hidden, "layers": layers, "dropout": dropout,
                  "parameters": any_profile.num_parameters},
        "hosts": hosts,
        "objective": objective,
        "codec": codec if isinstance(codec, str) or codec is None else repr(codec),
        "epoch": "one training step (forward + backward), steady state",
        "link": link.to_dict() if link is not None else None,
        "widths": {mode: p.layers() for mode, p in profiles.items()},
        "results": results,
    }


def _mb(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v / 1e6:.3f}"


def _ms(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v * 1e3:.2f}"


def format_sweep(result: Dict[str, Any]) -> str:
    r"""The sweep as a table (one line per part count and mode).

    Args:
        result (Dict[str, Any]): :func:`plan_sweep`'s result.

    Returns:
        str
    """
    m = result["model"]
    lines = [f"{result['dataset'] or 'graph'}: {result['nodes']:,} nodes, "
             f"{result['edges']:,} edges, {result['features']} features; "
             f"{m['name'].upper()} hidden {m['hidden']} x {m['layers']} layers "
             f"({m['parameters']:,} parameters), float32, wire "
             f"{result.get('codec') or 'fp32'}",
             f"epoch = {result['epoch']}"]
    link = result.get("link")
    if link is not None:
        lines.append("link: " + LinkModel.from_dict(link).describe()
                     + (f", both directions at once ({result['duplex_gain']:.2f}x the "
                        "bandwidth of one collective)" if result.get("duplex_gain") else ""))
    else:
        lines.append("link: none (no times predicted)")
    inter = result.get("hosts", 1) > 1
    head = (f"{'P':>4} {'mode':<7} {'rows/exch':>10} {'MB/epoch/rank':>14} {'max rank':>9} "
            f"{'fwd max':>8} {'bwd max':>8} {'exch ms':>8} {'mem MB/rank':>12}"
            + (f" {'inter-host MB':>14}" if inter else ""))
    lines += [head, "-" * len(head)]
    for entry in result["results"]:
        for mode, s in entry["modes"].items():
            line = (f"{entry['parts']:>4} {mode:<7} {s['rows_per_exchange']:>10,} "
                    f"{_mb(s['bytes_per_epoch_mean']):>14} {_mb(s['bytes_per_epoch_max']):>9} "
                    f"{_mb(s['forward_bytes_max']):>8} {_mb(s['backward_bytes_max']):>8} "
                    f"{_ms(s['exchange_seconds']):>8} {_mb(s['memory_bytes_max']):>12}")
            if inter:
                line += f" {_mb(s['inter_host_bytes']):>14}"
            lines.append(line)
    lines.append("MB/epoch/rank: bytes sent per rank (mean; max rank), forward and backward "
                 "(max rank); exch ms: predicted all_to_all time per epoch (busiest rank per "
                 "exchange); mem: estimated bytes of the busiest rank (features, graph, halo, "
                 "pre slots, exchanged activations, parameters x4)")
    return "\n".join(lines)
