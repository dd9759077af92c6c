"""A FullGraphStrategy (or FourDStrategy, ``--strategy 4d``) run launched the way users launch
it (Lightning re-runs this script per rank), with faults to inject.  Used by
tests/strategies/test_faults.py.

Prints ``EPOCH <n> RANK <r> PID <pid>`` at every training epoch start and ``RESULT ...`` at the
end (rank 0), flushed, so a test can act at a given moment of training on a given rank.
"""
import argparse
import os
import sys
import time

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
import torchmetrics
from torch_geometric.nn import GCNConv

from lightning_fullgraph import (FourDStrategy, FullGraphDataModule, FullGraphStrategy,
                                 TimeoutConfig)


class GCN(pl.LightningModule):
    def __init__(self, in_channels, num_classes, args):
        super().__init__()
        self.conv1 = GCNConv(in_channels, 16)
        self.conv2 = GCNConv(16, num_classes)
        self.args = args
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)

    def forward(self, x, edge_index, edge_weight=None):
        x = F.dropout(self.conv1(x, edge_index, edge_weight).relu(), 0.5, self.training)
        return self.conv2(x, edge_index, edge_weight)

    def on_train_epoch_start(self):
        # One write per line: the ranks share the launcher's stdout.
        sys.stdout.write(f"EPOCH {self.current_epoch} RANK {self.global_rank} "
                         f"PID {os.getpid()}\n")
        sys.stdout.flush()

    def _stall(self, where):
        a = self.args
        if a.stall_in == where and self.global_rank == a.stall_rank \
                and self.current_epoch == a.stall_epoch:
            time.sleep(a.stall_seconds)  # alive but stuck

    def training_step(self, batch, _):
        self._stall("step")
        out = self(batch.x, batch.edge_index, batch.get("edge_weight"))
        mask = batch.train_mask
        if self.args.log_train_acc:
            # As PyG's examples/pytorch_lightning/graph_sage.py logs it: an epoch-level
            # torchmetrics metric in the progress bar.
            self.train_acc(out[mask].argmax(-1), batch.y[mask])
            self.log("train_acc", self.train_acc, prog_bar=True, on_step=False, on_epoch=True,
                     batch_size=1)
        return F.cross_entropy(out[mask], batch.y[mask])

    def on_train_epoch_end(self):
        self._stall("epoch_end")  # between steps: no collective of the library is running

    def validation_step(self, batch, _):
        out = self(batch.x, batch.edge_index, batch.get("edge_weight"))
        self.val_acc(out[batch.val_mask].argmax(-1), batch.y[batch.val_mask])
        self.log("val_acc", self.val_acc, batch_size=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class SlowPrepare(FullGraphDataModule):
    def __init__(self, *args, delay=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay = delay

    def prepare_data(self):
        time.sleep(self.delay)  # rank 0 partitions a big graph while the others wait
        super().prepare_data()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--slow-prepare", type=float, default=0.0)
    p.add_argument("--stall-rank", type=int, default=-1)
    p.add_argument("--stall-epoch", type=int, default=-1)
    p.add_argument("--stall-seconds", type=float, default=0.0)
    p.add_argument("--stall-in", choices=("step", "epoch_end"), default="step",
                   help="where the stalled rank sleeps: in training_step, or in "
                        "on_train_epoch_end (between steps)")
    p.add_argument("--log-train-acc", action="store_true",
                   help="log a torchmetrics train accuracy per epoch in the progress bar")
    p.add_argument("--progress-bar", action="store_true")
    p.add_argument("--strategy", choices=("fullgraph", "4d"), default="fullgraph")
    p.add_argument("--bad-label", action="store_true",
                   help="give one training node label 99 while the model has 7 outputs")
    args = p.parse_args()

    from lightning_fullgraph.data import load_cora
    data = load_cora()
    if args.bad_label:
        data.y[int(data.train_mask.nonzero()[-1])] = 99
    torch.manual_seed(0)
    module = GCN(data.num_features, 7, args)
    if args.strategy == "4d":  # ScaleGNN's sampled mini-batches, two replicas
        from lightning_fullgraph.data.sampled import SampledNodeDataModule
        strategy = FourDStrategy(timeout=TimeoutConfig(collectives=args.timeout))
        dm = SampledNodeDataModule(data, batch_size=512, steps_per_epoch=4)
    else:
        strategy = FullGraphStrategy(timeout=TimeoutConfig(collectives=args.timeout))
        dm = SlowPrepare(data, cache_dir=os.environ.get("TEST_CACHE_DIR"),
                         delay=args.slow_prepare)
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, max_epochs=args.epochs,
                         strategy=strategy, logger=False, enable_checkpointing=False,
                         enable_progress_bar=args.progress_bar, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(module, datamodule=dm)
    if trainer.global_rank == 0:
        print(f"RESULT val_acc={float(trainer.callback_metrics['val_acc']):.4f} "
              f"processes={trainer.world_size}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
