"""GCN on Cora in a Fabric loop, partitioned across the processes Fabric launches.

    fabric run --accelerator cpu --devices 4 examples/fabric_gcn.py
    python examples/fabric_gcn.py --devices 4        # Fabric launches them itself

``--dataset cora`` is loaded by name (``load_dataset``), with its features row-normalized as
in PyG's ``examples/gcn.py``, ``lightning-fullgraph train`` and ``FullGraphDataModule("cora")``.
"""
import argparse

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch_geometric.nn import GCNConv

from lightning_fullgraph.fabric import launch, setup_fullgraph


class GCN(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = F.dropout(x, 0.5, self.training)
        x = F.dropout(self.conv1(x, edge_index).relu(), 0.5, self.training)
        return self.conv2(x, edge_index)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=None,
                        help="processes when not started by 'fabric run'")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--dataset", default="cora")
    args = parser.parse_args()

    fabric = Fabric(accelerator="cpu", devices=args.devices) if args.devices else Fabric()
    launch(fabric)  # no-op under 'fabric run', which has created the processes
    fabric.seed_everything(0)
    model = GCN(1433, 16, 7)
    engine = setup_fullgraph(fabric, model, args.dataset)
    data = engine.data
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for epoch in range(args.epochs):
        model.train()
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)
        engine.backward(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]))
        optimizer.step()

    model.eval()
    with torch.no_grad():
        pred = model(data.x, data.edge_index).argmax(-1)
    mask = data.test_mask
    correct = torch.tensor([(pred[mask] == data.y[mask]).sum(), mask.sum()], dtype=torch.float64)
    correct = fabric.all_reduce(correct, reduce_op="sum")
    sent = engine.stats.total("forward").bytes_sent / args.epochs
    if fabric.global_rank == 0:
        print(f"RESULT test_acc={correct[0] / correct[1]:.4f} processes={fabric.world_size} "
              f"halo_bytes_per_epoch_rank0={sent:.0f}")


if __name__ == "__main__":
    main()
