"""``aggregation="auto"``: per layer, the lossless mode predicted fastest on the link, the
same on every rank, and exact like the mode it picks."""
import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine, MODES
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.planner import LinkModel
from lightning_fullgraph.testing import run_distributed

from .models import skewed_graph
from .test_exactness import FP32, _inputs, _pair, _per_tensor, _rel

KINDS = ("gcn", "sage_mean", "gin", "sgc", "appnp", "sage_max")
# Seconds are latency alone (every collective costs the same, bytes nothing), or bytes alone.
LINKS = {"latency": LinkModel(alpha=1.0, beta=1e18), "bandwidth": LinkModel(alpha=1e-12, beta=1e3)}


def _run(rank: int, world_size: int, link: str):
    torch.manual_seed(0)
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation="auto", link=LINKS[link]))
    local = engine.data
    out = {"errors": {}, "choices": {}}
    for kind in KINDS:
        ref, model = _pair(kind, data, engine)
        logits_ref = ref(*_inputs(data, torch.float32))
        F.cross_entropy(logits_ref[data.train_mask], data.y[data.train_mask]).backward()
        logits = model(*_inputs(local, torch.float32))
        engine.backward(F.cross_entropy(logits[local.train_mask], local.y[local.train_mask]))
        out["errors"][kind] = dict(logits=_rel(engine.gather(logits), logits_ref.detach()),
                                   grads=_per_tensor(model, ref, lambda p: p.grad))
        out["choices"].update({f"{kind}.{layer}": mode for layer, (mode, _)
                               in engine.router.auto_choices.items()})
        engine.detach()
    out["rows"] = engine.router.busiest_rows()
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("link", ["latency", "bandwidth"])
def test_auto_picks_the_predicted_fastest_mode_alike_and_exactly(link):
    results = run_distributed(_run, 3, link)
    choices = results[0]["choices"]
    assert all(r["choices"] == choices for r in results)  # else the next collective hangs
    # Every eligible layer decided (SAGEConv with max aggregation always post-aggregates).
    assert set(choices) == {f"{k}.conv{i}" for k in KINDS if k != "sage_max" for i in (1, 2)}
    rows = results[0]["rows"]
    # Exact, every mode makes one collective per direction (hybrid and pre send rows and
    # partials in one buffer), so on either link the mode whose busiest rank moves the fewest
    # rows wins (on the latency link by its bytes' tiny time), ties to post, then pre.
    moved = {m: sum(rows[(m, c)] for c in ("post", "pre")
                    if (m, c) not in (("post", "pre"), ("pre", "post"))) for m in MODES}
    expected = {min(MODES, key=lambda m: (moved[m], MODES.index(m)))}
    assert moved["hybrid"] <= min(moved["post"], moved["pre"]) or expected != {"hybrid"}
    assert set(choices.values()) == expected, (choices, rows)
    for rank, r in enumerate(results):
        for kind, err in r["errors"].items():
            assert err["logits"] < FP32, (rank, kind, err)
            assert all(v < FP32 for v in err["grads"].values()), (rank, kind, err)


def test_a_tensor_at_a_freed_ones_address_is_checked_anew():
    # The router recognizes the partition's edge values by content, remembering results per
    # address and version. A tensor that was not the reference (last step's normalized
    # weights) may be freed and its address reused by one that is (this step's
    # `edge_weight.double()`): that one must not inherit the old answer.
    import numpy as np
    from lightning_fullgraph.engine.aggregation import _SameTensor
    reference = torch.rand(50, dtype=torch.float64)
    same = _SameTensor(reference)
    memory = np.empty(50)
    memory[:] = 2 * reference.numpy()
    other = torch.from_numpy(memory)
    assert not same(other)
    address = other.data_ptr()
    del other
    memory[:] = reference.numpy()
    now = torch.from_numpy(memory)  # the same address, version and shape
    assert now.data_ptr() == address and now._version == 0
    assert same(now)
    assert same(now)  # remembered while it lives
