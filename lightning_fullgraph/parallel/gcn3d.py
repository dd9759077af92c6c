r"""PyG's :class:`~torch_geometric.nn.models.GCN` over a 3-D process grid.

The model a PyG user already has: ``GCN(in, hidden, num_layers, out, normalize=False)`` (the
mini-batches of :class:`~lightning_fullgraph.data.sampled.SampledNodeDataModule` carry
normalized, rescaled weights), element-wise activations and dropout between layers.  Layer
:math:`l` with axes ``(R, C, T)`` computes ``Ã X W_l + b_l`` as the two parallel products of
:meth:`~.grid_module.GridModule.gcn_product` (``(ÃX)W``: equal to PyG's ``Ã(XW)`` to rounding),
so features rotate layouts like ScaleGNN's; the logits are gathered whole on every process.
Anything the split cannot reproduce exactly is refused by name when the model is converted
(:func:`check_convertible`): normalization layers, jumping knowledge, another convolution,
``GCNConv(normalize=True)``, non-element-wise activations.
"""
from typing import Optional

import torch
from torch import Tensor

from .grid_module import GridModule
from .mesh import FourDMesh
from .pmm import layer_axes

__all__ = ["Grid3DGCN", "check_convertible"]

_ELEMENTWISE = (torch.nn.ReLU, torch.nn.LeakyReLU, torch.nn.ELU, torch.nn.GELU,
                torch.nn.Tanh, torch.nn.Sigmoid, torch.nn.SiLU, torch.nn.Identity)


def check_convertible(model: torch.nn.Module, name: str = "model") -> None:
    r"""Raises a :class:`TypeError` naming what keeps :obj:`model` (at :obj:`name`) from being
    split over a grid by :class:`Grid3DGCN`."""
    from torch_geometric.nn import GCNConv
    from torch_geometric.nn.models import GCN

    if not isinstance(model, GCN):
        raise TypeError(f"'{name}' is a {type(model).__name__}: only torch_geometric's GCN "
                        "model and lightning_fullgraph.parallel.ScaleGNN can be split over a "
                        "grid; use grid=(1, 1, 1) (data parallel) for other models")
    if getattr(model, "jk_mode", None) is not None or hasattr(model, "lin"):
        raise TypeError(f"'{name}': jumping knowledge / a final linear layer cannot be split "
                        "yet; build GCN(..., jk=None)")
    for i, norm in enumerate(model.norms):
        if not isinstance(norm, torch.nn.Identity):
            raise TypeError(f"'{name}.norms.{i}' is a {type(norm).__name__}: normalization "
                            "layers cannot be split yet; build GCN(..., norm=None)")
    if model.act is not None and not isinstance(model.act, _ELEMENTWISE):
        raise TypeError(f"'{name}.act' is a {type(model.act).__name__}: only element-wise "
                        "activations can be split")
    for i, conv in enumerate(model.convs):
        if type(conv) is not GCNConv:
            raise TypeError(f"'{name}.convs.{i}' is a {type(conv).__name__}, not GCNConv")
        if conv.normalize:
            raise TypeError(f"'{name}.convs.{i}' normalizes again (GCNConv(normalize=True)): the "
                            "sampled batches carry normalized weights; build GCN(..., "
                            "normalize=False)")
        if conv.lin.bias is not None:
            raise TypeError(f"'{name}.convs.{i}.lin' has a bias, which GCNConv never has")


class Grid3DGCN(GridModule):
    r"""The blocks of a PyG :class:`~torch_geometric.nn.models.GCN` this process holds, and its
    forward over the grid (see the module docstring).

    Args:
        model (GCN): The model to split (the same initial weights on every process).
        mesh (FourDMesh): This rank's groups.
        seed (int): Seed of the dropout masks.
        bf16_comm (bool): bfloat16 partial sums on the wire (lossy).

    Shapes:
        - **input:** node features :math:`(B, F_{in})`, edge indices :math:`(2, E_S)`, edge
          weights :math:`(E_S)` *(optional)* -- the same batch on every process of a replica.
        - **output:** logits :math:`(B, F_{out})` on every process.
    """

    def __init__(self, model: torch.nn.Module, mesh: FourDMesh, seed: int = 0,
                 bf16_comm: bool = False) -> None:
        check_convertible(model)
        super().__init__(mesh, seed, bf16_comm)
        self.num_layers = len(model.convs)
        self.in_channels = model.convs[0].in_channels
        self.out_channels = model.convs[-1].out_channels
        self.act = model.act
        self.dropout = float(model.dropout.p)
        self.has_bias = []
        for layer, conv in enumerate(model.convs, start=1):
            r, c, t = layer_axes(layer)
            prefix = f"convs.{layer - 1}"
            self.keep(f"w{layer}", conv.lin.weight, f"{prefix}.lin.weight", (c, r), (t, ),
                      transpose=True)
            self.has_bias.append(conv.bias is not None)
            if conv.bias is not None:
                self.keep(f"b{layer}", conv.bias, f"{prefix}.bias", (r, ), (t, ))

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor] = None,
                **kwargs) -> Tensor:
        n = x.size(0)
        self.new_batch(x, edge_index)
        feats = x[self._cols(n, "x"), self._cols(self.in_channels, "y")]  # layer 1's (R, C)
        for layer in range(1, self.num_layers + 1):
            r, c, t = layer_axes(layer)
            out = self.gcn_product(feats, getattr(self, f"w{layer}"), layer, edge_index,
                                   edge_weight, n)  # (t, r)
            if self.has_bias[layer - 1]:
                out = out + getattr(self, f"b{layer}")
            if layer < self.num_layers:
                if self.act is not None:
                    out = self.act(out)
                out = self.dropout_mask(out, self.dropout, layer, t, r)
            feats = out
        r, _, t = layer_axes(self.num_layers)
        if self.training:
            self.step += 1
        # Rows split over t, classes over r: gather both.
        rows = self.gather_rows(feats, n, t)
        return self.gather_rows(rows.t().contiguous(), self.out_channels, r).t()

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, num_layers={self.num_layers}"
