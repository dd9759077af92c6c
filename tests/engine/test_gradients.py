"""Gradients reduced over ranks are the ones single-process PyG would have."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv

from lightning_fullgraph.engine import FullGraphEngine, all_reduce_gradients
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .models import skewed_graph


class WithUnused(nn.Module):
    r"""A GCN with a head that the forward never uses (e.g. kept for another task)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv1 = GCNConv(in_channels, 16)
        self.conv2 = GCNConv(16, out_channels)
        self.unused = nn.Linear(16, out_channels)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _engine(rank, world_size, data):
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    return FullGraphEngine(build_local_partitions(data, parts)[rank])


def _loss(model, x, data):
    out = model(x, data.edge_index)
    return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])


def _unused_and_repeated(rank, world_size):
    data = skewed_graph()
    engine = _engine(rank, world_size, data)
    local = engine.data
    torch.manual_seed(0)
    ref = WithUnused(data.num_features, 4).double()
    model = copy.deepcopy(ref)
    engine.attach(model)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    x, local_x = data.x.double(), local.x.double()
    for _ in range(3):
        opt_ref.zero_grad()
        opt.zero_grad()
        # Two backward passes before one step, as with two manual_backward calls.
        _loss(ref, x, data).backward()
        (0.5 * _loss(ref, x, data)).backward()
        engine.backward(_loss(model, local_x, local))
        engine.backward(0.5 * _loss(model, local_x, local))
        grads = {n: float((p.grad - q.grad).abs().max() / q.grad.abs().max())
                 for (n, p), q in zip(model.named_parameters(), ref.parameters())
                 if q.grad is not None}
        unused_grad = [p.grad for p in model.unused.parameters()]
        opt_ref.step()
        opt.step()
    params = {n: float((p - q).abs().max()) for (n, p), q in
              zip(model.named_parameters(), ref.parameters())}
    return dict(grads=grads, params=params,
                unused_grad_none=all(g is None for g in unused_grad),
                unused_moved=float((model.unused.weight - ref.unused.weight).abs().max()),
                ref_unused_grad_none=all(q.grad is None for q in ref.unused.parameters()))


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_unused_parameters_and_repeated_backward(world_size):
    for r in run_distributed(_unused_and_repeated, world_size):
        assert r["ref_unused_grad_none"]
        # Single-process PyG leaves the unused head without a gradient, so AdamW's weight
        # decay does not touch it; zero-filled gradients would have moved it.
        assert r["unused_grad_none"], r
        assert r["unused_moved"] == 0.0, r
        for name, err in r["grads"].items():
            assert err < 1e-10, (name, r)  # the first backward is counted once, not P times
        for name, err in r["params"].items():
            assert err < 1e-10, (name, r)


def _presence(rank, world_size):
    a = nn.Parameter(torch.zeros(3))
    b = nn.Parameter(torch.zeros(2))
    if rank == 0:
        a.grad = torch.ones(3)  # a gradient on one rank only
    all_reduce_gradients([a, b])
    return (None if a.grad is None else a.grad.tolist(), b.grad)


@pytest.mark.multiprocess
def test_gradient_on_some_ranks_only():
    for grad_a, grad_b in run_distributed(_presence, 3):
        assert grad_a == [1.0, 1.0, 1.0]  # summed: zeros where absent
        assert grad_b is None  # absent everywhere: stays absent
