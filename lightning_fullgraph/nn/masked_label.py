r"""Masked label propagation (SuperGCN, ICS'25, §2.5 and §6.1) around an unmodified PyG model.

Every training step a random half (``rate``) of the *training* nodes gets a learnable
embedding of its true label added to its input features, :math:`x'_v = x_v + W_{emb}[y_v]`;
the other training nodes carry the loss.  Message passing then propagates labels alongside
features (SuperGCN's Lemma 2: :math:`A(X + Y W_{emb})W = AXW + AYW_{emb}W`), and a node whose
loss is computed never sees its own label, so nothing leaks (UniMP's masked label prediction,
which SuperGCN cites).  SuperGCN adds LayerNorm on the hidden embeddings before each GNN layer
to keep per-row ranges, and so int2 quantization error, small.

Partitioned exactness: the selection is a counter-based hash of ``(seed, step, global node
id)``, not a draw from a random generator, so a node is selected the same way whichever rank
owns it and however many ranks there are: :math:`P` ranks select exactly what one process
selects.  The loss mask's size then varies per step and per rank, which the engine's static
``scale_loss`` (a fixed share of ``train_mask``) cannot weight; :func:`scale_masked_loss`
weights the rank-local mean by its share of the all-reduced count instead.

Choices where the paper is silent (design spec §A1.3, §A4.7–8, §E.3):

* rate 0.5; a fresh selection every step (ICS; ``resample="once"`` keeps step 0's, as the arXiv
  draft does);
* eval: every training node gets its label as input, validation and test nodes never (UniMP's
  convention, SuperGCN does not say; ``eval_labels="none"`` gives none);
* LayerNorm (``torch.nn.LayerNorm``, per node: no cross-node statistics, so partitioning needs
  nothing) before every message-passing layer but the first; ``input_norm`` adds one before the
  first, on the features plus labels.

Usage in a LightningModule (works unchanged on one device and under
:class:`~lightning_fullgraph.FullGraphStrategy`, which must then be told the loss is already
each rank's term: ``FullGraphStrategy(loss_reduction="sum")``)::

    self.model = MaskedLabelInput(GraphSAGE(F, 256, 3, C), num_classes=C, in_channels=F,
                                  layer_norm=True)

    def training_step(self, batch, _):
        out = self.model(batch.x, batch.edge_index, y=batch.y, train_mask=batch.train_mask,
                         n_id=getattr(batch, "n_id", None), step=self.global_step)
        mask = self.model.last_loss_mask
        loss = F.cross_entropy(out[mask], batch.y[mask])
        engine = getattr(self.trainer.strategy, "engine", None)
        return scale_masked_loss(loss, mask, getattr(engine, "group", None))

The first layer's input now requires a gradient (``W_emb`` trains), so the engine exchanges
its halo gradients backward too, which it skips for raw features.
"""
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing

from ..engine.draws import node_draws

__all__ = ["MaskedLabelInput", "label_selection", "scale_masked_loss", "mask_share"]

_RESAMPLE = ("step", "once")
_EVAL_LABELS = ("train", "none")


def label_selection(n_id: Tensor, rate: float, seed: int, step: int) -> Tensor:
    r"""Which nodes are drawn in step :obj:`step`: a pure function of the global node ids.

    Node :math:`v` is drawn when :math:`h(\text{seed}, \text{step}, v) < \text{rate} \cdot 2^{32}`
    for a 32-bit counter-based hash :math:`h`, so every node is drawn independently with
    probability :obj:`rate` (to :math:`2^{-32}`), and the same node is drawn the same way on
    every rank and device.

    Args:
        n_id (torch.Tensor): Global node ids (integers :math:`\ge 0`).
        rate (float): Probability of being drawn, in :math:`[0, 1]`.
        seed (int): Seed shared by all ranks.
        step (int): Training step.

    Returns:
        A boolean mask like :obj:`n_id`.

    Shapes:
        - **input:** :math:`(N,)`
        - **output:** :math:`(N,)`, ``torch.bool``
    """
    return node_draws(n_id, rate, f"masked-label|{int(seed)}|{int(step)}")


def _all_reduce_count(count: int, group: Optional[Any], device: torch.device) -> int:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return count
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        device = torch.device("cpu")
    total = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(total, group=group)
    return int(total.item())


def mask_share(mask: Tensor, group: Optional[Any] = None) -> float:
    r"""This rank's share :math:`n_r / \sum_s n_s` of the :obj:`True` entries of :obj:`mask`.

    A collective over :obj:`group` (every rank must call it); 1 without a process group,
    0 when no rank has any.

    Args:
        mask (torch.Tensor): Boolean node mask of this rank (e.g. the loss mask).
        group (ProcessGroup, optional): The ranks (default: the world; under
            :class:`~lightning_fullgraph.FullGraphStrategy` pass ``strategy.engine.group``).
    """
    local = int(mask.sum())
    total = _all_reduce_count(local, group, mask.device)
    return local / total if total else 0.0


def scale_masked_loss(loss: Tensor, mask: Tensor, group: Optional[Any] = None) -> Tensor:
    r"""A rank-local mean loss over :obj:`mask` → this rank's term of the global mean.

    Summed over ranks (which the gradient all-reduce does), the terms are the mean over the
    union of all ranks' masks, i.e. the single-process loss, however the mask's nodes are
    spread over ranks this step.  Use it with ``FullGraphStrategy(loss_reduction="sum")`` (the
    strategy's default ``"mean"`` weights by the static share of ``train_mask`` instead).  A
    rank without mask nodes returns zero (not the NaN of an empty mean) that still depends on
    the model's output, so its backward pass joins the halo exchanges of the other ranks.

    Args:
        loss (torch.Tensor): Mean loss over this rank's :obj:`mask` nodes (scalar).
        mask (torch.Tensor): The rank's loss mask.
        group (ProcessGroup, optional): See :func:`mask_share`.
    """
    share = mask_share(mask, group)
    if share == 0.0:
        return loss.nan_to_num(0.0) * 0.0
    return loss * share


class _PreNorm:
    r"""Forward pre-hook: normalizes the first (node feature) input of a layer.

    A callable object rather than a closure, so that ``copy.deepcopy`` of the wrapper gives the
    copy's layers hooks that use the copy's norms.
    """

    def __init__(self, norm: torch.nn.Module) -> None:
        self.norm = norm

    def __call__(self, module: torch.nn.Module, args: tuple, kwargs: dict):
        if args and isinstance(args[0], Tensor):
            return (self.norm(args[0]), ) + tuple(args[1:]), kwargs
        if isinstance(kwargs.get("x"), Tensor):
            return args, dict(kwargs, x=self.norm(kwargs["x"]))
        return None


class MaskedLabelInput(torch.nn.Module):
    r"""Adds masked label embeddings to the input of an unmodified PyG model (SuperGCN).

    In training mode, :meth:`forward` draws the *input* nodes (training nodes whose label
    embedding is added to their features) with :func:`label_selection` from ``(seed, step,
    n_id)``; the remaining training nodes are the *loss* nodes (:attr:`last_loss_mask`,
    :meth:`loss_mask`).  In eval mode every training node gets its label (``eval_labels="train"``)
    and no other node ever does.

    Args:
        model (torch.nn.Module): The PyG model, called as ``model(x, edge_index, *args,
            **kwargs)``.  It is not modified, except that ``layer_norm``/``input_norm`` register
            forward pre-hooks on its message-passing layers.
        num_classes (int): Number of classes :math:`C`.
        in_channels (int): Input features :math:`F` (the label embedding's width).
        rate (float): Probability that a training node is an input node in a step.
        seed (int): Seed of the selection (shared by all ranks).
        resample (str): ``"step"`` (a new selection every step, SuperGCN ICS) or ``"once"``
            (step 0's selection throughout, the arXiv draft).
        eval_labels (str): ``"train"`` (all training labels as input in eval mode) or
            ``"none"``.
        layer_norm (bool): ``torch.nn.LayerNorm`` before every message-passing layer of
            :obj:`model` but the first (owned by this module, in its state dict).
        input_norm (bool): Also before the first message-passing layer.
        norm_channels (Sequence[int], optional): Input widths of the normalized layers, in
            order, when their ``in_channels`` does not say (lazy layers).

    Shapes:
        - **input:** node features :math:`(N, F)`, ``edge_index`` :math:`(2, E)`, ``y``
          :math:`(N,)` or :math:`(N, 1)`, ``train_mask`` :math:`(N,)`, ``n_id`` :math:`(N,)`
        - **output:** the model's output, :math:`(N, *)`
    """

    def __init__(self, model: torch.nn.Module, num_classes: int, in_channels: int,
                 rate: float = 0.5, seed: int = 0, resample: str = "step",
                 eval_labels: str = "train", layer_norm: bool = False, input_norm: bool = False,
                 norm_channels: Optional[Sequence[int]] = None) -> None:
        super().__init__()
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {rate}")
        if resample not in _RESAMPLE:
            raise ValueError(f"resample must be one of {_RESAMPLE}, got {resample!r}")
        if eval_labels not in _EVAL_LABELS:
            raise ValueError(f"eval_labels must be one of {_EVAL_LABELS}, got {eval_labels!r}")
        self.model = model
        self.num_classes = int(num_classes)
        self.label_emb = torch.nn.Embedding(self.num_classes, int(in_channels))
        self.rate = float(rate)
        self.seed = int(seed)
        self.resample = resample
        self.eval_labels = eval_labels
        #: The loss mask of the last training-mode :meth:`forward` (``None`` before one).
        self.last_loss_mask: Optional[Tensor] = None
        self.norms = torch.nn.ModuleList()
        layers = [m for m in model.modules() if isinstance(m, MessagePassing)]
        normalized = layers if input_norm else layers[1:]
        if (layer_norm or input_norm) and normalized:
            self._add_norms(normalized, norm_channels)

    def _add_norms(self, layers: List[MessagePassing], channels: Optional[Sequence[int]]) -> None:
        if channels is not None and len(channels) != len(layers):
            raise ValueError(f"norm_channels has {len(channels)} widths for {len(layers)} "
                             "normalized layers")
        for i, layer in enumerate(layers):
            width = channels[i] if channels is not None else getattr(layer, "in_channels", None)
            if isinstance(width, (tuple, list)):
                width = width[0]  # (source, target) widths: x is the source side
            if not isinstance(width, int) or width <= 0:
                raise ValueError(f"cannot tell the input width of {type(layer).__name__} "
                                 f"(in_channels={width!r}); pass norm_channels")
            norm = torch.nn.LayerNorm(width)
            self.norms.append(norm)
            layer.register_forward_pre_hook(_PreNorm(norm), with_kwargs=True)

    def remove_norm_hooks(self) -> None:
        r"""Removes the LayerNorm pre-hooks from the model's layers (the norms stay)."""
        for module in self.model.modules():
            for key, hook in list(module._forward_pre_hooks.items()):
                if isinstance(hook, _PreNorm):
                    del module._forward_pre_hooks[key]
                    module._forward_pre_hooks_with_kwargs.pop(key, None)

    # -- selection -----------------------------------------------------------------------------
    def _step(self, step: Optional[int]) -> int:
        if self.resample == "once":
            return 0
        if step is None:
            raise ValueError("MaskedLabelInput needs the training step in training mode "
                             "(e.g. step=self.global_step in a LightningModule), so that the "
                             "selection changes every step and is the same on every rank")
        return int(step)

    def split(self, train_mask: Tensor, n_id: Optional[Tensor] = None,
              step: Optional[int] = None) -> Tuple[Tensor, Tensor]:
        r"""``(input_mask, loss_mask)`` of a training step: a partition of :obj:`train_mask`.

        Args:
            train_mask (torch.Tensor): Training nodes (boolean, rank-local).
            n_id (torch.Tensor, optional): Global ids of the rows (default
                ``arange(N)``: one process holding the whole graph).
            step (int, optional): Training step (required unless ``resample="once"``).
        """
        train_mask = train_mask.bool()
        if n_id is None:
            n_id = torch.arange(train_mask.numel(), device=train_mask.device)
        if n_id.numel() != train_mask.numel():
            raise ValueError(f"n_id has {n_id.numel()} ids for {train_mask.numel()} nodes")
        drawn = label_selection(n_id.to(train_mask.device), self.rate, self.seed,
                                self._step(step))
        return train_mask & drawn, train_mask & ~drawn

    def loss_mask(self, train_mask: Tensor, n_id: Optional[Tensor] = None,
                  step: Optional[int] = None) -> Tensor:
        r"""The training nodes whose loss is computed in step :obj:`step` (see :meth:`split`)."""
        return self.split(train_mask, n_id, step)[1]

    # -- forward -------------------------------------------------------------------------------
    def label_input(self, x: Tensor, y: Tensor, input_mask: Tensor) -> Tensor:
        r""":math:`x + W_{emb}[y] \cdot \mathbb{1}[\text{input}]`, computed for every row.

        Rows outside :obj:`input_mask` look up class 0 and add it times zero, so their labels
        are never read, and the result takes part in autograd on every rank alike (a rank
        whose input mask happens to be empty still exchanges the first layer's gradients).
        """
        if y.dim() == 2 and y.size(1) == 1:
            y = y.view(-1)
        labels = torch.where(input_mask, y.long(), torch.zeros_like(y, dtype=torch.long))
        emb = self.label_emb(labels) * input_mask.unsqueeze(-1).to(self.label_emb.weight.dtype)
        return x + emb.to(x.dtype)

    def forward(self, x: Tensor, edge_index: Any, *args: Any, y: Tensor, train_mask: Tensor,
                n_id: Optional[Tensor] = None, step: Optional[int] = None, **kwargs: Any) -> Any:
        r"""Runs the model on the features with the input nodes' label embeddings added.

        Args:
            x (torch.Tensor): Node features.
            edge_index: The model's graph argument.
            *args: Further positional arguments of the model.
            y (torch.Tensor): Labels of the rows (read only at input nodes).
            train_mask (torch.Tensor): Training nodes of the rows.
            n_id (torch.Tensor, optional): Global ids of the rows (``batch.n_id`` of a
                partition; default ``arange(N)``).
            step (int, optional): Training step (training mode, ``resample="step"``).
            **kwargs: Further keyword arguments of the model.
        """
        if self.training:
            input_mask, self.last_loss_mask = self.split(train_mask, n_id, step)
        elif self.eval_labels == "train":
            input_mask = train_mask.bool()
        else:
            input_mask = torch.zeros_like(train_mask, dtype=torch.bool)
        return self.model(self.label_input(x, y, input_mask), edge_index, *args, **kwargs)
