"""Small PyG models and graphs shared by the engine tests (built identically on every rank)."""
import torch
from torch import nn
from torch_geometric.data import Data
from torch_geometric.nn import (APPNP, GATConv, GATv2Conv, GCN2Conv, GCNConv, GINConv,
                                GraphConv, SAGEConv, SGConv, TAGConv)

HIDDEN = 16

LAYERS = {
    "gcn": lambda: GCNConv(HIDDEN, HIDDEN),
    "sage_mean": lambda: SAGEConv(HIDDEN, HIDDEN, aggr="mean"),
    "sage_max": lambda: SAGEConv(HIDDEN, HIDDEN, aggr="max"),
    "gat": lambda: GATConv(HIDDEN, HIDDEN // 2, heads=2),
    "gatv2": lambda: GATv2Conv(HIDDEN, HIDDEN // 2, heads=2),
    "gin": lambda: GINConv(nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                                         nn.Linear(HIDDEN, HIDDEN)), train_eps=True),
    "graph": lambda: GraphConv(HIDDEN, HIDDEN),
    "sgc": lambda: SGConv(HIDDEN, HIDDEN, K=2),
    "appnp": lambda: APPNP(K=3, alpha=0.1),
    "gcn2": lambda: GCN2Conv(HIDDEN, alpha=0.1, theta=0.5, layer=1),
    "tag": lambda: TAGConv(HIDDEN, HIDDEN, K=2),
    # Edge features through the engine: weights and attributes travel with the in-edges.
    "gcn_weighted": lambda: GCNConv(HIDDEN, HIDDEN),
    "graph_weighted": lambda: GraphConv(HIDDEN, HIDDEN),
    "sgc_weighted": lambda: SGConv(HIDDEN, HIDDEN, K=2),
    "appnp_weighted": lambda: APPNP(K=3, alpha=0.1),
    "tag_weighted": lambda: TAGConv(HIDDEN, HIDDEN, K=2),
    "gcn2_weighted": lambda: GCN2Conv(HIDDEN, alpha=0.1, theta=0.5, layer=1),
    "gat_edge_attr": lambda: GATConv(HIDDEN, HIDDEN // 2, heads=2, edge_dim=EDGE_DIM),
}
EDGE_DIM = 3
USES_EDGE_WEIGHT = {"gcn_weighted", "graph_weighted", "sgc_weighted", "appnp_weighted",
                    "tag_weighted", "gcn2_weighted"}
USES_EDGE_ATTR = {"gat_edge_attr"}


class Net(nn.Module):
    r"""Linear → BatchNorm → ReLU → conv → ReLU → Dropout → conv → Linear, any conv kind.

    The input Linear has no bias: a bias right before BatchNorm has a mathematically
    zero gradient, i.e. pure rounding noise that Adam turns into ±lr steps, which
    makes trajectories of any two runs with different summation orders drift apart.
    """

    def __init__(self, kind: str, in_channels: int, out_channels: int, dropout: float = 0.0):
        super().__init__()
        self.kind = kind
        self.lin_in = nn.Linear(in_channels, HIDDEN, bias=False)
        self.bn = nn.BatchNorm1d(HIDDEN)
        self.conv1 = LAYERS[kind]()
        self.dropout = nn.Dropout(dropout)
        self.conv2 = LAYERS[kind]()
        self.lin_out = nn.Linear(HIDDEN, out_channels)

    def _conv(self, conv, x, x0, edge_index, edge_weight, edge_attr):
        if self.kind == "gcn2":
            return conv(x, x0, edge_index)
        if self.kind == "gcn2_weighted":
            return conv(x, x0, edge_index, edge_weight)
        if self.kind in USES_EDGE_WEIGHT:
            return conv(x, edge_index, edge_weight)
        if self.kind in USES_EDGE_ATTR:
            return conv(x, edge_index, edge_attr)
        return conv(x, edge_index)

    def forward(self, x, edge_index, edge_weight=None, edge_attr=None):
        x = self.bn(self.lin_in(x)).relu()
        x0 = x
        x = self._conv(self.conv1, x, x0, edge_index, edge_weight, edge_attr).relu()
        x = self.dropout(x)
        return self.lin_out(self._conv(self.conv2, x, x0, edge_index, edge_weight, edge_attr))


def skewed_graph(num_nodes: int = 120, num_features: int = 8, num_classes: int = 4,
                 seed: int = 0) -> Data:
    r"""Random directed graph with hubs, self-loops, duplicate edges and isolated nodes."""
    g = torch.Generator().manual_seed(seed)
    n_edges = num_nodes * 4
    # Quadratic skew towards low ids makes hubs.
    src = (torch.rand(n_edges, generator=g).pow(2) * (num_nodes - 3)).long()
    dst = torch.randint(0, num_nodes - 3, (n_edges, ), generator=g)
    extra = torch.tensor([[5, 5, 7, 7], [5, 9, 9, 9]])  # a self-loop and a duplicate edge
    edge_index = torch.cat([torch.stack([src, dst]), extra], 1)  # last 3 nodes isolated
    x = torch.randn(num_nodes, num_features, generator=g)
    y = torch.randint(0, num_classes, (num_nodes, ), generator=g)
    train_mask = torch.rand(num_nodes, generator=g) < 0.5
    val_mask = ~train_mask & (torch.rand(num_nodes, generator=g) < 0.5)
    num_edges = edge_index.size(1)
    return Data(x=x, edge_index=edge_index, y=y, train_mask=train_mask, val_mask=val_mask,
                test_mask=~train_mask & ~val_mask,
                edge_weight=torch.rand(num_edges, generator=g) + 0.5,
                edge_attr=torch.randn(num_edges, EDGE_DIM, generator=g))


def rank_partition(rank: int, world_size: int):
    r""":func:`skewed_graph` and this rank's part of its METIS partition (seed 0)."""
    from lightning_fullgraph.partition import build_local_partitions, metis_partition
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    return data, build_local_partitions(data, parts)[rank]


def layer_exchange(exchange, x, key: str = "probe", training: bool = True):
    r"""``exchange.extend(x)`` as a partitioned layer in :obj:`training` mode calls it (the
    cache, the pipeline and boundary sampling act only on training exchanges)."""
    from lightning_fullgraph.engine.context import ActiveLayer, pop_layer, push_layer
    push_layer(ActiveLayer(key, exchange, training=training))
    try:
        return exchange.extend(x, key=key)
    finally:
        pop_layer()
