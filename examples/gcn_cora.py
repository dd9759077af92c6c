"""GCN on Cora with PyTorch Lightning: one device, or partitioned with one flag.

    python examples/gcn_cora.py                       # one process, PyG's LightningNodeData
    python examples/gcn_cora.py --devices 4           # 4 processes, FullGraphStrategy
    torchrun --nproc-per-node 4 examples/gcn_cora.py --devices 4

The LightningModule below is what a PyG user writes for one device; the only
lines that change for partitioned training are the Trainer's strategy and the
data module (marked ``# <-``). Cora's features are row-normalized, as in PyG's
``examples/gcn.py`` and in every entry point of this package that loads Cora by name
(``load_dataset("cora")``).
"""
import argparse

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
import torchmetrics
from torch_geometric.data.lightning import LightningNodeData
from torch_geometric.nn import GCNConv

from lightning_fullgraph import FullGraphDataModule, FullGraphStrategy
from lightning_fullgraph.data import load_dataset


class GCN(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, dropout=0.5):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)
        self.dropout = dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, self.dropout, self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(x, edge_index)


class Classifier(pl.LightningModule):
    def __init__(self, num_features, num_classes):
        super().__init__()
        self.model = GCN(num_features, 16, num_classes)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)
        self.test_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)

    def training_step(self, batch, _):
        out = self.model(batch.x, batch.edge_index)
        loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
        self.log("train_loss", loss, prog_bar=True, batch_size=1)
        return loss

    def validation_step(self, batch, _):
        out = self.model(batch.x, batch.edge_index)
        self.val_acc(out[batch.val_mask].argmax(-1), batch.y[batch.val_mask])
        self.log("val_acc", self.val_acc, prog_bar=True, batch_size=1)

    def test_step(self, batch, _):
        out = self.model(batch.x, batch.edge_index)
        self.test_acc(out[batch.test_mask].argmax(-1), batch.y[batch.test_mask])
        self.log("test_acc", self.test_acc, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01, weight_decay=5e-4)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=1,
                        help="1: plain PyG on one process; >1: FullGraphStrategy")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    pl.seed_everything(args.seed)
    data = load_dataset("cora")  # Cora, features row-normalized (T.NormalizeFeatures())
    module = Classifier(data.num_features, int(data.y.max()) + 1)
    if args.devices == 1:
        strategy, datamodule = "auto", LightningNodeData(data, loader="full")
    else:
        strategy, datamodule = FullGraphStrategy(), FullGraphDataModule(data)  # <-
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy,
                         max_epochs=args.epochs, logger=False, enable_checkpointing=False,
                         enable_model_summary=False)
    trainer.fit(module, datamodule=datamodule)
    result = trainer.test(module, datamodule=datamodule, verbose=False)
    if trainer.is_global_zero:
        print(f"RESULT test_acc={result[0]['test_acc']:.4f} processes={trainer.world_size}")


if __name__ == "__main__":
    main()
