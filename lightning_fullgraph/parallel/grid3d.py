r""":class:`~.scalegnn.ScaleGNN` over a 3-D process grid (ScaleGNN §IV-C), with data-parallel
replicas.

Every process holds one block of every weight and of the features, and the adjacency blocks of
the layouts it meets (at most three: the layouts rotate with period 3, :func:`~.pmm.layer_axes`).
For layer :math:`l` with axes ``(R, C, T)``:

.. code-block:: text

    H   = Ã[T, R] @ X[R, C]                   (sum over R)   H in (T, C)
    Xc  = H[T, C] @ W_l[C, R]                 (sum over C)   Xc in (T, R)
    Xn  = Xc / rms(Xc) * gamma[R]             (squared norms summed over R)
    X'  = dropout(relu(Xn)) + reshard(X)      (the residual moved from (R, C) to (T, R))

The input projection is ``IN[x, z] @ W_in[z, y]`` (sum over z: features in ``(x, y)``), the
head ``X[T_L, R_L] @ W_out[R_L, :]`` (sum over R_L: logits for the rows of ``T_L``).

Parameter gradients are summed over the axis whose processes use the block for other rows (the
third axis of a layer, ``x`` for ``W_in``), never over axes that repeat the same work, then
averaged over the ``dp`` replicas (:meth:`Grid3DScaleGNN.reduce_gradients`).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .grid_module import GridModule
from .mesh import FourDMesh
from .pmm import all_reduce_sum, layer_axes, reduce_from, summed
from .scalegnn import ScaleGNN

__all__ = ["Grid3DScaleGNN"]


class Grid3DScaleGNN(GridModule):
    r"""The blocks of a :class:`~.scalegnn.ScaleGNN` this process holds, and its forward over
    the grid.

    Args:
        model (ScaleGNN): The model to split (the same initial weights on every process,
            e.g. built after the same ``torch.manual_seed``).  Only this process's blocks are
            kept.
        mesh (FourDMesh): This rank's groups.
        seed (int): Seed of the dropout masks (replicas of a block draw the same mask).
        gather_output (bool): Return the logits of every row of the batch (gathered over the
            output rows' axis), so that an unmodified loss over ``out[mask]`` works;
            otherwise only :meth:`output_rows` (use :meth:`loss` then).
        bf16_comm (bool): The partial products of the parallel matmuls (forward) and their
            gradients (backward), the residual's reshard and the weight-gradient reduction
            cross the wire as bfloat16, summed in fp32 (ScaleGNN §V: the dominant
            collectives); RMSNorm's norms, the logits' reduction and gathering and the loss
            stay fp32, as the paper keeps its numerically sensitive reductions.  Lossy; about
            halves a step's bytes at any axis size.

    Shapes:
        - **input:** the mini-batch's node features :math:`(B, F_{in})`, edge indices
          :math:`(2, E_S)`, edge weights :math:`(E_S)` -- every process of a replica gets
          the same batch and keeps its blocks.
        - **output:** logits :math:`(B, F_{out})`, or of :meth:`output_rows` without
          :obj:`gather_output`.
    """

    input_layout = ("x", "z")  # the input projection's IN[x, z]

    def __init__(self, model: ScaleGNN, mesh: FourDMesh, seed: int = 0,
                 gather_output: bool = False, bf16_comm: bool = False) -> None:
        super().__init__(mesh, seed, bf16_comm)
        self.gather_output = bool(gather_output)
        self.num_layers, self.eps, self.dropout = model.num_layers, model.eps, model.dropout
        self.in_channels, self.hidden = model.in_channels, model.hidden_channels
        self.out_channels = model.out_channels
        self.keep("w_in", model.lin_in.weight, "lin_in.weight", ("z", "y"), ("x", ),
                  transpose=True)
        for layer in range(1, self.num_layers + 1):
            r, c, t = layer_axes(layer)
            self.keep(f"w{layer}", model.weights[layer - 1], f"weights.{layer - 1}", (c, r),
                      (t, ))
            self.keep(f"gamma{layer}", model.norms[layer - 1], f"norms.{layer - 1}", (r, ),
                      (t, ))
        r, _, t = layer_axes(self.num_layers)
        # After the last layer the features are in (T_L, R_L).
        self.keep("w_out", model.lin_out.weight, "lin_out.weight", (r, None), (t, ),
                  transpose=True)
        self.keep("b_out", model.lin_out.bias, "lin_out.bias", (None, ), (t, ))

    def output_rows(self, num_nodes: int) -> slice:
        r"""The batch rows whose logits :meth:`forward` returns without gathering."""
        return self._cols(num_nodes, layer_axes(self.num_layers)[2])

    def forward(self, x: Tensor, edge_index: Tensor,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        h = self.hidden
        n, own = self.input_block(x, self.in_channels)
        self.new_batch(edge_index, n)
        group = self.mesh.group
        feats = reduce_from(own @ self.w_in, group("z"), self.bf16_comm)  # (x, y)
        for layer in range(1, self.num_layers + 1):
            r, c, t = layer_axes(layer)
            # The residual's reshard travels while the layer computes (ScaleGNN §IV-C).
            residual = self.reshard(feats, n, h, (r, c), (t, r), overlapped=True)
            xc = self.gcn_product(feats, getattr(self, f"w{layer}"), layer, edge_index,
                                  edge_weight, n)  # (t, r)
            squares = all_reduce_sum(xc.pow(2).sum(-1, keepdim=True), group(r))
            xn = xc * torch.rsqrt(squares / h + self.eps) * getattr(self, f"gamma{layer}")
            out = self.dropout_mask(F.relu(xn), self.dropout, layer, t, r)
            feats = out + residual()
        r, _, t = layer_axes(self.num_layers)  # the features are in (T_L, R_L) now
        logits = reduce_from(feats @ self.w_out, group(r)) + self.b_out
        if self.training:
            self.step += 1
        return self.gather_rows(logits, n, t) if self.gather_output else logits

    # -- loss ----------------------------------------------------------------------------------
    def loss(self, logits: Tensor, y: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        r"""This process's share of the batch's mean cross-entropy, from the logits of
        :meth:`output_rows` (the shares of the row blocks add up to the batch's mean)."""
        rows = self.output_rows(y.numel())
        target = y[rows]
        total = y.numel() if mask is None else int(mask.sum())
        if mask is not None:
            logits, target = logits[mask[rows]], target[mask[rows]]
        return F.cross_entropy(logits, target, reduction="sum") / max(total, 1)

    def global_loss(self, loss: Tensor) -> Tensor:
        r"""The batch's loss from this process's share (summed over the output rows' axis;
        averaged over the replicas), without gradient."""
        _, _, t = layer_axes(self.num_layers)
        value = summed(loss.detach().reshape(1), self.mesh.group(t))
        return summed(value, self.mesh.group("dp")) / self.mesh.size("dp")
