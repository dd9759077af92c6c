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
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from . import pmm
from .mesh import FourDMesh
from .pmm import all_reduce_sum, block, copy_to, layer_axes, reduce_from, summed
from .reshard import reshard
from .sampling import sample_seed
from .scalegnn import ScaleGNN, aggregate_sum

__all__ = ["Grid3DScaleGNN"]


class _GatherRows(torch.autograd.Function):
    r"""All row blocks of the logits on every process; backward keeps this block's rows (the
    loss on the gathered logits is the same computation on every process)."""

    @staticmethod
    def forward(ctx, rows: Tensor, group, sizes: List[int], index: int) -> Tensor:
        ctx.sizes, ctx.index = sizes, index
        if len(sizes) == 1:
            return rows.clone()
        longest = max(sizes)
        padded = rows.new_zeros((longest, ) + tuple(rows.shape[1:]))
        padded[:rows.size(0)] = rows
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous(), group=group)
        pmm._sent[0] += (len(sizes) - 1) * padded.numel() * padded.element_size()
        return torch.cat([part[:size] for part, size in zip(parts, sizes)])

    @staticmethod
    def backward(ctx, grad: Tensor):
        start = sum(ctx.sizes[:ctx.index])
        return grad[start:start + ctx.sizes[ctx.index]].contiguous(), None, None, None


class Grid3DScaleGNN(torch.nn.Module):
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
            gradients (backward) cross the wire as bfloat16, summed in fp32 (ScaleGNN §V);
            RMSNorm, the loss and the weight gradients stay fp32.  Lossy; halves those bytes.

    Shapes:
        - **input:** the mini-batch's node features :math:`(B, F_{in})`, edge indices
          :math:`(2, E_S)`, edge weights :math:`(E_S)` -- every process of a replica gets
          the same batch and keeps its blocks.
        - **output:** logits :math:`(B, F_{out})`, or of :meth:`output_rows` without
          :obj:`gather_output`.
    """

    def __init__(self, model: ScaleGNN, mesh: FourDMesh, seed: int = 0,
                 gather_output: bool = False, bf16_comm: bool = False) -> None:
        super().__init__()
        self.mesh, self.seed, self.gather_output = mesh, int(seed), bool(gather_output)
        self.bf16_comm = bool(bf16_comm)
        self.num_layers, self.eps, self.dropout = model.num_layers, model.eps, model.dropout
        self.in_channels, self.hidden = model.in_channels, model.hidden_channels
        self.out_channels = model.out_channels
        h, d = self.hidden, self.in_channels
        self._sum_over: Dict[str, Tuple[str, ...]] = {}

        def keep(name: str, value: Tensor, axes: Tuple[str, ...]) -> None:
            self.register_parameter(name, torch.nn.Parameter(value.detach().clone()))
            self._sum_over[name] = axes

        keep("w_in", model.lin_in.weight.t()[self._cols(d, "z"), self._cols(h, "y")], ("x", ))
        for layer in range(1, self.num_layers + 1):
            r, c, t = layer_axes(layer)
            weight = model.weights[layer - 1]
            keep(f"w{layer}", weight[self._cols(h, c), self._cols(h, r)], (t, ))
            keep(f"gamma{layer}", model.norms[layer - 1][self._cols(h, r)], (t, ))
        r, _, t = layer_axes(self.num_layers)
        # After the last layer the features are in (T_L, R_L).
        keep("w_out", model.lin_out.weight.t()[self._cols(h, r), :], (t, ))
        keep("b_out", model.lin_out.bias, (t, ))
        self._adjacency: Dict[tuple, Tuple[Tensor, Optional[Tensor]]] = {}
        self._batch_key: Optional[tuple] = None
        self.step = 0

    # -- blocks -----------------------------------------------------------------------------
    def _index(self, axis: str) -> Tuple[int, int]:
        return self.mesh.coordinate(axis), self.mesh.size(axis)

    def _cols(self, n: int, axis: str) -> slice:
        i, parts = self._index(axis)
        return block(n, parts, i)

    def output_rows(self, num_nodes: int) -> slice:
        r"""The batch rows whose logits :meth:`forward` returns."""
        _, _, t = layer_axes(self.num_layers)
        return self._cols(num_nodes, t)

    def _adjacency_block(self, edge_index: Tensor, edge_weight: Optional[Tensor], n: int,
                         dst_axis: str, src_axis: str) -> Tuple[Tensor, Optional[Tensor], int]:
        rows, cols = self._cols(n, dst_axis), self._cols(n, src_axis)
        key = (dst_axis, src_axis)
        if key not in self._adjacency:
            src, dst = edge_index[0], edge_index[1]
            keep = (dst >= rows.start) & (dst < rows.stop) & (src >= cols.start) & \
                (src < cols.stop)
            local = torch.stack([src[keep] - cols.start, dst[keep] - rows.start])
            self._adjacency[key] = (local, edge_weight[keep] if edge_weight is not None
                                    else None)
        local, weight = self._adjacency[key]
        return local, weight, rows.stop - rows.start

    # -- forward ----------------------------------------------------------------------------
    def forward(self, x: Tensor, edge_index: Tensor,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        n, h = x.size(0), self.hidden
        batch_key = (edge_index.data_ptr(), edge_index._version, tuple(edge_index.shape), n)
        if batch_key != self._batch_key:  # a new mini-batch: new adjacency blocks
            self._adjacency.clear()
            self._batch_key = batch_key
        group = self.mesh.group
        own = x[self._cols(n, "x"), self._cols(self.in_channels, "z")]
        bf16 = self.bf16_comm
        feats = reduce_from(own @ self.w_in, group("z"), bf16)  # (x, y), replicated along z
        for layer in range(1, self.num_layers + 1):
            r, c, t = layer_axes(layer)
            adj, weight, n_dst = self._adjacency_block(edge_index, edge_weight, n, t, r)
            agg = aggregate_sum(copy_to(feats, group(t), bf16), adj, weight, n_dst)
            agg = copy_to(reduce_from(agg, group(r), bf16), group(r), bf16)  # (t, c)
            xc = reduce_from(agg @ getattr(self, f"w{layer}"), group(c), bf16)  # (t, r)
            squares = all_reduce_sum(xc.pow(2).sum(-1, keepdim=True), group(r))
            xn = xc * torch.rsqrt(squares / h + self.eps) * getattr(self, f"gamma{layer}")
            out = self._dropout(F.relu(xn), layer, t, r)
            feats = out + self._reshard(feats, n, (r, c), (t, r))
        r = layer_axes(self.num_layers)[0]  # the features are in (T_L, R_L) now
        logits = reduce_from(feats @ self.w_out, group(r)) + self.b_out
        if self.training:
            self.step += 1
        if self.gather_output:
            t = layer_axes(self.num_layers)[2]
            parts = self.mesh.size(t)
            sizes = [block(n, parts, i).stop - block(n, parts, i).start for i in range(parts)]
            logits = _GatherRows.apply(logits, group(t), sizes, self.mesh.coordinate(t))
        return logits

    def _reshard(self, x: Tensor, n: int, src: Tuple[str, str], dst: Tuple[str, str]) -> Tensor:
        dims = self.mesh.dims
        members = [dims.coordinates(r) for r in dims.group_ranks("x", "y", "z")[
            self.mesh.coordinate("dp")]]
        me = members.index(dims.coordinates(self.mesh.rank))
        sizes = {a: self.mesh.size(a) for a in ("x", "y", "z")}
        return reshard(x, self.mesh.group("grid"), members, me, sizes, src, dst, n,
                       self.hidden)

    def _dropout(self, x: Tensor, layer: int, t: str, r: str) -> Tensor:
        if not self.training or self.dropout == 0.0:
            return x
        # The replicas of a block (along the third axis) draw the same mask.
        g = torch.Generator(device=x.device)
        g.manual_seed(sample_seed(self.seed, self.mesh.coordinate("dp"),
                                  ((self.step * 64 + layer) * 64 + self.mesh.coordinate(t)) * 64
                                  + self.mesh.coordinate(r)))
        keep = torch.rand(x.shape, generator=g, device=x.device) >= self.dropout
        return x * keep / (1.0 - self.dropout)

    # -- loss and gradients -----------------------------------------------------------------
    def loss(self, logits: Tensor, y: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        r"""This process's share of the batch's mean cross-entropy (the shares of the row
        blocks add up to the mean over the batch's masked nodes)."""
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

    def reduce_gradients(self) -> None:
        r"""Sums every block's gradient over the axes whose processes computed other rows'
        share of it, then averages over the data-parallel replicas (call after backward)."""
        for name, axes in self._sum_over.items():
            p = getattr(self, name)
            if p.grad is None:
                continue
            grad = p.grad
            for axis in axes:
                grad = summed(grad, self.mesh.group(axis))
            grad = summed(grad, self.mesh.group("dp")) / self.mesh.size("dp")
            p.grad.copy_(grad)

    def full_state_dict(self) -> Dict[str, Tensor]:
        r"""The :class:`ScaleGNN` ``state_dict`` assembled from every process's blocks (a
        collective over the replica's grid: every process of it must call it)."""
        full = {"w_in": (self.in_channels, self.hidden),
                "w_out": (self.hidden, self.out_channels), "b_out": (self.out_channels, )}
        for layer in range(1, self.num_layers + 1):
            full[f"w{layer}"] = (self.hidden, self.hidden)
            full[f"gamma{layer}"] = (self.hidden, )
        out: Dict[str, Tensor] = {}
        for name, param, index in self.blocks():
            value = param.detach().new_zeros(full[name])
            # One copy of each block: the process at coordinate 0 of its replicated axes.
            if all(self.mesh.coordinate(a) == 0 for a in self._replicated(name)):
                value[index] = param.detach()
            out[name] = summed(value, self.mesh.group("grid"))
        state = {"lin_in.weight": out["w_in"].t().contiguous(),
                 "lin_out.weight": out["w_out"].t().contiguous(), "lin_out.bias": out["b_out"]}
        for layer in range(1, self.num_layers + 1):
            state[f"weights.{layer - 1}"] = out[f"w{layer}"]
            state[f"norms.{layer - 1}"] = out[f"gamma{layer}"]
        return state

    @torch.no_grad()
    def load_full_state_dict(self, state: Dict[str, Tensor]) -> None:
        r"""Copies this process's blocks out of a :class:`ScaleGNN` ``state_dict`` into the
        existing parameters (an optimizer holding them stays valid); no communication."""
        full = {"w_in": state["lin_in.weight"].t(), "w_out": state["lin_out.weight"].t(),
                "b_out": state["lin_out.bias"]}
        for layer in range(1, self.num_layers + 1):
            full[f"w{layer}"] = state[f"weights.{layer - 1}"]
            full[f"gamma{layer}"] = state[f"norms.{layer - 1}"]
        for name, param, index in self.blocks():
            value = full[name][index]
            if value.shape != param.shape:
                raise ValueError(f"ScaleGNN state: '{name}' block {tuple(value.shape)} does not "
                                 f"match {tuple(param.shape)} (another model size?)")
            param.copy_(value)

    def _replicated(self, name: str) -> Tuple[str, ...]:
        # Grid axes along which a block is held more than once.
        split = {"w_in": ("z", "y"), "w_out": (layer_axes(self.num_layers)[0], ),
                 "b_out": ()}
        if name not in split:
            layer = int(name.lstrip("wgamma"))
            r, c, _ = layer_axes(layer)
            split[name] = (c, r) if name.startswith("w") else (r, )
        return tuple(a for a in ("x", "y", "z") if a not in split[name])

    def blocks(self) -> List[Tuple[str, Tensor, tuple]]:
        r"""``(name, block, index into the full parameter)`` of every block held (to compare
        or gather); the full parameter is the :class:`ScaleGNN` one in ``(in, out)`` order for
        the linear maps (``lin_in.weight.t()``, ``lin_out.weight.t()``)."""
        h, d = self.hidden, self.in_channels
        out = [("w_in", self.w_in, (self._cols(d, "z"), self._cols(h, "y")))]
        for layer in range(1, self.num_layers + 1):
            r, c, _ = layer_axes(layer)
            out.append((f"w{layer}", getattr(self, f"w{layer}"),
                        (self._cols(h, c), self._cols(h, r))))
            out.append((f"gamma{layer}", getattr(self, f"gamma{layer}"), (self._cols(h, r), )))
        r = layer_axes(self.num_layers)[0]
        out.append(("w_out", self.w_out, (self._cols(h, r), slice(None))))
        out.append(("b_out", self.b_out, (slice(None), )))
        return out
