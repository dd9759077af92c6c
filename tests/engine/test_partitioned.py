"""Partitioned layers (engine/partitioned.py): the pre channel's reduction adds the received
partial aggregates into the aggregation's own output, never into one a user's hook kept."""
import torch
from torch_geometric.nn import SAGEConv

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
from lightning_fullgraph.testing import run_distributed

from .models import rank_partition


def _hooked_propagate(rank, world_size, hooked):
    data, part = rank_partition(rank, world_size)
    torch.manual_seed(1)
    # As wide as its input: a narrower layer would map first (engine/narrow_first.py) only
    # without the hook, and the two outputs would differ by rounding.
    conv = SAGEConv(data.num_features, data.num_features, aggr="mean")
    seen = []
    if hooked:  # registered before the engine's own propagate hook
        conv.register_propagate_forward_hook(
            lambda m, i, o: seen.append((o, o.detach().clone())))
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation="pre"), static_inputs=False)
    engine.attach(conv)
    local = engine.data
    out = conv(local.x, local.edge_index)
    engine.detach()
    kept = all(torch.equal(o, copy) for o, copy in seen)
    return kept, out.detach(), int(engine.exchanges["pre"].plan.pre.recv_index.numel())


def test_a_hook_that_ran_first_keeps_the_unreduced_output():
    hooked = run_distributed(_hooked_propagate, 2, True)
    plain = run_distributed(_hooked_propagate, 2, False)
    assert sum(received for _, _, received in hooked) > 0  # some rank adds pre slots
    for (kept, out, _), (_, expected, _) in zip(hooked, plain):
        assert kept  # the hook's tensor is not the one the slots were added into
        assert torch.equal(out, expected)
