"""GCN on Cora: test accuracy on one process vs partitioned on P processes, over seeds.

    python -m benchmarks cora_accuracy                 # 5 seeds, P = 4, 200 epochs
    python -m benchmarks cora_accuracy --json

Kipf & Welling's setup (as PyG's ``examples/gcn.py``): row-normalized features,
2-layer GCN, 16 hidden, dropout 0.5 (input and hidden), Adam lr 0.01 with weight
decay 5e-4 on the first layer, 200 epochs, public split; the test accuracy at the
epoch of best validation accuracy.  The single-process run is plain PyG; the partitioned run uses
:class:`~lightning_fullgraph.engine.FullGraphEngine` on METIS partitions.
Dropout masks differ between the two (each rank draws its own), so the runs are
statistically, not bitwise, equal.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from lightning_fullgraph.data import load_cora
from lightning_fullgraph.module import build_model

from ._common import add_out_argument, write_result


def _cora():
    import torch_geometric.transforms as T
    return T.NormalizeFeatures()(load_cora())


def _train(model, data, epochs, backward, count):
    r"""Trains; returns test accuracy at the best validation epoch.

    ``count(pred, mask)`` returns (correct, total) over the whole graph.
    """
    opt = torch.optim.Adam([
        dict(params=model.convs[0].parameters(), weight_decay=5e-4),
        dict(params=model.convs[1].parameters(), weight_decay=0.0)], lr=0.01)
    best_val, test_at_best = -1.0, 0.0
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        out = model(F.dropout(data.x, 0.5, True), data.edge_index)
        backward(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]))
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(data.x, data.edge_index).argmax(-1)
        val, test = count(pred, data, data.val_mask), count(pred, data, data.test_mask)
        if val > best_val:
            best_val, test_at_best = val, test
    return test_at_best


def _local_count(pred, data, mask):
    return float((pred[mask] == data.y[mask]).float().mean())


def single_process(seed: int, epochs: int) -> float:
    data = _cora()
    torch.manual_seed(seed)
    model = build_model("gcn", data.num_features, 16, 7, dropout=0.5)
    return _train(model, data, epochs, lambda loss: loss.backward(), _local_count)


def _partitioned(rank, world_size, seeds, epochs, cache):
    import torch.distributed as dist

    from lightning_fullgraph.engine import FullGraphEngine
    from lightning_fullgraph.partition import load_partition, partition_graph
    path = [None]
    if rank == 0:
        path = [str(partition_graph(_cora(), world_size, root=cache, progress=False))]
    dist.broadcast_object_list(path, src=0)
    engine = FullGraphEngine(load_partition(path[0], rank, num_parts=world_size))
    data = engine.data

    def global_count(pred, data, mask):
        counts = torch.tensor([(pred[mask] == data.y[mask]).sum(), mask.sum()],
                              dtype=torch.float64)
        dist.all_reduce(counts)
        return float(counts[0] / counts[1])

    accs = []
    for seed in seeds:
        torch.manual_seed(seed)
        model = build_model("gcn", data.num_features, 16, 7, dropout=0.5)
        engine.attach(model)
        engine.use_kernels("auto")
        torch.manual_seed(seed * 1000 + rank)  # independent dropout per rank
        accs.append(_train(model, data, epochs, engine.backward, global_count))
        engine.detach()
    return accs


def run(seeds, world_size: int, epochs: int, cache=None) -> dict:
    from lightning_fullgraph.testing import run_distributed
    single = [single_process(s, epochs) for s in seeds]
    parted = run_distributed(_partitioned, world_size, list(seeds), epochs, cache,
                             timeout_s=900)[0]
    return {
        "seeds": list(seeds), "epochs": epochs, "processes": world_size,
        "single_process": single, "partitioned": parted,
        "single_mean": statistics.mean(single), "partitioned_mean": statistics.mean(parted),
        "single_std": statistics.pstdev(single), "partitioned_std": statistics.pstdev(parted),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    result = run(range(args.seeds), args.processes, args.epochs)
    write_result("cora_accuracy", result, args.out, indent=2)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'seed':>5} {'1 process':>10} {f'{args.processes} processes':>12}")
    for s, a, b in zip(result["seeds"], result["single_process"], result["partitioned"]):
        print(f"{s:>5} {a * 100:>9.1f}% {b * 100:>11.1f}%")
    print(f" mean {result['single_mean'] * 100:>9.2f}% {result['partitioned_mean'] * 100:>11.2f}%"
          f"   (std {result['single_std'] * 100:.2f} / {result['partitioned_std'] * 100:.2f})")


if __name__ == "__main__":
    main()
