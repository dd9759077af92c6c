"""Post rows and pre partials in one buffer per peer (``engine/one_buffer.py``).

That exact hybrid and pre make one collective per direction is counted in
``test_collectives_per_step.py``; that they equal one process (synchronous, and overlapped
with the kernels) in ``test_exactness.py`` and ``test_overlap.py``.
"""
import torch

from lightning_fullgraph.engine import ExchangePolicy, HaloCache
from lightning_fullgraph.engine.one_buffer import OneBufferPlan, one_buffer_applies, pre_partials


def test_the_plan_puts_each_peers_rows_then_its_partials_together():
    # Peer 1 gets post rows 0, 1 and partial 0 (wire rows 0-2); peer 2 post row 2 and
    # partials 1, 2 (wire rows 3-5).
    plan = OneBufferPlan.of(post_send=[0, 2, 1], post_recv=[0, 1, 1], pre_send=[0, 1, 2],
                            pre_recv=[0, 2, 0], device=torch.device("cpu"))
    assert plan.send_counts == [0, 3, 3] and plan.recv_counts == [0, 3, 1]
    assert plan.post_dest.tolist() == [0, 1, 3] and plan.pre_dest.tolist() == [2, 4, 5]
    # Received: peer 1's halo row, its two partials, then peer 2's halo row.
    assert plan.halo_pos.tolist() == [0, 3] and plan.pre_pos.tolist() == [1, 2]


def test_partials_are_the_pre_edges_weighted_sums():
    own = torch.randn(4, 3, dtype=torch.float64)
    edges = torch.tensor([[0, 1, 3, 1], [0, 0, 1, 1]])  # owned source -> pre slot
    weight = torch.tensor([0.5, 2.0, -1.0, 3.0], dtype=torch.float64)
    out = pre_partials(own, edges, weight, 2)
    expected = torch.stack([0.5 * own[0] + 2.0 * own[1], -own[3] + 3.0 * own[1]])
    assert torch.allclose(out, expected)
    assert torch.equal(pre_partials(own, edges, None, 3)[2], torch.zeros(3, dtype=own.dtype))
    # bfloat16 rows and fp32 weights: fp32 partials, as PyG's messages are.
    assert pre_partials(own.bfloat16(), edges, weight.float(), 2).dtype == torch.float32


def test_it_applies_where_every_row_crosses_the_wire_as_it_is():
    assert one_buffer_applies(ExchangePolicy(), "l.x", "l.pre", training=True)
    assert not one_buffer_applies(ExchangePolicy.of("int2"), "l.x", "l.pre", training=False)
    cached = ExchangePolicy().with_cache(HaloCache(0.01))
    # The cache serves training exchanges only: evaluation sends rows and partials together.
    assert not one_buffer_applies(cached, "l.x", "l.pre", training=True)
    assert one_buffer_applies(cached, "l.x", "l.pre", training=False)
    assert not one_buffer_applies(ExchangePolicy().with_pipeline("async"), "l.x", "l.pre", True)
    assert not one_buffer_applies(ExchangePolicy().with_sampling(0.5), "l.x", "l.pre", True)
    assert one_buffer_applies(ExchangePolicy().with_sampling(1.0), "l.x", "l.pre", True)
