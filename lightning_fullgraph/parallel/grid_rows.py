r"""Any supported PyG model over a replica's 3-D grid: rows split over the whole grid between
the message-passing layers, each layer a 3-D parallel product.

ScaleGNN's own model and PyG's ``GCN(normalize=False)`` rotate their features' layouts from
layer to layer (:mod:`.grid3d`, :mod:`.gcn3d`).  Other models interleave their convolutions
with code of their own (activations, dropout, jumping knowledge, a ``Linear`` head, ``x +
h`` residuals) that cannot know a layout.  :class:`GridRowsModel` gives that code the one
layout every row-wise operation is right on: **each process holds whole rows**, the batch's
rows split over the grid's processes (in the grid group's rank order).  A convolution
(:class:`GridConv`) moves its input into the 3-D layouts, runs the aggregation and its linear
maps as ScaleGNN's parallel products (weight blocks split over the grid, as in
:mod:`.pmm`), and moves the result back to whole rows:

.. code-block:: text

    rows (x,y,z)  --reshard-->  (x, y)  --Ã over x-->  (z, y)  --W over y-->  (z, x)
                                                                  --reshard-->  rows (x,y,z)

so the model's other modules run unchanged on row blocks: they must act on each node's row
alone (``Linear``, ``LayerNorm``, activations, dropout, jumping knowledge); their parameters
are replicated and their gradients summed over the grid (each process's rows add their
share).  The model's output rows are gathered on every process, so an unmodified
``loss(out[mask], y[mask])`` works; its input rows are cut from the batch every process holds,
and the gradient of an input that needs one is summed over the grid (modules before the model
see the whole gradient).

Convolutions (as PyG computes them on the batch, on one process):

* :class:`~torch_geometric.nn.conv.GCNConv` -- ``normalize`` (``gcn_norm`` on the whole
  batch, computed by every process), ``add_self_loops``, ``improved``, edge weights;
  ``cached=True`` is refused (a sampled batch is another graph at every step);
* :class:`~torch_geometric.nn.conv.SAGEConv` -- ``aggr`` ``"mean"`` or ``"sum"``,
  ``root_weight``, ``normalize``; ``project=True`` is refused;
* :class:`~torch_geometric.nn.conv.GraphConv` -- ``aggr`` ``"add"``, ``"sum"`` or
  ``"mean"``, edge weights;
* :class:`~torch_geometric.nn.conv.GINConv` -- ``eps`` (trainable or not); its ``nn`` runs
  on whole rows, so it obeys the row-wise rule above.

Refused by name (:func:`check_rows_convertible`): other message-passing layers, and modules
with parameters or buffers inside the model that are not known to act row by row (batch
statistics such as ``BatchNorm`` mix rows).
"""
import copy
import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .grid_module import GridModule, _GatherRows
from .mesh import FourDMesh
from .pmm import block, copy_to, layer_axes, reduce_from, summed

__all__ = ["GridRowsModel", "GridConv", "check_rows_convertible", "ROWS"]

#: The layout between the layers: rows over the whole grid (the grid group's rank order),
#: features whole.
ROWS = (("x", "y", "z"), ())
# One parallel product per layer, always on the same axes (the layouts return to ROWS):
# those of the first layer of a rotating split.
_LAYER = 1
_R, _C, _T = layer_axes(_LAYER)


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _under(path: str, prefix: str) -> bool:
    r"""Whether module :obj:`path` lies strictly inside module :obj:`prefix` (``""``: the
    root)."""
    return path != prefix and (not prefix or path.startswith(prefix + "."))


def _conv_classes():
    from torch_geometric.nn.conv import GCNConv, GINConv, GraphConv, SAGEConv
    return GCNConv, SAGEConv, GraphConv, GINConv


def _row_wise_classes():
    from torch_geometric.nn import MLP, JumpingKnowledge
    from torch_geometric.nn.dense.linear import Linear as PyGLinear
    return (torch.nn.Linear, PyGLinear, torch.nn.LayerNorm, torch.nn.PReLU, torch.nn.LSTM,
            JumpingKnowledge, MLP, torch.nn.Dropout, torch.nn.Identity, torch.nn.Sequential,
            torch.nn.ModuleList, torch.nn.ModuleDict)


def _refuse_conv(conv: torch.nn.Module, name: str) -> None:
    GCNConv, SAGEConv, GraphConv, GINConv = _conv_classes()
    aggr = getattr(conv, "aggr", None)
    if getattr(conv, "in_channels", None) == -1 or (
            isinstance(getattr(conv, "in_channels", None), tuple) and -1 in conv.in_channels):
        raise TypeError(f"'{name}' is a lazy {type(conv).__name__} (in_channels=-1): run one "
                        "forward on one process first, or give in_channels, so that its "
                        "weights exist to be split")
    if isinstance(conv, GCNConv) and conv.cached:
        raise TypeError(f"'{name}' is a GCNConv(cached=True): a sampled batch is another graph "
                        "at every step; build it with cached=False")
    if isinstance(conv, SAGEConv):
        if aggr not in ("mean", "sum", "add"):
            raise TypeError(f"'{name}' is a SAGEConv(aggr={aggr!r}): only 'mean' and 'sum' "
                            "can be split over a grid")
        if conv.project:
            raise TypeError(f"'{name}' is a SAGEConv(project=True), which cannot be split "
                            "over a grid yet")
    if isinstance(conv, GraphConv) and aggr not in ("mean", "sum", "add"):
        raise TypeError(f"'{name}' is a GraphConv(aggr={aggr!r}): only 'add' and 'mean' can "
                        "be split over a grid")


def check_rows_convertible(model: torch.nn.Module, name: str = "model") -> None:
    r"""Raises a :class:`TypeError` naming the first module of :obj:`model` (at :obj:`name`)
    that :class:`GridRowsModel` cannot split (see the module docstring)."""
    from torch_geometric.nn import LayerNorm as PyGLayerNorm
    from torch_geometric.nn.conv import MessagePassing

    convs, row_wise = _conv_classes(), _row_wise_classes()
    inside_conv: List[str] = []
    for path, module in model.named_modules():
        where = f"{name}.{path}" if path else name
        if any(_under(path, p) for p in inside_conv):
            if not any(_under(path, _join(p, "nn")) or path == _join(p, "nn")
                       for p in inside_conv):
                continue  # a convolution's own linear maps: split with it
        if isinstance(module, MessagePassing):
            if type(module) not in convs:
                raise TypeError(
                    f"'{where}' is a {type(module).__name__}: a grid splits GCNConv, SAGEConv, "
                    "GraphConv and GINConv layers (attention and other layers are not split "
                    "yet); train this model data parallel with grid=(1, 1, 1)")
            _refuse_conv(module, where)
            inside_conv.append(path)
            continue
        if isinstance(module, PyGLayerNorm):
            if module.mode != "node":
                raise TypeError(f"'{where}' is a LayerNorm(mode={module.mode!r}), whose "
                                "statistics span the rows; use mode='node' on a grid")
            continue
        owns = any(True for _ in module.parameters(recurse=False)) or \
            any(True for _ in module.buffers(recurse=False))
        if owns and not isinstance(module, row_wise):
            raise TypeError(
                f"'{where}' is a {type(module).__name__}: inside a model split over a grid, "
                "every module but the convolutions runs on blocks of rows, so only modules "
                "known to act row by row (Linear, LayerNorm, activations, dropout, jumping "
                "knowledge) may hold parameters or buffers (batch statistics such as "
                "BatchNorm mix rows); train this model data parallel with grid=(1, 1, 1)")
    if not inside_conv:
        raise TypeError(f"'{name}' holds no GCNConv, SAGEConv, GraphConv or GINConv layer to "
                        "split over a grid")




class _CutRows(torch.autograd.Function):
    r"""This process's rows of a tensor every process of the grid holds whole; the gradient
    of the whole tensor, summed over the grid, in backward (what came before runs on every
    process alike and must see every row's gradient)."""

    @staticmethod
    def forward(ctx, x: Tensor, rows: slice, group) -> Tensor:
        ctx.rows, ctx.group, ctx.shape = rows, group, x.shape
        return x[rows]

    @staticmethod
    def backward(ctx, grad: Tensor):
        full = grad.new_zeros(ctx.shape)
        full[ctx.rows] = grad
        return summed(full, ctx.group), None, None


class GridConv(GridModule):
    r"""This process's blocks of one convolution (see the module docstring), on whole rows
    in and out.

    Args:
        conv (MessagePassing): A ``GCNConv``, ``SAGEConv``, ``GraphConv`` or ``GINConv``.
        mesh (FourDMesh): This rank's groups.
        bf16_comm (bool): The parallel products' partial sums, their gradients and the
            weight-gradient reduction as bfloat16 (:func:`~.pmm.summed`).

    Shapes:
        - **input:** this process's rows :math:`(B_p, F_{in})`, the batch's edge indices
          :math:`(2, E_S)` (every process holds them), edge weights :math:`(E_S)`
          *(optional)*.
        - **output:** this process's rows :math:`(B_p, F_{out})`.
    """

    def __init__(self, conv: torch.nn.Module, mesh: FourDMesh, bf16_comm: bool = False) -> None:
        GCNConv, SAGEConv, GraphConv, GINConv = _conv_classes()
        _refuse_conv(conv, type(conv).__name__)
        super().__init__(mesh, 0, bf16_comm)
        self.kind = {GCNConv: "gcn", SAGEConv: "sage", GraphConv: "graph",
                     GINConv: "gin"}[type(conv)]
        self.conv_repr = repr(conv)
        self.n = 0  # the batch's rows, set by GridRowsModel before each forward
        self._matrix_cache: Optional[tuple] = None
        if self.kind == "gin":
            self.in_channels = self.out_channels = None
            self.aggr = "add"
            self.nn = conv.nn
            if isinstance(conv.eps, torch.nn.Parameter):
                self.eps = conv.eps
            else:
                self.register_buffer("eps", conv.eps.detach().clone())
            return
        self.in_channels = conv.in_channels if isinstance(conv.in_channels, int) \
            else conv.in_channels[0]
        self.out_channels = conv.out_channels
        self.aggr = getattr(conv, "aggr", "add")
        if self.kind == "gcn":
            self.normalize, self.improved = conv.normalize, conv.improved
            self.add_self_loops = conv.add_self_loops
            self.keep("w", conv.lin.weight, "lin.weight", (_C, _R), (_T, ), transpose=True)
            self._bias(conv.bias, "bias")
        elif self.kind == "sage":
            self.normalize = conv.normalize
            self.keep("w", conv.lin_l.weight, "lin_l.weight", (_C, _R), (_T, ), transpose=True)
            self._bias(conv.lin_l.bias, "lin_l.bias")
            self.root = conv.root_weight
            if self.root:
                self.keep("w_root", conv.lin_r.weight, "lin_r.weight", (_C, _R), (_T, ),
                          transpose=True)
        else:  # GraphConv
            self.keep("w", conv.lin_rel.weight, "lin_rel.weight", (_C, _R), (_T, ),
                      transpose=True)
            self._bias(conv.lin_rel.bias, "lin_rel.bias")
            self.root = True
            self.keep("w_root", conv.lin_root.weight, "lin_root.weight", (_C, _R), (_T, ),
                      transpose=True)

    def _bias(self, bias: Optional[Tensor], key: str) -> None:
        self.has_bias = bias is not None
        if bias is not None:
            self.keep("b", bias, key, (_R, ), (_T, ))

    # -- the aggregation matrix of the batch (every process computes it whole) ---------------
    def _matrix(self, edge_index: Tensor, edge_weight: Optional[Tensor], n: int,
                dtype: torch.dtype) -> Tuple[Tensor, Optional[Tensor]]:
        if self.kind == "gcn":
            if self.normalize:
                from torch_geometric.nn.conv.gcn_conv import gcn_norm
                return gcn_norm(edge_index, edge_weight, n, self.improved, self.add_self_loops,
                                "source_to_target", dtype)
            return edge_index, edge_weight
        weight = edge_weight if self.kind == "graph" else None
        if self.aggr == "mean":
            degree = torch.zeros(n, dtype=dtype, device=edge_index.device)
            degree.index_add_(0, edge_index[1], torch.ones_like(edge_index[1], dtype=degree.dtype))
            scale = 1.0 / degree.clamp_min(1.0)[edge_index[1]]
            weight = scale if weight is None else weight * scale
        return edge_index, weight

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Optional[Tensor] = None,
                *args, **kwargs) -> Tensor:
        if args or kwargs:
            raise TypeError(f"a grid-split {type(self).__name__} ({self.conv_repr}) takes "
                            "(x, edge_index[, edge_weight]); got more arguments")
        n, group, bf16 = self.n, self.mesh.group, self.bf16_comm
        width = x.size(1)
        adj_index, adj_weight = self._batch_matrix(edge_index, edge_weight, n, x.dtype)
        feats = self.reshard(x, n, width, ROWS, (_R, _C))  # (x, y)
        agg = self.aggregate(feats, _LAYER, adj_index, adj_weight, n)  # (z, y)
        if self.kind == "gin":
            # Every replica along R moves the same sum back to rows (the reshard's backward
            # hands each the whole gradient): no copy_to, whose backward would add them up.
            h = self.reshard(agg, n, width, (_T, _C), ROWS)
            return self.nn(h + (1 + self.eps) * x)
        agg = copy_to(agg, group(_R), bf16)  # R's processes use it for other columns
        out = agg @ self.w
        if getattr(self, "root", False):
            root = self.reshard(x, n, width, ROWS, (_T, _C))
            out = out + copy_to(root, group(_R), bf16) @ self.w_root
        out = reduce_from(out, group(_C), bf16)  # (z, x)
        if self.has_bias:
            out = out + self.b
        out = self.reshard(out, n, self.out_channels, (_T, _R), ROWS)
        if self.kind == "sage" and self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def _batch_matrix(self, edge_index: Tensor, edge_weight: Optional[Tensor], n: int,
                      dtype: torch.dtype) -> Tuple[Tensor, Optional[Tensor]]:
        # Once per batch (the adjacency blocks are then cut from it once too).
        if self.new_batch(edge_index, n) or self._matrix_cache is None \
                or self._matrix_cache[0] is not edge_weight:
            self._matrix_cache = (edge_weight, self._matrix(edge_index, edge_weight, n, dtype))
            self._adjacency.clear()
        return self._matrix_cache[1]

    def extra_repr(self) -> str:
        return f"{self.conv_repr}, grid={tuple(self.mesh.size(a) for a in 'xyz')}"


class GridRowsModel(GridModule):
    r"""A PyG model split over a replica's grid with whole rows between its layers (see the
    module docstring): its convolutions replaced by :class:`GridConv` blocks, everything else
    run as written on this process's rows.

    Args:
        model (torch.nn.Module): The model (the same initial weights on every process); its
            ``forward`` takes ``(x, edge_index, ...)`` and returns one row per node.
        mesh (FourDMesh): This rank's groups.
        seed (int): Unused (dropout runs as the model draws it: no two processes hold the
            same row); kept for :class:`~.surgery.GridSplit`'s signature.
        bf16_comm (bool): bfloat16 partial sums and gradients on the wire (lossy).

    Shapes:
        - **input:** node features :math:`(B, F_{in})`, edge indices :math:`(2, E_S)`, the
          model's further arguments -- the same batch on every process of a replica.
        - **output:** the model's output rows :math:`(B, F_{out})` on every process.
    """

    def __init__(self, model: torch.nn.Module, mesh: FourDMesh, seed: int = 0,
                 bf16_comm: bool = False) -> None:
        check_rows_convertible(model)
        super().__init__(mesh, seed, bf16_comm)
        self.model = copy.deepcopy(model)
        convs = _conv_classes()
        self._convs: Dict[str, GridConv] = {}
        for path, module in list(self.model.named_modules()):
            if type(module) in convs and not any(_under(path, p) for p in self._convs):
                parent, _, attr = path.rpartition(".")
                split = GridConv(module, mesh, bf16_comm)
                if not path:  # the model is one convolution
                    self.model = split
                else:
                    setattr(self.model.get_submodule(parent) if parent else self.model, attr,
                            split)
                self._convs[path] = split
        self._block_names = {_join("model", path, name) for path, conv in self._convs.items()
                             for name in conv._blocks}

    def shard_layout(self):
        # Whole rows in; every convolution multiplies the layer-1 block (T, R).
        return (None, None), frozenset({(_T, _R)})

    def _rows(self, n: int) -> Tuple[slice, List[int], int]:
        # The grid group's rank order: x slowest, z fastest (FourDDims' strides).
        sizes_xyz = [self.mesh.size(a) for a in ("x", "y", "z")]
        size = math.prod(sizes_xyz)
        index = (self.mesh.coordinate("x") * sizes_xyz[1] + self.mesh.coordinate("y")) \
            * sizes_xyz[2] + self.mesh.coordinate("z")
        sizes = [block(n, size, i).stop - block(n, size, i).start for i in range(size)]
        return block(n, size, index), sizes, index

    def forward(self, x: Tensor, edge_index: Tensor, *args, **kwargs) -> Tensor:
        n = x.size(0)
        for conv in self._convs.values():
            conv.n = n
        rows, sizes, index = self._rows(n)
        group = self.mesh.group("grid")
        out = self.model(_CutRows.apply(x, rows, group), edge_index, *args, **kwargs)
        if self.training:
            self.step += 1
        return _GatherRows.apply(out, group, sizes, index)

    # -- the single-process state_dict ------------------------------------------------------
    def _row_wise(self) -> List[Tuple[str, torch.nn.Parameter]]:
        return [(name, p) for name, p in self.named_parameters()
                if name not in self._block_names]

    def full_state_dict(self) -> Dict[str, Tensor]:
        out = {k[len("model."):]: v for k, v in self.state_dict().items()
               if k.startswith("model.") and k not in self._block_names}
        for path, conv in self._convs.items():
            out.update({_join(path, k): v for k, v in conv.full_state_dict().items()})
        return out

    @torch.no_grad()
    def load_full_state_dict(self, state: Dict[str, Tensor]) -> None:
        state = dict(state)
        for path, conv in self._convs.items():
            prefix = path + "." if path else ""
            conv.load_full_state_dict({k[len(prefix):]: v for k, v in state.items()
                                       if k.startswith(prefix) and
                                       k[len(prefix):] in {i.key for i in conv._blocks.values()}})
            for info in conv._blocks.values():
                state.pop(prefix + info.key, None)
        own = self.model.state_dict()
        for key, value in state.items():
            if key not in own:
                raise KeyError(f"state_dict has '{key}', which the split model does not hold")
            own[key].copy_(value)

    def blocks(self):
        return [(_join(path, name), b, index) for path, conv in self._convs.items()
                for name, b, index in conv.blocks()]

    # -- gradients -----------------------------------------------------------------------------
    def reduce_gradients(self, coalesce: bool = True) -> None:
        r"""The convolutions' blocks as :meth:`GridModule.reduce_gradients` reduces them; every
        other parameter (replicated, each process's rows adding their share) summed over the
        grid, then averaged over the replicas, in one buffer."""
        for conv in self._convs.values():
            conv.reduce_gradients(coalesce)
        rest = [p for _, p in self._row_wise() if p.grad is not None]
        if not rest:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in rest])
        flat = summed(flat, self.mesh.group("grid"), self.bf16_comm)
        flat = summed(flat, self.mesh.group("dp"), self.bf16_comm) / self.mesh.size("dp")
        offset = 0
        for p in rest:
            k = p.grad.numel()
            p.grad.copy_(flat[offset:offset + k].view_as(p.grad))
            offset += k

    def extra_repr(self) -> str:
        return f"grid={tuple(self.mesh.size(a) for a in 'xyz')}, rows between layers"
