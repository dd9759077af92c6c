"""A LightningModule written for one device, as a PyG user writes it."""
import lightning.pytorch as pl
import torch
import torch.nn.functional as F
import torchmetrics
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

CONVS = {
    "gcn": GCNConv,
    "sage": SAGEConv,
    "gat": lambda i, o: GATConv(i, o, heads=2, concat=False),
}


class GCN(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, out_channels: int, dropout: float = 0.0,
                 conv: str = "gcn"):
        super().__init__()
        self.conv1 = CONVS[conv](in_channels, hidden)
        self.bn = torch.nn.BatchNorm1d(hidden)
        self.conv2 = CONVS[conv](hidden, out_channels)
        self.dropout = dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, self.dropout, self.training)
        x = self.bn(self.conv1(x, edge_index).relu())
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x, edge_index)


class NodeClassifier(pl.LightningModule):
    def __init__(self, in_channels: int, num_classes: int, hidden: int = 16, lr: float = 0.01,
                 dropout: float = 0.0, die_at_epoch: int = -1, die_rank: int = -1,
                 conv: str = "gcn"):
        super().__init__()
        self.save_hyperparameters()
        self.model = GCN(in_channels, hidden, num_classes, dropout, conv)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)
        self.test_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)

    def forward(self, x, edge_index):
        return self.model(x, edge_index)

    def training_step(self, batch, _):
        if self.current_epoch == self.hparams.die_at_epoch \
                and self.global_rank == self.hparams.die_rank:
            import os
            os._exit(17)  # a rank dies without a word
        out = self(batch.x, batch.edge_index)
        loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
        self.log("train_loss", loss, batch_size=1)
        return loss

    def validation_step(self, batch, _):
        out = self(batch.x, batch.edge_index)
        self.val_acc(out[batch.val_mask].argmax(-1), batch.y[batch.val_mask])
        self.log("val_acc", self.val_acc, batch_size=1)

    def test_step(self, batch, _):
        out = self(batch.x, batch.edge_index)
        self.test_acc(out[batch.test_mask].argmax(-1), batch.y[batch.test_mask])
        self.log("test_acc", self.test_acc, batch_size=1)

    def predict_step(self, batch, _):
        return self(batch.x, batch.edge_index)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class SGDClassifier(NodeClassifier):
    r"""Plain SGD: a step is proportional to the gradient, so rounding differences stay as
    small as they are (Adam normalises each coordinate: a near-zero gradient whose sign
    flips with rounding moves its weight by a whole learning rate)."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class ManualClassifier(NodeClassifier):
    r"""Manual optimization with two backward passes before each step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, _):
        opt = self.optimizers()
        opt.zero_grad()
        out = self(batch.x, batch.edge_index)
        loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
        self.manual_backward(loss, retain_graph=True)
        self.manual_backward(0.5 * loss)
        opt.step()
