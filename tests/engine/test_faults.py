"""A dead or stuck peer makes every other rank raise a clear error, in bounded time."""
import os
import re
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch_geometric.nn import GCNConv

from lightning_fullgraph.engine import CollectiveError, ExchangeConfig, FullGraphEngine
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_outcomes

from .models import skewed_graph

# Timing: run alone, not beside other tests (scripts/test.sh).
pytestmark = pytest.mark.serial

TIMEOUT = 3.0


def _fault(rank, world_size, fault, duplex=False):
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    group = dist.new_group(timeout=timedelta(seconds=TIMEOUT))
    # Duplex: every exchange is two collectives on two groups, both waited for in the guard.
    exchange = ExchangeConfig(duplex=True, step_aside=False) if duplex else None
    engine = FullGraphEngine(build_local_partitions(data, parts)[rank], group=group,
                             timeout=TIMEOUT, exchange=exchange)
    model = GCNConv(data.num_features, 4)
    engine.attach(model)
    local = engine.data
    # With a gradient the rows are exchanged on every call (no static-input agreement).
    x = local.x.clone().requires_grad_(duplex)
    model(x, local.edge_index)  # one exchange that works
    if rank == 1:
        if fault == "dies":
            os._exit(3)
        time.sleep(4 * TIMEOUT)  # stuck, but alive
    start = time.monotonic()
    try:
        model(x, local.edge_index).sum().backward()
    except CollectiveError as error:
        return dict(message=str(error), seconds=time.monotonic() - start,
                    timed_out=error.timed_out, peer_failed=error.peer_failed)
    return "no error"


@pytest.mark.multiprocess
@pytest.mark.parametrize("duplex", [False, True], ids=["one-group", "duplex"])
@pytest.mark.parametrize("fault", ["dies", "stuck"])
def test_every_survivor_raises_a_clear_error(fault, duplex):
    outcomes = run_outcomes(_fault, 3, fault, duplex, timeout_s=60)
    assert outcomes[1].status == ("died" if fault == "dies" else "returned"), outcomes[1]
    for outcome in (outcomes[0], outcomes[2]):
        assert outcome.status == "returned", outcome  # it caught a CollectiveError
        r = outcome.value
        assert isinstance(r, dict), r
        # The first collective after the fault is named with its exchange point: a halo
        # exchange, or the agreement that replaces one (static-input memo, see static.py).
        assert re.search(r"(halo exchange|static[a-z -]* check for|agreement for) "
                         r"'(gcn_norm|GCNConv)[^']*'", r["message"]), r
        assert f"rank {outcome.rank}:" in r["message"], r
        if duplex:
            assert "halo exchange 'GCNConv" in r["message"], r
        if fault == "dies":
            assert r["peer_failed"] and r["seconds"] < TIMEOUT, r
            assert "failed or was killed" in r["message"], r
        else:
            assert r["timed_out"] and TIMEOUT * 0.9 < r["seconds"] < TIMEOUT + 5, r
            assert "FullGraphStrategy(timeout=...)" in r["message"], r
            assert "collective timeout 3 s" in r["message"], r
