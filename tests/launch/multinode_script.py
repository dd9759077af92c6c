"""One "node" of a two-node FullGraphStrategy job, launched as users launch multi-node
Lightning jobs: ``MASTER_ADDR``, ``MASTER_PORT`` and ``NODE_RANK`` in the environment, one
launcher per node, and Lightning starts the node's other local process(es) itself.
Used by tests/launch/test_multinode.py.

Every rank writes its trained parameters to ``<out>/params-rank<r>.pt`` and prints one
``RESULT {json}`` line (ranks, partition, communication counters per epoch).
"""
import argparse
import json
import os
import sys

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch_geometric.nn import GCNConv

from lightning_fullgraph import FullGraphDataModule, FullGraphStrategy, TimeoutConfig

HIDDEN = 16
LR = 0.01


class Net(pl.LightningModule):
    r"""A 2-layer GCN without dropout (deterministic, so a single process can replay it)."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, HIDDEN)
        self.conv2 = GCNConv(HIDDEN, num_classes)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def training_step(self, batch, _):
        out = self(batch.x, batch.edge_index)
        return F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=LR)


class Counters(Callback):
    r"""Keeps the engine's per-epoch counters (the CommunicationMonitor resets them at
    every epoch start), per exchange point and direction, as exact integers."""

    def __init__(self) -> None:
        self.epochs = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        stats = trainer.strategy.engine.stats
        self.epochs.append({
            f"{key}|{direction}": dict(
                bytes_sent=c.bytes_sent, bytes_received=c.bytes_received,
                rows_sent=c.rows_sent, rows_received=c.rows_received,
                inter_sent=c.inter_host_bytes_sent, inter_received=c.inter_host_bytes_received)
            for (key, direction), c in stats.counters.items()})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args()

    from lightning_fullgraph.data import load_cora
    data = load_cora()
    torch.manual_seed(0)
    module = Net(data.num_features, int(data.y.max()) + 1)
    counters = Counters()
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, num_nodes=2, max_epochs=args.epochs,
        strategy=FullGraphStrategy(timeout=TimeoutConfig(collectives=args.timeout,
                                                         startup=3 * args.timeout)),
        callbacks=[counters], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0)
    dm = FullGraphDataModule(data, cache_dir=os.environ["TEST_CACHE_DIR"])  # hosts="auto"
    trainer.fit(module, datamodule=dm)

    rank = trainer.global_rank
    torch.save({k: v.detach().clone() for k, v in module.state_dict().items()},
               os.path.join(args.out, f"params-rank{rank}.pt"))
    monitor = next(c for c in trainer.callbacks if type(c).__name__ == "CommunicationMonitor")
    result = dict(
        global_rank=rank, world_size=trainer.world_size, node_rank=trainer.node_rank,
        local_rank=trainer.local_rank, num_nodes=trainer.num_nodes,
        env_node_rank=os.environ.get("NODE_RANK"), env_local_rank=os.environ.get("LOCAL_RANK"),
        pid=os.getpid(), partition_dir=str(dm.partition_dir),
        owned=int(dm.partition.num_owned),
        ranks_per_host=trainer.strategy.engine.transport.ranks_per_host,
        epochs=counters.epochs,
        monitor_inter_host_sent_MB=[h["comm/inter_host_sent_MB"] for h in monitor.history],
        monitor_sent_MB=[h["comm/sent_MB"] for h in monitor.history])
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")  # one write: ranks share stdout
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
