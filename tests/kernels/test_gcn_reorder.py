"""GCNConv on an input without gradient (``kernels.gcn_reorder``): aggregated first, and its
aggregate kept while the input is unchanged (``kernels.kept``), equal to PyG's forward and
gradients within floating-point reassociation; PyG's order wherever the other order could be seen
or is dearer."""
import gc

import pytest
import torch
from torch_geometric.nn import GCNConv

import lightning_fullgraph.kernels as K
from lightning_fullgraph.kernels import gcn, kept

from kernel_testutils import fresh_kernel_state, random_features_graph


@pytest.fixture(autouse=True)
def _fresh():
    with fresh_kernel_state(K.set_static_inputs):
        yield


def _graph(n=80, e=600, f=16, dtype=torch.float32, seed=0):
    return random_features_graph(n, e, f, dtype=dtype, seed=seed, weights=True)


def _close(got, want, tol):
    for a, b in zip((got[0],) + tuple(got[1]), (want[0],) + tuple(want[1])):
        assert (a - b).abs().max() <= tol * b.abs().max(), (a - b).abs().max()


def _step_any(conv, x, edge_index, w):
    out = conv(x, edge_index, w)
    params = [p for p in (conv.lin.weight, conv.bias) if p is not None]
    return out.detach(), torch.autograd.grad(out.square().sum(), params)


def _step_ref(conv, x, edge_index, w):
    K.set_static_inputs("off")
    try:
        return _step_any(conv, x, edge_index, w)
    finally:
        K.set_static_inputs(None)


NOTHING = {"hits": 0, "kept": 0, "aggregations": 0, "bytes": 0}


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("options", [{}, {"improved": True}, {"add_self_loops": False},
                                     {"normalize": False}, {"bias": False}, {"cached": True}])
def test_static_input_is_aggregated_first_kept_and_equals_pyg(dtype, tol, weighted, options):
    torch.manual_seed(0)
    x, edge_index, w = _graph(dtype=dtype)
    w = w if weighted else None
    conv = GCNConv(16, 16, **options).to(dtype)
    want = _step_ref(conv, x, edge_index, w)
    conv._cached_edge_index = None
    with K.accelerate(conv, backend="auto"):
        for _ in range(4):
            _close(_step_any(conv, x, edge_index, w), want, tol)
    # Aggregated first in every call: kept from the second call on (the same input twice in a
    # row), answered from then.
    assert kept.info() == {"hits": 2, "kept": 1, "aggregations": 1, "bytes": 80 * 16 * x.element_size()}


def test_under_use_the_first_layer_of_a_model_is_kept():
    # K.use(): the first call is PyG's forward (see kernels.use); the later ones aggregate first.
    x, edge_index, _ = _graph()
    torch.manual_seed(0)
    conv = GCNConv(16, 16)
    want = _step_ref(conv, x, edge_index, None)
    with K.use("auto"):
        for _ in range(4):
            _close(_step_any(conv, x, edge_index, None), want, 1e-5)
    assert kept.info()["kept"] == 1 and kept.info()["hits"] == 1


def test_an_input_that_needs_a_gradient_keeps_pygs_order_bit_for_bit():
    x, edge_index, w = _graph()
    conv = GCNConv(16, 16)
    xg = x.clone().requires_grad_()
    K.set_static_inputs("off")
    with K.accelerate(conv, backend="auto"):
        want = _step_any(conv, xg, edge_index, w)
    K.set_static_inputs(None)
    with K.accelerate(conv, backend="auto"):
        for _ in range(2):
            got = _step_any(conv, xg, edge_index, w)
            assert torch.equal(got[0], want[0])
            assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    assert kept.info() == NOTHING


def test_a_wide_input_is_aggregated_first_from_its_second_call():
    # F_in = 48 > 2 F_out = 32: aggregating x first is dearer once, but a static input pays it once.
    x, edge_index, _ = _graph(f=48)
    conv = GCNConv(48, 16)
    want = _step_ref(conv, x, edge_index, None)
    with K.accelerate(conv, backend="auto"):
        _close(_step_any(conv, x, edge_index, None), want, 1e-5)
        assert kept.info()["kept"] == 0
        for _ in range(2):
            _close(_step_any(conv, x, edge_index, None), want, 1e-5)
    assert kept.info() == {"hits": 1, "kept": 1, "aggregations": 1, "bytes": 80 * 48 * 4}


def test_a_new_input_every_call_is_aggregated_first_and_not_kept():
    # Input dropout: a new tensor each call. Aggregating it first still saves the backward
    # aggregation (F_in <= 2 F_out); nothing is kept.
    x, edge_index, _ = _graph()
    conv = GCNConv(16, 16)
    mapped = []
    original = conv.lin.forward
    conv.lin.forward = lambda t: (mapped.append(t), original(t))[1]  # not a hook: not observed
    with K.accelerate(conv, backend="auto"):
        for _ in range(3):
            xi = x.clone()
            got = _step_any(conv, xi, edge_index, None)
            assert mapped[-1] is not xi and mapped[-1].shape == xi.shape  # the aggregation of xi
            _close(got, _step_ref(conv, xi, edge_index, None), 1e-5)
            assert mapped[-1] is xi  # PyG's order maps xi itself
    assert kept.info() == NOTHING


def test_no_grad_evaluation_aggregates_first_only_when_not_dearer():
    x, edge_index, _ = _graph(f=24)
    narrow = GCNConv(24, 16)  # F_in > F_out: one aggregation of x W is cheaper, once
    K.set_static_inputs("off")
    with torch.no_grad():
        want = narrow(x, edge_index)
    K.set_static_inputs(None)
    with K.accelerate(narrow, backend="auto"), torch.no_grad():
        _close((narrow(x, edge_index), ()), (want, ()), 1e-5)
        assert kept.info() == NOTHING
        _close((narrow(x, edge_index), ()), (want, ()), 1e-5)  # the same input again: kept
        assert kept.info()["kept"] == 1
    kept.clear()
    wide = GCNConv(24, 32)
    K.set_static_inputs("off")
    with torch.no_grad():
        want = wide(x, edge_index)
    K.set_static_inputs(None)
    with K.accelerate(wide, backend="auto"), torch.no_grad():
        for _ in range(3):
            got = wide(x, edge_index)
            _close((got, ()), (want, ()), 1e-5)
    assert kept.info()["kept"] == 1 and kept.info()["hits"] == 1


def test_in_place_edits_and_freed_inputs_are_not_served_stale():
    x, edge_index, w = _graph()
    conv = GCNConv(16, 16)
    with K.accelerate(conv, backend="auto"):
        for _ in range(3):
            _step_any(conv, x, edge_index, w)
        assert kept.info()["hits"] == 1
        x.mul_(2)  # the features edited in place
        got = _step_any(conv, x, edge_index, w)
        w.add_(1)  # the edge weights edited in place: a new normalization
        got_w = _step_any(conv, x, edge_index, w)
        assert kept.info()["hits"] == 1
    _close(got_w, _step_ref(conv, x, edge_index, w), 1e-5)
    w.sub_(1)
    _close(got, _step_ref(conv, x, edge_index, w), 1e-5)
    del x
    gc.collect()
    assert kept.info()["aggregations"] == 0  # gone with its input


@pytest.mark.parametrize("case", ["grad_weights", "autocast", "inference", "lin_hook",
                                  "propagate_hook", "message_hook", "decomposed", "off",
                                  "bfloat16"])
def test_pygs_order_wherever_the_other_could_be_seen_or_not_kept(case):
    x, edge_index, w = _graph()
    conv = GCNConv(16, 16)
    seen = []
    if case == "grad_weights":
        w.requires_grad_()
    if case == "lin_hook":
        conv.lin.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    if case == "propagate_hook":
        conv.register_propagate_forward_hook(lambda m, a, out: seen.append(out))
    if case == "message_hook":  # (PyG's test_gcn_conv_with_decomposed_layers)
        conv.register_message_forward_pre_hook(lambda m, a: seen.append(a[0]["x_j"].size(-1)))
    if case == "decomposed":
        conv.decomposed_layers = 2
    if case == "off":
        K.set_static_inputs("off")
    if case == "bfloat16":
        conv, x = conv.to(torch.bfloat16), x.to(torch.bfloat16)
    with K.accelerate(conv, backend="auto"):
        for _ in range(3):
            if case == "autocast":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    conv(x, edge_index, w)
            elif case == "inference":
                with torch.inference_mode():
                    conv(x, edge_index, w)
            else:
                conv(x, edge_index, w)
    assert kept.info() == NOTHING
    if case == "lin_hook":  # the map saw x, as in PyG
        assert len(seen) == 3 and all(a is x for a in seen)
    if case == "propagate_hook":  # the hook saw the aggregation of x W, as in PyG
        assert len(seen) == 3 and all(out.requires_grad for out in seen)
    if case == "message_hook":  # the messages are rows of x W, as in PyG
        assert seen == [conv.out_channels] * 3



def test_a_new_normalization_is_aggregated_anew():
    x, edge_index, _ = _graph()
    conv = GCNConv(16, 16)
    with K.accelerate(conv, backend="auto"):
        for _ in range(3):
            a = _step_any(conv, x, edge_index, None)
        gcn.clear_memo()  # a new normalization: new tensors, not the kept aggregate's graph
        b = _step_any(conv, x, edge_index, None)
    assert kept.info()["hits"] == 1
    _close(b, a, 1e-6)


def test_kept_per_layer_and_gone_with_it():
    # Two layers reading the same features aggregate them differently (sum and mean): each
    # its own aggregate, each equal to its own reference.
    x, edge_index, _ = _graph()
    convs = [GCNConv(16, 16), GCNConv(16, 16, aggr="mean")]
    wants = [_step_ref(conv, x, edge_index, None) for conv in convs]
    with K.accelerate(convs[0], backend="auto"), K.accelerate(convs[1], backend="auto"):
        for _ in range(3):
            for conv, want in zip(convs, wants):
                _close(_step_any(conv, x, edge_index, None), want, 1e-5)
    assert kept.info()["aggregations"] == 2 and kept.info()["hits"] == 2
    del convs, conv
    gc.collect()
    assert kept.info()["aggregations"] == 0


def test_off_stops_using_what_was_kept():
    x, edge_index, _ = _graph()
    conv = GCNConv(16, 16)
    with K.accelerate(conv, backend="auto"):
        for _ in range(3):
            _step_any(conv, x, edge_index, None)
        assert kept.info()["hits"] == 1
        K.set_static_inputs("off")
        got = _step_any(conv, x, edge_index, None)
        want = _step_any(conv, x.clone(), edge_index, None)  # PyG's order, nothing kept
    assert torch.equal(got[0], want[0]) and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    assert kept.info()["hits"] == 1 and kept.info()["aggregations"] == 1  # until clear_memos
    K.clear_memos()
    assert kept.info() == NOTHING
