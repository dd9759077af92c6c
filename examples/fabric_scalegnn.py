"""ScaleGNN's 4-D mini-batch training on Cora in a Fabric loop: data parallel x a process grid.

    fabric run --accelerator cpu --devices 4 examples/fabric_scalegnn.py --grid 2,2,1
    python examples/fabric_scalegnn.py --devices 2 --grid 2,1,1   # Fabric launches them itself
"""
import argparse

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric

from lightning_fullgraph.data import load_dataset
from lightning_fullgraph.fabric import launch, setup_fourd
from lightning_fullgraph.parallel import ScaleGNN


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=None,
                        help="processes when not started by 'fabric run'")
    parser.add_argument("--grid", default="1,1,1", help="processes per replica: X,Y,Z")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=677)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--dropout", type=float, default=0.5)
    args = parser.parse_args()

    fabric = Fabric(accelerator="cpu", devices=args.devices) if args.devices else Fabric()
    launch(fabric)  # no-op under 'fabric run', which has created the processes
    fabric.seed_everything(0)
    data = load_dataset("cora")
    model = ScaleGNN(data.num_features, args.hidden, 3, int(data.y.max()) + 1, args.dropout)
    grid = tuple(int(v) for v in args.grid.split(","))
    run = setup_fourd(fabric, model, data, args.batch_size, grid=grid, seed=0)
    model = run.model  # on a grid: this process's blocks of the ScaleGNN
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(args.epochs):
        model.train()
        for batch in run.train_batches():
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index, batch.edge_weight)
            loss = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
            run.backward(loss)
            optimizer.step()
            losses.append(float(loss.detach()))
    model.eval()
    full = run.eval_batch()
    with torch.no_grad():
        pred = model(full.x, full.edge_index, full.edge_weight).argmax(-1)
    acc = float((pred[full.test_mask] == full.y[full.test_mask]).float().mean())
    model = run.teardown()  # the whole trained ScaleGNN, on every process
    if fabric.global_rank == 0:
        print("LOSSES " + " ".join(f"{v:.7f}" for v in losses))
        print(f"RESULT test_acc={acc:.4f} processes={fabric.world_size}")


if __name__ == "__main__":
    main()
