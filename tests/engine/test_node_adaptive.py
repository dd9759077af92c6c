"""Per-node bit widths (SYLVIE): each halo row at the width of its node's importance level."""
import pytest
import torch

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
from lightning_fullgraph.engine.codecs.node_adaptive import LEVEL_BITS, NodeAdaptiveCodec
from lightning_fullgraph.engine.codecs.quantize import HEADER_BYTES
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .models import skewed_graph

F = 13  # not a multiple of any packing factor


def test_row_bits_follow_levels_and_the_base_width():
    levels = torch.tensor([-1, 0, 1, 2, 3])
    codec = NodeAdaptiveCodec(bits=1)
    assert codec.row_bits(levels).tolist() == [1, 1, 2, 4, 8]
    codec.bits = 4
    assert codec.row_bits(levels).tolist() == [4, 4, 4, 4, 8]
    scale = NodeAdaptiveCodec(bits=2, combine="scale")
    assert scale.row_bits(levels).tolist() == [2, 2, 4, 8, 8]
    assert codec.row_bytes(levels, F).tolist() == [HEADER_BYTES + (F * b + 7) // 8
                                                   for b in (4, 4, 4, 4, 8)]
    with pytest.raises(ValueError, match="combine"):
        NodeAdaptiveCodec(combine="min")


def test_stream_round_trip_matches_each_width():
    torch.manual_seed(0)
    from lightning_fullgraph.engine.codecs import WireContext
    rows = torch.randn(40, F)
    levels = torch.randint(-1, 4, (40, ))
    codec = NodeAdaptiveCodec(bits=1, rounding="nearest")
    ctx = WireContext("x", "forward", 3, 0, F, torch.float32)
    stream = codec.encode_rows(rows, levels, ctx)
    assert stream.numel() == int(codec.row_bytes(levels, F).sum())
    out = codec.decode_rows(stream, levels, ctx)
    span = rows.max(1).values - rows.min(1).values
    bits = codec.row_bits(levels).double()
    bound = span.double() / (2 ** bits - 1) / 2  # nearest: half a step
    assert ((out - rows).abs().max(1).values.double() <= bound * (1 + 1e-5) + 1e-6).all()


def test_compact_headers_take_four_bytes_per_row_and_decode_each_width():
    from lightning_fullgraph.engine.codecs import WireContext
    from lightning_fullgraph.engine.codecs.quantize import dequantize, quantize, stream_key
    torch.manual_seed(1)
    rows, levels = torch.randn(30, F) + 50, torch.randint(-1, 4, (30, ))
    codec = NodeAdaptiveCodec(bits=1, rounding="nearest", header="bfloat16")
    assert codec.row_bytes(levels, F).tolist() == [
        4 + (F * b + 7) // 8 for b in codec.row_bits(levels).tolist()]
    ctx = WireContext("x", "forward", 3, 0, F, torch.float32)
    out = codec.decode_rows(codec.encode_rows(rows, levels, ctx), levels, ctx)
    for b in (1, 2, 4, 8):  # each width decodes as the plain compact codec's rows
        index = (codec.row_bits(levels) == b).nonzero().flatten()
        alone = quantize(rows[index], b, False, stream_key(ctx), "bfloat16")
        assert torch.equal(out[index], dequantize(alone, b, F, "bfloat16"))


def _exchange(rank, world_size, base_bits):
    data = skewed_graph(num_nodes=200, num_features=F)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    engine = FullGraphEngine(part,
                             exchange=ExchangeConfig(codec=NodeAdaptiveCodec(bits=base_bits),
                                                     aggregation="post", step_aside=False))
    ex = engine.exchange
    x = data.x[part.owned_ids].requires_grad_()
    out = ex.extend(x, key="probe")
    halo = out[ex.num_owned:]
    truth = data.x[part.halo_ids]
    codec = ex.policy.codec("probe", "forward")
    bits = codec.row_bits(ex.halo_levels).double()
    span = (truth.max(1).values - truth.min(1).values).double()
    err = (halo - truth).abs().max(1).values.double()
    # Stochastic rounding: within one quantization step of each row's own width.
    within = bool((err <= span / (2 ** bits - 1) * (1 + 1e-5) + 1e-6).all())
    out.sum().backward()  # gradients flow back through the same widths
    stats = ex.stats.total()
    # Received: the halo rows (forward), then the gradients of the rows this rank sent.
    expected = int(codec.row_bytes(ex.halo_levels, F).sum()
                   + codec.row_bytes(ex.send_levels, F).sum())
    return dict(within=within, received=stats.bytes_received, expected=expected,
                widths=sorted(set(bits.long().tolist())), grad=x.grad is not None,
                levels=sorted(set(ex.halo_levels.tolist())))


@pytest.mark.multiprocess
def test_halo_rows_cross_at_their_node_width_both_directions():
    for rank, r in enumerate(run_distributed(_exchange, 2, 1)):
        assert r["within"], rank
        assert r["grad"], rank
        assert r["received"] == r["expected"], (rank, r)
        assert set(r["widths"]) <= set(LEVEL_BITS) and len(r["widths"]) > 1, r
    for rank, r in enumerate(run_distributed(_exchange, 2, 8)):
        assert r["widths"] == [8], r
