r"""PyG's :class:`~torch_geometric.nn.models.GCN` over a 3-D process grid.

The model a PyG user already has: ``GCN(in, hidden, num_layers, out, normalize=False)`` (the
mini-batches of :class:`~lightning_fullgraph.data.sampled.SampledNodeDataModule` carry
normalized, rescaled weights), element-wise activations and dropout between layers.  Layer
:math:`l` with axes ``(R, C, T)`` computes ``Ã X W_l + b_l`` as the two parallel products of
:meth:`~.grid_module.GridModule.gcn_product` (``(ÃX)W``: equal to PyG's ``Ã(XW)`` to rounding),
so features rotate layouts like ScaleGNN's; the logits are gathered whole on every process.
Normalization layers between the convolutions (``norm="batch_norm"``, ``"layer_norm"`` in
graph or node mode) run on the blocks with their statistics summed over the grid
(:mod:`.norms`).  Anything the split cannot reproduce exactly is refused by name when the model
is converted (:func:`check_convertible`): other normalizations, jumping knowledge, another
convolution, ``GCNConv(normalize=True)``, non-element-wise activations.
"""
from typing import Optional

import torch
from torch import Tensor

from .grid_module import GridModule
from .mesh import FourDMesh
from .norms import SPLITTABLE_NORMS, norm_kind, split_norm
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
    for i, norm in enumerate(model.norms or []):
        if norm_kind(norm) is None:
            raise TypeError(f"'{name}.norms.{i}' is a {norm!r}: only "
                            f"{', '.join(SPLITTABLE_NORMS)} can be split over a grid; build "
                            "GCN(..., norm='batch_norm'), 'layer_norm' or None")
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

    input_layout = ("x", "y")  # layer 1's (R, C)

    def __init__(self, model: torch.nn.Module, mesh: FourDMesh, seed: int = 0,
                 bf16_comm: bool = False) -> None:
        check_convertible(model)
        super().__init__(mesh, seed, bf16_comm)
        self.num_layers = len(model.convs)
        self.in_channels = model.convs[0].in_channels
        self.out_channels = model.convs[-1].out_channels
        self.hidden_channels = [conv.out_channels for conv in model.convs]
        self.act = model.act
        self.dropout = float(model.dropout.p)
        self.act_first = bool(getattr(model, "act_first", False))
        self.has_bias, self.norms = [], []
        for layer, conv in enumerate(model.convs, start=1):
            r, c, t = layer_axes(layer)
            prefix = f"convs.{layer - 1}"
            self.keep(f"w{layer}", conv.lin.weight, f"{prefix}.lin.weight", (c, r), (t, ),
                      transpose=True)
            self.has_bias.append(conv.bias is not None)
            if conv.bias is not None:
                self.keep(f"b{layer}", conv.bias, f"{prefix}.bias", (r, ), (t, ))
            if layer < self.num_layers:
                self._keep_norm(model.norms[layer - 1] if model.norms else None, layer)

    def _keep_norm(self, norm: Optional[torch.nn.Module], layer: int) -> None:
        # After layer `layer` the features are in (t, r): channel blocks over r, gradients of
        # the affine blocks summed over t (the other rows).
        r, _, t = layer_axes(layer)
        kind = "identity" if norm is None else norm_kind(norm)
        prefix = f"norms.{layer - 1}"
        self.norms.append((kind, norm))
        if kind == "batch":
            prefix, norm = prefix + ".module", norm.module
            if norm.track_running_stats:
                self.keep_buffer(f"rm{layer}", norm.running_mean, f"{prefix}.running_mean", (r, ))
                self.keep_buffer(f"rv{layer}", norm.running_var, f"{prefix}.running_var", (r, ))
                self.keep_buffer(f"nbt{layer}", norm.num_batches_tracked,
                                 f"{prefix}.num_batches_tracked", ())
        for part in ("weight", "bias"):
            value = getattr(norm, part, None) if kind != "identity" else None
            if isinstance(value, torch.nn.Parameter):
                self.keep(f"norm_{part}{layer}", value, f"{prefix}.{part}", (r, ), (t, ))

    def _norm(self, x: Tensor, layer: int, n: int) -> Tensor:
        kind, norm = self.norms[layer - 1]
        if kind == "identity":
            return x
        r, _, t = layer_axes(layer)
        running = tuple(getattr(self, f"{k}{layer}") for k in ("rm", "rv", "nbt")) \
            if hasattr(self, f"rm{layer}") else None
        return split_norm(kind, x, norm, getattr(self, f"norm_weight{layer}", None),
                          getattr(self, f"norm_bias{layer}", None), self.mesh.group, t, r, n,
                          self.hidden_channels[layer - 1], self.training, running)

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor] = None,
                **kwargs) -> Tensor:
        n, feats = self.input_block(x, self.in_channels)  # layer 1's (R, C)
        self.new_batch(edge_index, n)
        for layer in range(1, self.num_layers + 1):
            r, c, t = layer_axes(layer)
            out = self.gcn_product(feats, getattr(self, f"w{layer}"), layer, edge_index,
                                   edge_weight, n)  # (t, r)
            if self.has_bias[layer - 1]:
                out = out + getattr(self, f"b{layer}")
            if layer < self.num_layers:  # as BasicGNN: [act], norm, [act], dropout
                if self.act is not None and self.act_first:
                    out = self.act(out)
                out = self._norm(out, layer, n)
                if self.act is not None and not self.act_first:
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
