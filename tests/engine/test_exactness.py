"""Partitioned execution equals single-process PyG: logits, gradients, trajectories, and
after the trajectories the BatchNorm buffers (running statistics, ``num_batches_tracked``) and
the eval-mode logits, which use them.

Every comparison is per tensor (one parameter cannot hide behind a larger one), relative to
the tensor's own magnitude: fp32 within 1e-5, float64 within 1e-10.
"""
import copy

import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .models import LAYERS, Net, skewed_graph

# Adam epochs of the trajectories. 20 until CI's time budget (30 minutes, with 4 ranks on 2 cores)
# asked for fewer; the fp32 bounds below were set from measurements at 20.
EPOCHS = 10
FP32, FP64 = 1e-5, 1e-10
# Attention logits are nearly invariant to some parameter directions (a per-target
# shift of the score before softmax), so those parameters see gradients of
# rounding size, which Adam amplifies: their fp32 trajectories drift (measured
# 1e-3 for GATConv, 1e-2 for GATv2Conv after 20 epochs) although single steps agree
# to 1e-6.  Their trajectories are compared in float64 only.
NEAR_DEGENERATE = {"gat", "gatv2", "gat_edge_attr"}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _per_tensor(model, ref, what) -> dict:
    r"""``{parameter name: relative error}`` of ``what(p)`` against ``what(q)``."""
    return {name: _rel(what(p), what(q))
            for (name, p), q in zip(model.named_parameters(), ref.parameters())}


def _buffers(model, ref) -> dict:
    r"""``{buffer name: relative error}`` (``num_batches_tracked`` must be equal: 0 or 1)."""
    return {name: (0.0 if torch.equal(b, c) else 1.0) if not b.is_floating_point()
            else _rel(b, c) for (name, b), c in zip(model.named_buffers(), ref.buffers())}


def _eval_logits(model, ref, data, local, engine, dtype) -> float:
    r"""Eval-mode logits (running statistics) against one process; leaves both in eval mode."""
    model.eval(), ref.eval()
    with torch.no_grad():
        return _rel(engine.gather(model(*_inputs(local, dtype))), ref(*_inputs(data, dtype)))


def _inputs(data, dtype):
    return (data.x.to(dtype), data.edge_index, data.edge_weight.to(dtype),
            data.edge_attr.to(dtype))


def _loss(model, data, inputs):
    out = model(*inputs)
    return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])


def _trajectory(ref, model, data, local, engine, dtype) -> dict:
    r""":data:`EPOCHS` Adam epochs side by side; per-tensor relative parameter difference at the end."""
    opt_ref = torch.optim.Adam(ref.parameters(), lr=0.01)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(EPOCHS):
        opt_ref.zero_grad()
        _loss(ref, data, _inputs(data, dtype)).backward()
        opt_ref.step()
        opt.zero_grad()
        engine.backward(_loss(model, local, _inputs(local, dtype)))
        opt.step()
    return _per_tensor(model, ref, lambda p: p.detach())


def _pair(kind, data, engine, dtype=torch.float32):
    torch.manual_seed(1)
    ref = Net(kind, data.num_features, 4).to(dtype)
    model = copy.deepcopy(ref)
    engine.attach(model)
    return ref, model


def _kinds(aggregation: str):
    # Attention layers never pre-aggregate: they run exactly as in "post" under every mode
    # (checked there); "sage_max" stays as the ineligible layer inside a hybrid/pre engine.
    return [k for k in LAYERS if aggregation == "post" or k not in NEAR_DEGENERATE]


def _compare_all_layers(rank: int, world_size: int, aggregation: str = "post"):
    torch.manual_seed(0)
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation=aggregation))
    local = engine.data
    errors = {}
    for kind in _kinds(aggregation):
        ref, model = _pair(kind, data, engine)

        # One forward/backward in fp32: logits and gradients.
        out_ref = ref(*_inputs(data, torch.float32))
        F.cross_entropy(out_ref[data.train_mask], data.y[data.train_mask]).backward()
        out = model(*_inputs(local, torch.float32))
        engine.backward(F.cross_entropy(out[local.train_mask], local.y[local.train_mask]))
        err = dict(logits=_rel(engine.gather(out), out_ref.detach()),
                   grads=_per_tensor(model, ref, lambda p: p.grad))

        # EPOCHS Adam epochs from the same start in fp32 (where meaningful, see
        # NEAR_DEGENERATE), and in float64, where rounding noise sits far below
        # Adam's eps so the comparison measures the engine alone.
        if kind not in NEAR_DEGENERATE:
            err["params32"] = _trajectory(ref, model, data, local, engine, torch.float32)
            err["buffers32"] = _buffers(model, ref)
            err["eval32"] = _eval_logits(model, ref, data, local, engine, torch.float32)
        engine.detach()
        ref, model = _pair(kind, data, engine, torch.float64)
        err["params64"] = _trajectory(ref, model, data, local, engine, torch.float64)

        # Eval mode uses the synchronized running statistics.
        err["buffers64"] = _buffers(model, ref)
        err["eval64"] = _eval_logits(model, ref, data, local, engine, torch.float64)
        engine.detach()
        errors[kind] = err
    return errors


# A rank sums a node's messages in its local edge order and partial aggregates arrive in
# another; 20 fp32 Adam steps amplify that rounding, in one tensor only (GINConv's last MLP
# weight, whose sum aggregation feeds two linear layers): measured with METIS' volume
# objective 1.66e-5 in post (P=3), 1.80e-5 in hybrid (P=2), 1.20e-5 in pre; every other
# tensor of every layer stays below 1e-5, and single steps (logits, gradients) below 1e-5
# too. float64 trajectories, asserted below, stay at 1e-10: the engine itself is exact.
TRAJECTORY32 = {"post": 3e-5, "hybrid": 3e-5, "pre": 3e-5}


# P = 3 (the odd world size) runs hybrid and pre; "post" there is what hybrid runs for every
# layer it does not pre-aggregate, and tests/engine/test_catalogue.py checks post at P = 3 for
# every catalogued layer, attention included (logits and gradients; trajectories of post run
# at P = 2 and 4 here: kept out of CI's time budget at 3).
@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size,aggregation", [
    (2, "post"), (4, "post"),
    (2, "hybrid"), (3, "hybrid"), (4, "hybrid"),
    (2, "pre"), (3, "pre"), (4, "pre"),
])
def test_partitioned_equals_single_process(world_size, aggregation):
    results = run_distributed(_compare_all_layers, world_size, aggregation)
    for rank, errors in enumerate(results):
        assert set(errors) == set(_kinds(aggregation))
        for kind, err in errors.items():
            where = (rank, kind)
            assert err["logits"] < FP32, (where, err)
            assert err["eval64"] < FP64, (where, err)
            assert set(err["buffers64"]) == {"bn.running_mean", "bn.running_var",
                                             "bn.num_batches_tracked"}, (where, err)
            for name, value in err["buffers64"].items():
                assert value < FP64, (where, "float64 buffer", name, value)
            for name, value in err.get("buffers32", {}).items():
                assert value < TRAJECTORY32[aggregation], (where, "fp32 buffer", name, value)
            if "eval32" in err:
                assert err["eval32"] < TRAJECTORY32[aggregation], (where, "fp32 eval", err)
            for name, value in err["grads"].items():
                assert value < FP32, (where, "grad", name, value)
            for name, value in err.get("params32", {}).items():
                assert value < TRAJECTORY32[aggregation], (where, "fp32 trajectory", name, value)
            for name, value in err["params64"].items():
                assert value < FP64, (where, "float64 trajectory", name, value)
