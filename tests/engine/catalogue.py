"""How each layer of PyG's conv catalogue is built and called in the catalogue test.

One :class:`Entry` per tested configuration (a layer class may have several: its common
options).  Each entry builds two layers (``build(0)`` and ``build(1)``, hidden width
:data:`HIDDEN` in and out) that :class:`CatalogueNet` stacks between a Linear input and a
Linear output; ``call(conv, x, graph)`` runs one layer on the node rows :obj:`x` with the
graph's tensors (``graph.edge_index``, ``graph.edge_weight``, ``graph.edge_attr``,
``graph.edge_type``, ``graph.pos``, ``graph.normal``, ``graph.node_type``, ``graph.x0``).

Layers of ``torch_geometric.nn.conv.__all__`` that appear here are verified exact; the
others must be refused by :data:`lightning_fullgraph.engine.support.REFUSED_LAYERS`
with their reason (the test checks both).
"""
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Dict, Tuple

import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import conv as C
from torch_geometric.utils import degree

from .models import skewed_graph

HIDDEN = 16
EDGE_DIM = 3
NUM_RELATIONS = 3
NUM_NODE_TYPES = 2


@dataclass(frozen=True)
class Entry:
    r"""One tested configuration of a layer class.

    Attributes:
        cls (type): The PyG class (what the coverage table lists).
        options (str): The options in words, for the table.
        build (Callable[[int], nn.Module]): Layer ``i`` of the two (``HIDDEN`` → ``HIDDEN``).
        call (Callable): ``call(conv, x, graph) -> Tensor``.
        invariant (Tuple[str, ...]): Parameters (name suffixes) the output is invariant to
            in exact arithmetic (a per-target shift of a softmax score): their gradient is
            rounding noise, compared against the model's largest gradient instead of its own.
    """
    cls: type
    options: str
    build: Callable[[int], nn.Module]
    call: Callable = lambda conv, x, g: conv(x, g.edge_index)
    invariant: Tuple[str, ...] = ()


def _mlp(i: int, o: int) -> nn.Module:
    return nn.Sequential(nn.Linear(i, o), nn.ReLU(), nn.Linear(o, o))


def _weighted(conv, x, g):
    return conv(x, g.edge_index, g.edge_weight)


def _attr(conv, x, g):
    return conv(x, g.edge_index, g.edge_attr)


def _typed(conv, x, g):
    return conv(x, g.edge_index, g.edge_type)


def _halves(conv, x, g):
    # combine_root='cat' doubles the width: fold it back to HIDDEN.
    out = conv(x, g.edge_index)
    return out[:, :HIDDEN] + out[:, HIDDEN:]


def _signed(i: int) -> nn.Module:
    # The first layer concatenates the positive and negative halves (2 × 8), the second
    # reads them back.
    return C.SignedConv(HIDDEN if i == 0 else HIDDEN // 2, HIDDEN // 2, first_aggr=i == 0)


def _signed_call(conv, x, g):
    positive = g.edge_sign > 0
    return conv(x, g.edge_index[:, positive], g.edge_index[:, ~positive])


def _dna_call(conv, x, g):
    # DNAConv attends over the representations of earlier layers: [N, layers, C].
    return conv(torch.stack([g.x0, x], dim=1), g.edge_index, g.edge_weight)


def _pna(i: int, deg: torch.Tensor, edge_dim=None) -> nn.Module:
    return C.PNAConv(HIDDEN, HIDDEN, aggregators=["mean", "min", "max", "std"],
                     scalers=["identity", "amplification", "attenuation"], deg=deg,
                     edge_dim=edge_dim, towers=2, divide_input=False)


def catalogue(deg: torch.Tensor) -> Dict[str, Entry]:
    r"""The tested configurations by name (``deg``: the in-degree histogram PNA needs)."""
    H, E = HIDDEN, EDGE_DIM
    entries = [
        Entry(C.SimpleConv, "aggr='mean', combine_root='self_loop'",
              lambda i: C.SimpleConv(aggr="mean", combine_root="self_loop")),
        Entry(C.SimpleConv, "aggr='max', combine_root='cat'",
              lambda i: C.SimpleConv(aggr="max", combine_root="cat"), _halves),
        Entry(C.GCNConv, "edge_weight", lambda i: C.GCNConv(H, H), _weighted),
        Entry(C.GCNConv, "improved, no self-loops", lambda i: C.GCNConv(
            H, H, improved=True, add_self_loops=False)),
        Entry(C.ChebConv, "K=3, sym, edge_weight", lambda i: C.ChebConv(H, H, K=3), _weighted),
        Entry(C.ChebConv, "K=2, rw", lambda i: C.ChebConv(H, H, K=2, normalization="rw")),
        Entry(C.SAGEConv, "aggr='mean'", lambda i: C.SAGEConv(H, H)),
        Entry(C.SAGEConv, "aggr='max', project, normalize", lambda i: C.SAGEConv(
            H, H, aggr="max", project=True, normalize=True)),
        Entry(C.GraphConv, "edge_weight, aggr='mean'", lambda i: C.GraphConv(H, H, aggr="mean"),
              _weighted),
        Entry(C.GatedGraphConv, "num_layers=2", lambda i: C.GatedGraphConv(H, num_layers=2)),
        Entry(C.ResGatedGraphConv, "", lambda i: C.ResGatedGraphConv(H, H)),
        Entry(C.ResGatedGraphConv, "edge_dim", lambda i: C.ResGatedGraphConv(H, H, edge_dim=E),
              _attr),
        Entry(C.GATConv, "heads=2, edge_dim", lambda i: C.GATConv(H, H // 2, heads=2,
                                                                  edge_dim=E), _attr),
        Entry(C.GATv2Conv, "heads=2, edge_dim, share_weights", lambda i: C.GATv2Conv(
            H, H // 2, heads=2, edge_dim=E, share_weights=True), _attr),
        Entry(C.TransformerConv, "heads=2", lambda i: C.TransformerConv(H, H // 2, heads=2),
              invariant=("lin_key.bias", )),
        Entry(C.TransformerConv, "heads=2, edge_dim, beta", lambda i: C.TransformerConv(
            H, H // 2, heads=2, edge_dim=E, beta=True), _attr, invariant=("lin_key.bias", )),
        Entry(C.AGNNConv, "learned beta", lambda i: C.AGNNConv(requires_grad=True)),
        Entry(C.TAGConv, "K=2, edge_weight", lambda i: C.TAGConv(H, H, K=2), _weighted),
        Entry(C.GINConv, "train_eps", lambda i: C.GINConv(_mlp(H, H), train_eps=True)),
        Entry(C.GINEConv, "edge_dim, train_eps", lambda i: C.GINEConv(
            _mlp(H, H), train_eps=True, edge_dim=E), _attr),
        Entry(C.ARMAConv, "2 stacks × 2 layers, edge_weight", lambda i: C.ARMAConv(
            H, H, num_stacks=2, num_layers=2), _weighted),
        Entry(C.SGConv, "K=2, edge_weight", lambda i: C.SGConv(H, H, K=2), _weighted),
        Entry(C.SSGConv, "K=2, alpha=0.1, edge_weight", lambda i: C.SSGConv(
            H, H, alpha=0.1, K=2), _weighted),
        Entry(C.APPNP, "K=3, edge_weight", lambda i: C.APPNP(K=3, alpha=0.1), _weighted),
        Entry(C.MFConv, "max_degree=4", lambda i: C.MFConv(H, H, max_degree=4)),
        Entry(C.RGCNConv, "3 relations, 2 bases, aggr='mean'", lambda i: C.RGCNConv(
            H, H, NUM_RELATIONS, num_bases=2), _typed),
        Entry(C.RGCNConv, "3 relations, 2 blocks, aggr='add'", lambda i: C.RGCNConv(
            H, H, NUM_RELATIONS, num_blocks=2, aggr="add"), _typed),
        Entry(C.FastRGCNConv, "3 relations", lambda i: C.FastRGCNConv(H, H, NUM_RELATIONS),
              _typed),
        Entry(C.RGATConv, "3 relations, heads=2, edge_dim", lambda i: C.RGATConv(
            H, H // 2, NUM_RELATIONS, heads=2, edge_dim=E),
            lambda conv, x, g: conv(x, g.edge_index, g.edge_type, g.edge_attr)),
        Entry(C.SignedConv, "positive / negative edges", _signed, _signed_call),
        Entry(C.DNAConv, "heads=2, groups=2, edge_weight", lambda i: C.DNAConv(
            H, heads=2, groups=2), _dna_call),
        Entry(C.PointNetConv, "pos", lambda i: C.PointNetConv(
            _mlp(H + 3, H), _mlp(H, H)), lambda conv, x, g: conv(x, g.pos, g.edge_index)),
        Entry(C.GMMConv, "pseudo-coordinates (edge_attr), kernel_size=2", lambda i: C.GMMConv(
            H, H, dim=E, kernel_size=2), _attr),
        Entry(C.NNConv, "edge network, aggr='mean'", lambda i: C.NNConv(
            H, H, nn.Linear(E, H * H), aggr="mean"), _attr),
        Entry(C.CGConv, "edge_attr", lambda i: C.CGConv(H, dim=E), _attr),
        Entry(C.EdgeConv, "aggr='max'", lambda i: C.EdgeConv(_mlp(2 * H, H))),
        Entry(C.PPFConv, "pos, normal", lambda i: C.PPFConv(_mlp(H + 4, H), _mlp(H, H)),
              lambda conv, x, g: conv(x, g.pos, g.normal, g.edge_index)),
        Entry(C.FeaStConv, "heads=2", lambda i: C.FeaStConv(H, H, heads=2)),
        Entry(C.PointTransformerConv, "pos", lambda i: C.PointTransformerConv(H, H),
              lambda conv, x, g: conv(x, g.pos, g.edge_index), invariant=("lin_dst.weight", )),
        Entry(C.LEConv, "edge_weight", lambda i: C.LEConv(H, H), _weighted),
        Entry(C.PNAConv, "mean/min/max/std, 3 scalers, towers=2",
              lambda i: _pna(i, deg)),
        Entry(C.PNAConv, "edge_dim", lambda i: _pna(i, deg, edge_dim=E), _attr),
        Entry(C.ClusterGCNConv, "diag_lambda=0.5", lambda i: C.ClusterGCNConv(
            H, H, diag_lambda=0.5)),
        Entry(C.GENConv, "softmax, learn_t, edge_dim", lambda i: C.GENConv(
            H, H, learn_t=True, edge_dim=H, norm="layer"), lambda conv, x, g: conv(
                x, g.edge_index, g.edge_attr16)),
        Entry(C.GENConv, "powermean, learn_p, msg_norm", lambda i: C.GENConv(
            H, H, aggr="powermean", learn_p=True, msg_norm=True, norm="layer")),
        Entry(C.GCN2Conv, "edge_weight", lambda i: C.GCN2Conv(H, alpha=0.1, theta=0.5,
                                                            layer=i + 1),
              lambda conv, x, g: conv(x, g.x0, g.edge_index, g.edge_weight)),
        Entry(C.WLConvContinuous, "edge_weight", lambda i: C.WLConvContinuous(), _weighted),
        Entry(C.FiLMConv, "3 relations", lambda i: C.FiLMConv(H, H, NUM_RELATIONS), _typed),
        Entry(C.SuperGATConv, "MX, heads=2 (eval mode only)", lambda i: C.SuperGATConv(
            H, H // 2, heads=2, attention_type="MX")),
        Entry(C.FAConv, "eps=0.2, normalize", lambda i: C.FAConv(H, eps=0.2),
              lambda conv, x, g: conv(x, g.x0, g.edge_index)),
        Entry(C.FAConv, "edge_weight, normalize=False", lambda i: C.FAConv(
            H, eps=0.2, normalize=False),
            lambda conv, x, g: conv(x, g.x0, g.edge_index, g.edge_weight)),
        Entry(C.EGConv, "sum/mean/symnorm/max/std", lambda i: C.EGConv(
            H, H, aggregators=["sum", "mean", "symnorm", "max", "std"], num_heads=2,
            num_bases=2)),
        Entry(C.PDNConv, "edge_dim", lambda i: C.PDNConv(H, H, edge_dim=E, hidden_channels=8),
              _attr),
        Entry(C.GeneralConv, "additive attention, edge features", lambda i: C.GeneralConv(
            H, H, in_edge_channels=E, attention=True, heads=2), _attr),
        Entry(C.HEATConv, "node and edge types, edge_attr", lambda i: C.HEATConv(
            H, H // 2, NUM_NODE_TYPES, NUM_RELATIONS, edge_type_emb_dim=4, edge_dim=E,
            edge_attr_emb_dim=4, heads=2),
            lambda conv, x, g: conv(x, g.edge_index, g.node_type, g.edge_type, g.edge_attr)),
        Entry(C.LGConv, "edge_weight", lambda i: C.LGConv(), _weighted),
        Entry(C.PointGNNConv, "pos", lambda i: C.PointGNNConv(
            _mlp(H, 3), _mlp(H + 3, H), _mlp(H, H)),
            lambda conv, x, g: conv(x, g.pos, g.edge_index)),
        Entry(C.AntiSymmetricConv, "num_iters=2 (GCNConv phi)", lambda i: C.AntiSymmetricConv(
            H, num_iters=2)),
        Entry(C.DirGNNConv, "GCNConv, both directions", lambda i: C.DirGNNConv(
            C.GCNConv(H, H))),
        Entry(C.MixHopConv, "powers 0-3, edge_weight", lambda i: C.MixHopConv(
            H, H // 4, powers=[0, 1, 2, 3]), _weighted),
    ]
    names: Dict[str, Entry] = {}
    for entry in entries:
        name = entry.cls.__name__
        n = sum(1 for key in names if key.split("[")[0] == name)
        names[f"{name}[{n}]" if n else name] = entry
    return names


class CatalogueNet(nn.Module):
    r"""Linear → conv → ReLU → conv → Linear, with the graph's tensors passed through."""

    def __init__(self, entry: Entry, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.entry = entry
        self.lin_in = nn.Linear(in_channels, HIDDEN, bias=False)
        self.conv1 = entry.build(0)
        self.conv2 = entry.build(1)
        self.lin_out = nn.Linear(HIDDEN, out_channels)

    def forward(self, x, graph) -> torch.Tensor:
        x = self.lin_in(x)
        g = SimpleNamespace(**vars(graph), x0=x)
        x = self.entry.call(self.conv1, x, g).relu()
        return self.lin_out(self.entry.call(self.conv2, x, g))


GRAPH_KEYS = ("edge_index", "edge_weight", "edge_attr", "edge_attr16", "edge_type",
              "edge_sign", "pos", "normal", "node_type")


def catalogue_graph(num_nodes: int = 120, seed: int = 0) -> Data:
    r"""The exactness graph (hubs, self-loops, duplicates, isolated nodes) with every node
    and edge tensor a layer of the catalogue reads."""
    data = skewed_graph(num_nodes=num_nodes, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    n, e = data.num_nodes, data.edge_index.size(1)
    data.edge_attr16 = torch.randn(e, HIDDEN, generator=g)
    data.edge_type = torch.randint(0, NUM_RELATIONS, (e, ), generator=g)
    data.edge_sign = torch.randint(0, 2, (e, ), generator=g)
    data.pos = torch.randn(n, 3, generator=g)
    normal = torch.randn(n, 3, generator=g)
    data.normal = normal / normal.norm(dim=-1, keepdim=True)
    data.node_type = torch.randint(0, NUM_NODE_TYPES, (n, ), generator=g)
    return data


def graph_tensors(data: Data, dtype: torch.dtype) -> SimpleNamespace:
    r"""The graph's tensors (floating ones in :obj:`dtype`) as ``CatalogueNet`` reads them."""
    out = {}
    for key in GRAPH_KEYS:
        value = data[key]
        out[key] = value.to(dtype) if value.is_floating_point() else value
    return SimpleNamespace(**out)


def degree_histogram(data: Data) -> torch.Tensor:
    r"""PNA's histogram of in-degrees over the whole graph."""
    deg = degree(data.edge_index[1], data.num_nodes, dtype=torch.long)
    return torch.bincount(deg)


def coverage_table() -> str:
    r"""The coverage of PyG's conv catalogue as Markdown (``docs/layers.md``)."""
    import torch_geometric
    from torch_geometric.nn import conv as pyg_conv

    from lightning_fullgraph.engine.support import REFUSED_LAYERS, TRAINING_REFUSED_LAYERS

    options: Dict[str, list] = {}
    for entry in catalogue(torch.ones(1, dtype=torch.long)).values():
        options.setdefault(entry.cls.__name__, []).append(entry.options or "defaults")
    rows = []
    for name in pyg_conv.__all__:
        if name in options:
            status = "exact (eval only)" if name in TRAINING_REFUSED_LAYERS else "exact"
            what = "; ".join(f"`{o}`" if o != "defaults" else o for o in options[name])
            if name in TRAINING_REFUSED_LAYERS:
                what += ". Training refused: " + TRAINING_REFUSED_LAYERS[name]
        else:
            status, what = "refused", REFUSED_LAYERS.get(name, "**not covered**")
        rows.append(f"| `{name}` | {status} | {what} |")
    exact = sum(1 for name in pyg_conv.__all__ if name in options
                and name not in TRAINING_REFUSED_LAYERS)
    return "\n".join([
        "# PyG layers under partitioned execution",
        "",
        "Generated from `tests/engine/catalogue.py` (regenerate with "
        "`python -m tests.engine.catalogue > docs/layers.md`); "
        "`tests/engine/test_catalogue.py` checks every *exact* row against single-process "
        "PyG (logits and gradients, P = 2 and 3, in hybrid and post aggregation) and that "
        "every *refused* layer is refused with this reason.",
        "",
        f"PyG {torch_geometric.__version__}: {len(pyg_conv.__all__)} names in "
        f"`torch_geometric.nn.conv.__all__`, **{exact} exact**, "
        f"{sum(1 for r in rows if '| refused |' in r)} refused, "
        f"{len(TRAINING_REFUSED_LAYERS)} exact in inference only.",
        "",
        "| layer | status | options tested / reason |",
        "|---|---|---|",
        *rows, ""])


if __name__ == "__main__":
    print(coverage_table(), end="")
