"""CommunicationMonitor on a plain DDP model: its gradient all-reduces counted, unchanged."""
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lightning_fullgraph.callbacks.communication import _count_ddp_bytes
from lightning_fullgraph.testing import run_distributed


def _ddp_step(rank, world_size):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    reference = [p.detach().clone() for p in model.parameters()]
    ddp = DistributedDataParallel(model)
    trainer = SimpleNamespace(strategy=SimpleNamespace(model=ddp), world_size=world_size)
    counter = _count_ddp_bytes(trainer)
    second = _count_ddp_bytes(trainer)  # a hook is registered now: not counted twice
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank))
    ddp(x).pow(2).sum().backward()
    # The gradient DDP averaged with the counting hook equals the mean of the ranks' own.
    local = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    with torch.no_grad():
        for p, r in zip(local.parameters(), reference):
            p.copy_(r)
    local(x).pow(2).sum().backward()
    err = 0.0
    for p, q in zip(ddp.module.parameters(), local.parameters()):
        mean = q.grad.clone()
        dist.all_reduce(mean)
        mean /= world_size
        err = max(err, float((p.grad - mean).abs().max()))
    numel = sum(p.numel() for p in model.parameters())
    return counter.payload, counter.sent(), second is None, err, numel


def test_ddp_gradient_all_reduce_is_counted_and_unchanged():
    for payload, sent, refused, err, numel in run_distributed(_ddp_step, 2):
        assert payload == 4 * numel            # every fp32 gradient, once
        assert sent == 2.0 * (2 - 1) / 2 * payload  # a ring all-reduce's share per process
        assert refused and err < 1e-6


def test_single_process_or_no_ddp_counts_nothing():
    trainer = SimpleNamespace(strategy=SimpleNamespace(model=torch.nn.Linear(2, 2)),
                              world_size=1)
    assert _count_ddp_bytes(trainer) is None
