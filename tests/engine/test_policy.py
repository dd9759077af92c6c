"""``ExchangePolicy``: which codec each exchange point uses in each direction."""
import pytest
import torch

from lightning_fullgraph.engine import Codec, ExchangePolicy, IdentityCodec


class Tagged(Codec):
    r"""A codec that only carries a name (the policy never calls encode/decode)."""

    def __init__(self, name, lossless=True):
        self.name = name
        self.lossless = lossless

    def encode(self, rows, ctx):
        return rows

    def decode(self, wire, ctx):
        return wire

    def __repr__(self):
        return f"Tagged({self.name})"


A, B, C, D = Tagged("a"), Tagged("b"), Tagged("c"), Tagged("d")
POINTS = ["conv1.propagate0.x", "conv1.propagate0.x.pre", "conv2.propagate0.x",
          "conv2.propagate0.x.pre", "conv2.degree", "lin"]


def test_default_is_exact_everywhere():
    policy = ExchangePolicy()
    for key in POINTS:
        for direction in ("forward", "backward"):
            assert isinstance(policy.codec(key, direction), IdentityCodec)
    assert policy.lossless


def test_one_codec_for_both_directions_and_direction_overrides():
    both = ExchangePolicy(A)
    assert all(both.codec(k, d) is A for k in POINTS for d in ("forward", "backward"))
    split = ExchangePolicy(A, backward=B)
    assert split.codec("conv1.propagate0.x", "forward") is A
    assert split.codec("conv1.propagate0.x", "backward") is B
    only_forward = ExchangePolicy(forward=C)
    assert only_forward.codec("lin", "forward") is C
    assert isinstance(only_forward.codec("lin", "backward"), IdentityCodec)
    both_set = ExchangePolicy(A, forward=C, backward=D)
    assert both_set.codec("lin", "forward") is C and both_set.codec("lin", "backward") is D


def test_points_by_glob_first_match_wins():
    policy = ExchangePolicy(D, points={
        "conv1.*": A,                                   # a codec: both directions
        "*.pre": ExchangePolicy(forward=B, backward=C),  # a policy: per direction
        "conv2.degree": Tagged("exact name"),
        "conv2.deg*": Tagged("shadowed"),              # matches too, but comes later
    })
    # conv1's partial aggregates match both "conv1.*" and "*.pre": the first pattern wins.
    assert policy.codec("conv1.propagate0.x.pre", "forward") is A
    assert policy.codec("conv1.propagate0.x.pre", "backward") is A
    assert policy.codec("conv1.propagate0.x", "backward") is A
    assert policy.codec("conv2.propagate0.x.pre", "forward") is B
    assert policy.codec("conv2.propagate0.x.pre", "backward") is C
    assert policy.codec("conv2.degree", "forward").name == "exact name"
    assert policy.codec("conv2.degrees", "forward").name == "shadowed"
    # Unmatched points take the policy's own codec.
    assert policy.codec("conv2.propagate0.x", "forward") is D
    assert policy.codec("lin", "backward") is D


def test_glob_matching_is_whole_key_and_case_sensitive():
    policy = ExchangePolicy(points={"conv1.*.x": A, "conv?.degree": B, "[ab]*": C})
    assert policy.codec("conv1.propagate0.x", "forward") is A
    # The whole key must match (a pattern is no prefix).
    assert isinstance(policy.codec("conv1.propagate0.x.pre", "forward"), IdentityCodec)
    assert isinstance(policy.codec("Conv1.propagate0.x", "forward"), IdentityCodec)
    assert policy.codec("conv3.degree", "backward") is B
    assert isinstance(policy.codec("conv10.degree", "backward"), IdentityCodec)  # ? is one char
    assert policy.codec("attn.propagate0.x", "forward") is C
    assert isinstance(policy.codec("conv1", "forward"), IdentityCodec)


def test_insertion_order_decides_between_overlapping_patterns():
    first = ExchangePolicy(points={"*.pre": A, "conv1.*": B})
    second = ExchangePolicy(points={"conv1.*": B, "*.pre": A})
    assert first.codec("conv1.propagate0.x.pre", "forward") is A
    assert second.codec("conv1.propagate0.x.pre", "forward") is B


def test_bad_direction():
    with pytest.raises(ValueError, match=r"direction must be one of \('forward', 'backward'\), "
                                         r"got 'sideways'"):
        ExchangePolicy().codec("lin", "sideways")
    with pytest.raises(ValueError, match="direction must be one of"):
        ExchangePolicy(points={"*": A}).codec("lin", "Forward")


def test_of_conversions():
    assert isinstance(ExchangePolicy.of(None), ExchangePolicy)
    assert isinstance(ExchangePolicy.of(None).codec("x", "forward"), IdentityCodec)
    policy = ExchangePolicy(A)
    assert ExchangePolicy.of(policy) is policy  # unchanged, not copied
    from_codec = ExchangePolicy.of(B)
    assert isinstance(from_codec, ExchangePolicy)
    assert from_codec.codec("x", "forward") is B and from_codec.codec("x", "backward") is B
    identity = IdentityCodec()
    assert ExchangePolicy.of(identity).codec("x", "backward") is identity


@pytest.mark.parametrize("value, name", [(3, "int"), (IdentityCodec, "type"),
                                         ({"*": None}, "dict")])
def test_of_rejects_other_values(value, name):
    with pytest.raises(TypeError, match=f"expected an ExchangePolicy, a Codec or a codec name, "
                                        f"got {name}"):
        ExchangePolicy.of(value)


def test_of_takes_codec_names():
    # Strings name codecs (tests/engine/test_codec_registry.py); unknown names say which exist.
    assert ExchangePolicy.of("int8").codec("x", "forward").bits == 8
    with pytest.raises(ValueError, match="unknown codec 'int3'"):
        ExchangePolicy.of("int3")


def test_constructor_type_errors_name_the_argument():
    with pytest.raises(TypeError, match=r"ExchangePolicy\(codec=...\) takes a Codec, got str"):
        ExchangePolicy("fp16")
    with pytest.raises(TypeError, match=r"ExchangePolicy\(forward=...\) takes a Codec, got "
                                        r"ExchangePolicy"):
        ExchangePolicy(forward=ExchangePolicy())
    with pytest.raises(TypeError, match=r"ExchangePolicy\(backward=...\) takes a Codec, got "
                                        r"dtype"):
        ExchangePolicy(backward=torch.float16)
    with pytest.raises(TypeError, match=r"ExchangePolicy\(codec=...\) takes a Codec, got str"):
        ExchangePolicy(points={"conv1.*": "int8"})  # a rule is a policy or a codec


def test_lossless():
    lossy = Tagged("lossy", lossless=False)
    assert ExchangePolicy().lossless
    assert ExchangePolicy(A, backward=B, points={"conv1.*": C}).lossless
    assert not ExchangePolicy(lossy).lossless
    assert not ExchangePolicy(forward=lossy).lossless
    assert not ExchangePolicy(backward=lossy).lossless
    assert not ExchangePolicy(points={"conv1.*": lossy}).lossless
    assert not ExchangePolicy(points={"conv1.*": ExchangePolicy(backward=lossy)}).lossless
    assert not ExchangePolicy(points={"a": A, "b": ExchangePolicy(
        points={"b.c": ExchangePolicy(forward=lossy)})}).lossless  # nested points
    # An overridden codec is never used, but lossless looks at what the policy can return.
    assert ExchangePolicy(lossy, forward=A, backward=B).lossless
