"""What a model exchanges: calls, channels and widths recorded by profile_model."""
import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.engine import FullGraphEngine
from lightning_fullgraph.planner import ExchangeProfile, profile_model

from .conftest import CLASSES, HIDDEN, build, partitions

IN = 8


def _widths(calls):
    return {(c.key, c.direction, c.mode, c.channel, c.reverse, c.width) for c in calls}


def _dropout_forward(model, data):  # a new input tensor every step, as NodeClassifier does
    return model(F.dropout(data.x, 0.5, model.training), data.edge_index)


def test_gcn_post_exchanges_transformed_rows_and_degrees():
    profile = profile_model(build("gcn", IN), IN, aggregation="post", forward=_dropout_forward)
    assert _widths(profile.train_first) == {
        ("convs.0.degree", "forward", "post", "post", False, 1),
        ("convs.0.propagate0.x", "forward", "post", "post", False, HIDDEN),
        ("convs.0.propagate0.x", "backward", "post", "post", True, HIDDEN),
        # no convs.1.degree: both layers share one normalization
        ("convs.1.propagate0.x", "forward", "post", "post", False, CLASSES),
        ("convs.1.propagate0.x", "backward", "post", "post", True, CLASSES),
    }
    assert all(c.row_bytes == 4 * c.width and c.layer == c.key[:7] for c in profile.train_first)
    # gcn_norm is cached after the first step: the steady state exchanges rows only.
    assert _widths(profile.train_steady) == {w for w in _widths(profile.train_first)
                                             if "degree" not in w[0]}
    # Evaluation has no dropout: the unchanged input's aggregation is reused.
    assert [(c.key, c.direction) for c in profile.eval_steady] == [
        ("convs.1.propagate0.x", "forward")]


def test_gcn_hybrid_sends_rows_and_partials_together_and_slot_degrees():
    profile = profile_model(build("gcn", IN), IN, aggregation="hybrid", forward=_dropout_forward)
    widths = _widths(profile.train_first)
    assert ("convs.0.degree.slots", "forward", "hybrid", "pre", True, 1) in widths
    # Exact: post rows and pre partials in one buffer per peer (engine/one_buffer.py).
    assert ("convs.0.propagate0.x", "forward", "hybrid", "both", False, HIDDEN) in widths
    assert ("convs.0.propagate0.x", "backward", "hybrid", "both", True, HIDDEN) in widths
    assert ("convs.1.propagate0.x", "forward", "hybrid", "both", False, CLASSES) in widths
    assert all(c.mode == "hybrid" for c in profile.train_first)
    assert not any(w[3] == "pre" and w[5] != 1 for w in widths)


def test_gcn_hybrid_with_a_quantizer_sends_rows_and_partials_in_one_buffer():
    profile = profile_model(build("gcn", IN), IN, aggregation="hybrid", forward=_dropout_forward,
                            codec="int8")
    widths = {w[:5] for w in _widths(profile.train_first)}
    assert ("convs.0.propagate0.x", "forward", "hybrid", "both", False) in widths
    assert ("convs.0.propagate0.x", "backward", "hybrid", "both", True) in widths
    assert not any(w[0].endswith(".pre") for w in widths)


def test_gcn_hybrid_whose_partials_are_coded_otherwise_keeps_the_pre_channel_apart():
    from lightning_fullgraph.engine import ExchangePolicy
    from lightning_fullgraph.engine.codecs.registry import codec_from_name
    policy = ExchangePolicy(codec_from_name("int8"), points={"*.pre": codec_from_name("int4")})
    profile = profile_model(build("gcn", IN), IN, aggregation="hybrid", forward=_dropout_forward,
                            codec=policy)
    widths = {w[:5] for w in _widths(profile.train_first)}
    assert ("convs.0.propagate0.pre", "forward", "hybrid", "pre", False) in widths
    assert ("convs.0.propagate0.pre", "backward", "hybrid", "pre", True) in widths
    assert ("convs.1.propagate0.x", "forward", "hybrid", "post", False) in widths


@pytest.mark.parametrize("kind", ["sage", "gin"])
def test_sage_and_gin_exchange_their_inputs_and_no_input_gradient(kind):
    profile = profile_model(build(kind, IN), IN, aggregation="post", forward=_dropout_forward)
    # GraphSAGE's last layer is narrower than its input: it exchanges x @ W (CLASSES wide,
    # engine/narrow_first.py); GIN's MLP is not linear, so it exchanges its input.
    last = CLASSES if kind == "sage" else HIDDEN
    assert _widths(profile.train_first) == {
        ("convs.0.propagate0.x", "forward", "post", "post", False, IN),
        ("convs.1.propagate0.x", "forward", "post", "post", False, last),
        ("convs.1.propagate0.x", "backward", "post", "post", True, last),
    }


def test_unchanged_input_is_exchanged_once():
    # model(x, edge_index) on the same x every step: the engine caches layer 1's aggregation.
    profile = profile_model(build("sage", IN), IN, aggregation="post")
    assert {c.key for c in profile.train_steady} == {"convs.1.propagate0.x"}
    assert len(profile.train) >= 2
    calls = profile.calls(train_steps=3, train_offset=0)
    assert sum(n for c, n in calls.items() if c.key == "convs.0.propagate0.x") == 1


def test_gat_stays_post_and_exchanges_attention_terms():
    profile = profile_model(build("gat", IN), IN, aggregation="hybrid", forward=_dropout_forward)
    widths = _widths(profile.train_first)
    assert all(c.mode == "post" and c.channel == "post" for c in profile.train_first)
    assert profile.effective_mode == "post"
    assert ("convs.0.propagate1.x", "forward", "post", "post", False, HIDDEN) in widths  # 2 x 8
    assert ("convs.0.edge_update0.alpha", "forward", "post", "post", False, 2) in widths  # heads
    assert ("convs.0.edge_update0.alpha", "backward", "post", "post", True, 2) in widths


def test_float64_rows_and_profile_round_trip():
    model = build("gcn", IN).double()
    profile = profile_model(model, IN, aggregation="pre", forward=_dropout_forward)
    assert all(c.row_bytes == 8 * c.width for c in profile.train_first)
    assert profile.feature_bytes == 8
    assert profile.num_parameters == sum(p.numel() for p in model.parameters())
    again = ExchangeProfile.from_dict(profile.to_dict())
    assert again == profile
    assert again.calls(2, 1) == profile.calls(2, 1)


def test_profile_leaves_model_and_random_state_alone():
    model = build("gcn", IN)
    before = [p.detach().clone() for p in model.parameters()]
    state = torch.random.get_rng_state()
    profile_model(model, IN, forward=_dropout_forward)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, p) and p.grad is None for a, p in zip(before, model.parameters()))
    assert not any("propagate" in m.__dict__ for m in model.modules())


def test_profile_refuses_an_attached_model():
    data, parts = partitions(1)
    engine = FullGraphEngine(parts[0])
    model = build("gcn", data.num_features)
    engine.attach(model, broadcast=False)
    try:
        with pytest.raises(ValueError, match="attached to an engine"):
            profile_model(model, data.num_features)
    finally:
        engine.detach()
