"""Random graphs the 4-D tests share."""
import torch


def random_graph(num_nodes: int, num_edges: int, channels: int, classes: int, seed: int = 0):
    r"""An undirected random graph without self-loops (from :obj:`num_edges` drawn pairs),
    features and labels; returns ``(edge_index, x, y, generator)``, the generator to draw
    more from (e.g. masks)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, num_nodes, (2, num_edges), generator=g)
    ei = ei[:, ei[0] != ei[1]]
    ei = torch.cat([ei, ei.flip(0)], dim=1)
    x = torch.randn(num_nodes, channels, generator=g)
    y = torch.randint(0, classes, (num_nodes, ), generator=g)
    return ei, x, y, g
