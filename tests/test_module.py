"""NodeClassifier: full batches score the mask, NeighborLoader batches their seed nodes."""
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.nn import GraphSAGE

from lightning_fullgraph.module import NodeClassifier


def _batch(seeds=None):
    torch.manual_seed(0)
    n = 12
    data = Data(x=torch.randn(n, 5), edge_index=torch.randint(0, n, (2, 40)),
                y=torch.randint(0, 3, (n,)))
    # Sampled neighbours may be training nodes too: the mask must not decide what is scored.
    data.train_mask = torch.rand(n) < 0.5
    data.val_mask = ~data.train_mask
    if seeds is not None:
        data.batch_size = seeds
    return data


def _module():
    torch.manual_seed(1)
    return NodeClassifier(GraphSAGE(5, 8, 2, 3), num_classes=3, input_dropout=0.0).eval()


def test_full_batch_scores_the_mask():
    batch, module = _batch(), _module()
    out = module(batch.x, batch.edge_index)
    expected = F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask])
    assert torch.equal(module.training_step(batch, 0), expected)


def test_neighbor_batch_scores_only_its_seed_nodes():
    batch, module = _batch(seeds=4), _module()
    out = module(batch.x, batch.edge_index)
    expected = F.cross_entropy(out[:4], batch.y[:4])
    assert torch.equal(module.training_step(batch, 0), expected)
    assert not torch.equal(expected, F.cross_entropy(out[batch.train_mask],
                                                     batch.y[batch.train_mask]))
    module._evaluate(batch, "val_mask", module.val_acc, "val_acc")
    # The seeds, not the sampled neighbours that are in val_mask.
    seeds_acc = (out[:4].argmax(-1) == batch.y[:4]).float().mean()
    assert torch.allclose(module.val_acc.compute(), seeds_acc)
