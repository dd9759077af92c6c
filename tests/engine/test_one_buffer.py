"""Post rows and pre partials in one buffer per peer (``engine/one_buffer.py``).

That exact hybrid and pre make one collective per direction is counted in
``test_collectives_per_step.py``; that they equal one process (synchronous, and overlapped
with the kernels) in ``test_exactness.py`` and ``test_overlap.py``.
"""
import pytest
import torch

from lightning_fullgraph.engine import ExchangePolicy, HaloCache
from lightning_fullgraph.engine.codecs.registry import codec_from_name
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


def test_it_applies_where_both_channels_share_a_codec_of_one_width_per_row():
    assert one_buffer_applies(ExchangePolicy(), "l.x", "l.pre", training=True)
    # A quantizer codes row by row: rows and partials are coded in one buffer.
    assert one_buffer_applies(ExchangePolicy.of("int2"), "l.x", "l.pre", training=True)
    assert one_buffer_applies(ExchangePolicy.of("int2-compact"), "l.x", "l.pre", True)
    # Per-node widths follow the post rows' levels, which partials do not have.
    assert not one_buffer_applies(ExchangePolicy.of("adaptive"), "l.x", "l.pre", True)
    # A point whose partials are coded otherwise than its rows keeps two collectives.
    int2 = codec_from_name("int2")
    apart = ExchangePolicy(int2, points={"*.pre": codec_from_name("int4")})
    assert not one_buffer_applies(apart, "l.x", "l.pre", training=True)
    cached = ExchangePolicy().with_cache(HaloCache(0.01))
    # The cache serves training exchanges only: evaluation sends rows and partials together.
    assert not one_buffer_applies(cached, "l.x", "l.pre", training=True)
    assert one_buffer_applies(cached, "l.x", "l.pre", training=False)
    assert not one_buffer_applies(ExchangePolicy().with_pipeline("async"), "l.x", "l.pre", True)
    assert not one_buffer_applies(ExchangePolicy().with_sampling(0.5), "l.x", "l.pre", True)
    assert one_buffer_applies(ExchangePolicy().with_sampling(1.0), "l.x", "l.pre", True)


def _lossy_hybrid(rank, world_size, overlap):
    r"""Hybrid GCN steps under a deterministic quantizer, with rows and partials in one
    buffer (one codec object) and apart (an equal codec of their own for the partials)."""
    import copy

    import torch.nn.functional as F
    from torch_geometric.nn.models import GCN

    from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
    from lightning_fullgraph.testing import count_collectives

    from .models import rank_partition

    data, part = rank_partition(rank, world_size)
    torch.manual_seed(0)
    ref = GCN(data.num_features, 16, 2, 4, dropout=0.0)
    shared = codec_from_name("int2-nearest")
    policies = {"one": ExchangePolicy(shared),
                "apart": ExchangePolicy(shared, points={"*.pre": codec_from_name("int2-nearest")})}
    out = {}
    for name, policy in policies.items():
        engine = FullGraphEngine(part, exchange=ExchangeConfig(
            aggregation="hybrid", codec=policy, overlap=overlap, step_aside=False))
        model = copy.deepcopy(ref)
        engine.attach(model)
        engine.use_kernels("auto" if overlap else None)
        local = engine.data

        def step():
            model.zero_grad()
            logits = model(local.x, local.edge_index)
            F.cross_entropy(logits[local.train_mask], local.y[local.train_mask]).backward()
            return logits

        step()  # the first step also exchanges the degrees of the (kept) normalization
        with count_collectives() as log:
            logits = step()
        engine.drain()
        total = engine.stats.total()
        out[name] = dict(logits=logits.detach(), grads=[p.grad.clone() for p in model.parameters()],
                         exchanges=sum(n == "all_to_all_single" for n, _ in log),
                         bytes=total.bytes_sent + total.bytes_received,
                         exact=float((logits.detach() - copy.deepcopy(ref)(
                             data.x, data.edge_index).detach()[part.owned_ids]).abs().max()))
        engine.detach()
    one, apart = out["one"], out["apart"]
    return dict(exchanges=(one["exchanges"], apart["exchanges"]),
                bytes=(one["bytes"], apart["bytes"]),
                logits=float((one["logits"] - apart["logits"]).abs().max()),
                grads=max(float((a - b).abs().max()) for a, b in zip(one["grads"], apart["grads"])),
                quantized=one["exact"])


@pytest.mark.multiprocess
@pytest.mark.parametrize("overlap", [False, True])
def test_a_quantizer_codes_rows_and_partials_in_one_buffer(overlap):
    # Rounded to nearest, a row is coded the same wherever it sits on the wire: one buffer
    # (one collective per direction and layer) gives the model two collectives give, the same
    # bytes, and still differs from the exact model (the codec did run).
    from lightning_fullgraph.testing import run_distributed
    for r in run_distributed(_lossy_hybrid, 2, overlap):
        # The first layer's aggregate of the raw features is kept after the first step: the
        # second layer's rows and partials go out and their gradients come back.
        assert r["exchanges"] == (2, 4)
        assert r["bytes"][0] == r["bytes"][1]
        assert r["logits"] <= 1e-6 and r["grads"] <= 1e-6
        assert r["quantized"] > 1e-3
