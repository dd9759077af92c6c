r"""ScaleGNN's GCN (Fig. 2), as one process runs it: the reference of the 3-D version."""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Linear, Parameter, ParameterList

__all__ = ["ScaleGNN", "aggregate_sum"]


def aggregate_sum(x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor],
                  num_dst: int) -> Tensor:
    r""":math:`\sum_{(u, v)} w_{uv} x_u` into every destination :math:`v` (``Ã X``)."""
    from ..kernels import aggregate

    return aggregate(x, edge_index, edge_weight, "sum", num_dst, num_src=x.size(0))


class ScaleGNN(torch.nn.Module):
    r"""ScaleGNN's model: an input projection, :obj:`num_layers` residual GCN layers
    :math:`X_l = X_{l-1} + \mathrm{dropout}(\mathrm{ReLU}(\mathrm{RMSNorm}(Ã X_{l-1} W_l)))`,
    and an output head.  Train it on :class:`~.sampling.SampledSubgraph` mini-batches (the
    rescaled weights are the :obj:`edge_weight`), on one process or over a 3-D grid with
    :class:`~.grid3d.Grid3DScaleGNN`.

    Args:
        in_channels (int): Input features.
        hidden_channels (int): Hidden width :math:`h`.
        num_layers (int): GCN layers.
        out_channels (int): Classes.
        dropout (float): Dropout after each layer's ReLU.
        eps (float): RMSNorm's :math:`\epsilon`.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})`, edge indices
          :math:`(2, |\mathcal{E}|)`, edge weights :math:`(|\mathcal{E}|)` *(optional)*
        - **output:** :math:`(|\mathcal{V}|, F_{out})`
    """

    def __init__(self, in_channels: int, hidden_channels: int, num_layers: int,
                 out_channels: int, dropout: float = 0.0, eps: float = 1e-6) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.in_channels, self.hidden_channels = in_channels, hidden_channels
        self.out_channels, self.num_layers = out_channels, num_layers
        self.dropout, self.eps = float(dropout), float(eps)
        self.lin_in = Linear(in_channels, hidden_channels, bias=False)
        self.weights = ParameterList(
            [Parameter(torch.empty(hidden_channels, hidden_channels)) for _ in range(num_layers)])
        self.norms = ParameterList(
            [Parameter(torch.ones(hidden_channels)) for _ in range(num_layers)])
        self.lin_out = Linear(hidden_channels, out_channels)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin_in.reset_parameters()
        self.lin_out.reset_parameters()
        bound = math.sqrt(6.0 / (2 * self.hidden_channels))  # Glorot
        for w in self.weights:
            torch.nn.init.uniform_(w, -bound, bound)
        for g in self.norms:
            torch.nn.init.ones_(g)

    def forward(self, x: Tensor, edge_index: Tensor,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        h = self.lin_in(x)
        for weight, gamma in zip(self.weights, self.norms):
            xc = aggregate_sum(h, edge_index, edge_weight, h.size(0)) @ weight
            xn = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + self.eps) * gamma
            h = F.dropout(F.relu(xn), self.dropout, self.training) + h
        return self.lin_out(h)
