"""Codecs by name: what `codec="int2"` means on the strategy, the engine and the CLI."""
import pytest
import torch

from lightning_fullgraph.engine import ExchangeConfig, ExchangePolicy
from lightning_fullgraph.engine.codecs import IdentityCodec
from lightning_fullgraph.engine.codecs.registry import CODEC_NAMES, codec_from_name, wire_bits


def test_names_resolve_to_codecs():
    assert codec_from_name("fp32") is None and codec_from_name("identity") is None
    assert type(codec_from_name("bf16")).__name__ == "BFloat16Codec"
    for bits in (1, 2, 4, 8):
        codec = codec_from_name(f"int{bits}")
        assert codec.bits == bits and codec.rounding == "stochastic" and not codec.lossless
    assert codec_from_name("int2-nearest").rounding == "nearest"
    adaptive = codec_from_name("adaptive")
    assert adaptive.per_node and adaptive.bits == 1
    floor2 = codec_from_name("adaptive2")  # a 2-bit floor: levels give 2, 2, 4, 8 bits
    assert floor2.per_node and floor2.bits == 2
    assert floor2.row_bits(torch.tensor([0, 1, 2, 3])).tolist() == [2, 2, 4, 8]
    assert codec_from_name("adaptive2-nearest").rounding == "nearest"
    compact = codec_from_name("int2-compact")
    assert compact.bits == 2 and compact.header == "bfloat16" and compact.rounding == "stochastic"
    assert codec_from_name("int2").header == "float32"
    for name in ("int4-nearest-compact", "int4-compact-nearest"):  # suffixes in any order
        both = codec_from_name(name)
        assert both.rounding == "nearest" and both.header == "bfloat16" and both.bits == 4
    assert codec_from_name("adaptive2-compact").header == "bfloat16"
    assert ExchangePolicy.of("int2-compact").describe() == "int2-compact"
    assert set(CODEC_NAMES) >= {"fp32", "bf16", "int8", "int4", "int2", "int1", "adaptive"}


@pytest.mark.parametrize("name", ["int3", "fp16", "int2-up", "bf16-nearest", "adaptive3",
                                  "adaptive2-up", "int2-compact-compact", "int2-nearest-stochastic",
                                  "fp32-compact", "bf16-compact"])
def test_unknown_names_list_the_known_ones(name):
    with pytest.raises(ValueError, match="expected one of fp32, bf16"):
        codec_from_name(name)


def test_policy_from_a_name_describes_itself_and_lists_its_codecs():
    exact = ExchangePolicy.of("fp32")
    assert exact.lossless and exact.describe() == "fp32" and list(exact.codecs()) == []
    int2 = ExchangePolicy.of("int2")
    assert not int2.lossless and int2.describe() == "int2"
    assert [c.bits for c in int2.codecs()] == [2]
    mixed = ExchangePolicy(forward=codec_from_name("int4"))
    assert mixed.describe() == "forward int4, backward fp32"
    assert ExchangePolicy.of("bf16").describe() == "bf16"
    assert ExchangePolicy.of("adaptive").describe().startswith("adaptive")
    with pytest.raises(TypeError, match="codec name"):
        ExchangePolicy.of(3)


def test_wire_bits_of_each_format():
    assert wire_bits(None) == 32 and wire_bits(IdentityCodec()) == 32
    assert wire_bits(IdentityCodec(), dtype_bits=64) == 64
    assert wire_bits(codec_from_name("int2")) == 2
    assert wire_bits(codec_from_name("bf16")) == 16


def test_engine_takes_a_codec_name(tmp_path):
    from lightning_fullgraph.engine import FullGraphEngine
    from lightning_fullgraph.partition import build_local_partitions

    from .models import skewed_graph
    data = skewed_graph()
    part = build_local_partitions(data, torch.zeros(data.num_nodes, dtype=torch.long))[0]
    engine = FullGraphEngine(part, exchange=ExchangeConfig(codec="int4", step_aside=False))
    assert engine.policy.describe() == "int4"


def test_the_planner_refuses_per_node_widths_instead_of_undercounting():
    from torch_geometric.nn import GCNConv

    from lightning_fullgraph.planner import profile_model
    with pytest.raises(ValueError, match="per-node bit widths"):
        profile_model(GCNConv(4, 4), 4, codec="adaptive")
