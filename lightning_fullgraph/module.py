"""A node-classification LightningModule written for one device.

Nothing in it knows about partitions: it is what a PyG user writes for
``LightningNodeData(loader="full")``, and the CLI, the examples and the tests
train it unchanged on one process or under :class:`FullGraphStrategy`.
"""
from typing import Callable, Optional, Union

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
import torchmetrics
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

__all__ = ["MODELS", "build_model", "NodeClassifier"]

#: Model names accepted by :func:`build_model` and the CLI.
MODELS = {"gcn": GCN, "sage": GraphSAGE, "gat": GAT, "gin": GIN}


def build_model(name: str, in_channels: int, hidden_channels: int, out_channels: int,
                num_layers: int = 2, dropout: float = 0.5, norm: Optional[str] = None,
                heads: int = 2) -> torch.nn.Module:
    r"""Builds one of PyG's :class:`~torch_geometric.nn.models.BasicGNN` models.

    Args:
        name (str): ``"gcn"``, ``"sage"``, ``"gat"`` or ``"gin"``.
        in_channels (int): Input features.
        hidden_channels (int): Hidden features.
        out_channels (int): Classes.
        num_layers (int): Message-passing layers.
        dropout (float): Dropout between layers.
        norm (str, optional): Normalization between layers (e.g. ``"batch_norm"``).
        heads (int): Attention heads (``"gat"`` only).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; choose from {sorted(MODELS)}")
    kwargs = dict(heads=heads) if name == "gat" else {}
    return MODELS[name](in_channels, hidden_channels, num_layers, out_channels,
                        dropout=dropout, norm=norm, **kwargs)


class NodeClassifier(pl.LightningModule):
    r"""Node classification with cross-entropy on ``train_mask`` (full batch), or on the
    seed nodes of a ``NeighborLoader`` mini-batch (the first ``batch.batch_size`` nodes).

    Args:
        model (torch.nn.Module or Callable): A PyG model called as
            ``model(x, edge_index)``, or a factory ``model(num_features, num_classes)``
            called in :meth:`configure_model` with the data module's dimensions (so
            that no process has to load the graph just to size the model).
        num_classes (int, optional): Number of classes (read from the data module
            when a factory is given).
        lr (float): Adam learning rate.
        weight_decay (float): Adam weight decay.
        input_dropout (float): Dropout on the input features (Kipf & Welling).
        use_edge_weight (bool): Pass the batch's ``edge_weight`` to the model (the sampled
            mini-batches of :class:`~lightning_fullgraph.data.sampled.SampledNodeDataModule`
            carry normalized, rescaled weights).
    """

    def __init__(self, model: Union[torch.nn.Module, Callable[[int, int], torch.nn.Module]],
                 num_classes: Optional[int] = None, lr: float = 0.01,
                 weight_decay: float = 5e-4, input_dropout: float = 0.5,
                 use_edge_weight: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["model"])
        self._factory = None
        if isinstance(model, torch.nn.Module):
            if num_classes is None:
                raise ValueError("num_classes is required with a model instance")
            self._build(model, num_classes)
        else:
            self._factory = model

    def _build(self, model: torch.nn.Module, num_classes: int) -> None:
        self.model = model
        metric = lambda: torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)
        self.train_acc, self.val_acc, self.test_acc = metric(), metric(), metric()

    def configure_model(self) -> None:
        if self._factory is None or hasattr(self, "model"):
            return
        datamodule = self.trainer.datamodule
        num_classes = self.hparams.num_classes or datamodule.num_classes
        self._build(self._factory(datamodule.num_features, num_classes), num_classes)

    def forward(self, x, edge_index, edge_weight=None):
        x = F.dropout(x, self.hparams.input_dropout, self.training)
        if edge_weight is None:
            return self.model(x, edge_index)
        return self.model(x, edge_index, edge_weight=edge_weight)

    def _weight(self, batch):
        return getattr(batch, "edge_weight", None) if self.hparams.get("use_edge_weight") \
            else None

    @staticmethod
    def _targets(batch, mask_name: str):
        # A NeighborLoader mini-batch (``batch.batch_size`` set) puts its seed nodes first
        # and scores only those: the other nodes are sampled neighbours, some of them in
        # the mask too, whose embeddings lack part of their neighbourhood.
        seeds = getattr(batch, "batch_size", None)
        if isinstance(seeds, int):
            return torch.arange(seeds, device=batch.y.device)
        return batch[mask_name]

    def training_step(self, batch, _):
        out = self(batch.x, batch.edge_index, self._weight(batch))
        mask = self._targets(batch, "train_mask")
        loss = F.cross_entropy(out[mask], batch.y[mask])
        self.train_acc(out[mask].argmax(-1), batch.y[mask])
        self.log("train_loss", loss, prog_bar=True, batch_size=1)
        self.log("train_acc", self.train_acc, batch_size=1)
        return loss

    def _evaluate(self, batch, mask_name: str, metric, name: str) -> None:
        mask = self._targets(batch, mask_name)
        out = self(batch.x, batch.edge_index, self._weight(batch))
        metric(out[mask].argmax(-1), batch.y[mask])
        self.log(name, metric, prog_bar=True, batch_size=1)

    def validation_step(self, batch, _):
        self._evaluate(batch, "val_mask", self.val_acc, "val_acc")

    def test_step(self, batch, _):
        self._evaluate(batch, "test_mask", self.test_acc, "test_acc")

    def predict_step(self, batch, _):
        return self(batch.x, batch.edge_index, self._weight(batch)).argmax(-1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr,
                                weight_decay=self.hparams.weight_decay)
