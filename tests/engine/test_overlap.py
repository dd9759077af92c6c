"""Overlap of the synchronous halo exchange with the owned-source aggregation
(``FullGraphEngine(overlap=True)``; kernels/split.py), forward and backward.

Every run trains the same model with overlap off and on and in one process: the same
losses and parameters to fp32 rounding (the sum runs owned sources first), the very same
bytes on the wire, the split aggregation really ran, and the halo gradients started back
to their owners before the owned part's backward ran (asynchronously, completed after it).
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn.models import GCN, GIN, GraphSAGE

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
from lightning_fullgraph.testing import run_distributed

from .models import rank_partition

EPOCHS = 4


def _model(kind, in_channels, out_channels):
    if kind == "sage3":  # its middle layer maps 16 -> 16 after aggregating an input with grad
        return GraphSAGE(in_channels, 16, 3, out_channels)
    return {"gcn": GCN, "gin": GIN, "sage": GraphSAGE}[kind](in_channels, 16, 2, out_channels)


def _train(model, data, backward):
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(EPOCHS):
        opt.zero_grad()
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        backward(loss)
        opt.step()
        losses.append(float(loss.detach()))
    return losses, out.detach()


def _run(rank, world_size, kind, aggregation, sampling=None, hook_lin_l=False):
    import lightning_fullgraph.kernels.pyg as kernel_pyg

    calls = [0]
    inner = kernel_pyg.aggregate_split

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    kernel_pyg.aggregate_split = counted
    from lightning_fullgraph.engine import exchange as exchange_module
    from lightning_fullgraph.kernels import functional

    events = []
    start, owned = exchange_module.HaloExchange._transfer_async, exchange_module._OwnedGrad

    def started(self, flat, send_counts, recv_counts, key, direction, levels=None):
        finish = start(self, flat, send_counts, recv_counts, key, direction, levels)
        events.append(("start", direction))

        def completed():
            events.append(("complete", direction))
            return finish()
        return completed

    exchange_module.HaloExchange._transfer_async = started
    csr_sum = functional.ops.csr_sum

    class Noted(torch.autograd.Function):  # notes when the backward of what it wraps runs
        @staticmethod
        def forward(ctx, x, label):
            ctx.label = label
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            events.append((ctx.label, None))
            return grad, None

    def noted_sum(rowptr, col, w, x, *args):
        return csr_sum(rowptr, col, w, Noted.apply(x, "sum backward") if x.requires_grad else x,
                       *args)

    functional.ops.csr_sum = noted_sum
    from lightning_fullgraph.kernels import split as split_module

    in_flight = split_module.InFlight.run

    def noted_run(self):  # SAGEConv's root term, computed while the halo is in flight
        if not self.ran:
            in_flight(self)
            events.append(("in flight", None))
            self.result = Noted.apply(self.result, "in-flight backward")
        return self.result

    split_module.InFlight.run = noted_run
    from lightning_fullgraph.kernels import deferred_weight

    sink = deferred_weight._WeightSink.backward

    def noted_sink(ctx, grad):  # lin_l's weight gradient, deferred past the transfer's start
        events.append(("weight backward", None))
        return sink(ctx, grad)

    deferred_weight._WeightSink.backward = staticmethod(noted_sink)
    data, part = rank_partition(rank, world_size)
    torch.manual_seed(1)
    ref = _model(kind, data.num_features, 4)
    out = {}
    for overlap in (False, True):
        calls[0] = 0
        events.clear()
        exchange = ExchangeConfig(aggregation=aggregation, overlap=overlap, sampling=sampling,
                                  step_aside=False)
        engine = FullGraphEngine(part, exchange=exchange, static_inputs=False)
        model = copy.deepcopy(ref)
        hooked = []
        if hook_lin_l:  # a user's hook sees the middle layer's lin_l called, every forward
            model.convs[1].lin_l.register_forward_hook(lambda *_: hooked.append(1))
        engine.attach(model)
        engine.use_kernels("auto")
        losses, logits = _train(model, engine.data, engine.backward)
        total = engine.stats.total()
        out[overlap] = dict(losses=losses, logits=logits, calls=calls[0], hooked=len(hooked),
                            events=list(events),
                            params=[p.detach().clone() for p in model.parameters()],
                            bytes=total.bytes_sent + total.bytes_received)
        engine.detach()
    on, off = out[True], out[False]
    if sampling is not None:  # a sampled model is not one process's: overlap on against off
        return dict(calls_on=on["calls"], calls_off=off["calls"], events_on=on["events"],
                    bytes_on=on["bytes"], bytes_off=off["bytes"],
                    loss_error=max(abs(a - b) for a, b in zip(on["losses"], off["losses"])),
                    param_error=max(float((a - b).abs().max() / b.abs().max().clamp_min(1.0))
                                    for a, b in zip(on["params"], off["params"])))
    single = copy.deepcopy(ref)
    _, single_logits = _train(single, data, lambda loss: loss.backward())
    owned = part.owned_ids
    return dict(
        calls_on=on["calls"], calls_off=off["calls"], events_on=on["events"],
        hooked_on=on["hooked"],
        bytes_on=on["bytes"], bytes_off=off["bytes"],
        loss_error=max(abs(a - b) for a, b in zip(on["losses"], off["losses"])),
        param_error=max(float((a - b).abs().max() / b.abs().max().clamp_min(1.0))
                        for a, b in zip(on["params"], off["params"])),
        single_error=max(float((a - b).abs().max() / b.abs().max().clamp_min(1.0))
                         for a, b in zip(on["params"], single.parameters())),
        logits_error=float((on["logits"] - single_logits[owned]).abs().max()))


@pytest.mark.parametrize("kind", ["gcn", "gin", "sage", "sage3"])
@pytest.mark.parametrize("aggregation", ["post", "hybrid"])
def test_overlap_is_exact_and_sends_the_same(kind, aggregation):
    for r in run_distributed(_run, 2, kind, aggregation):
        assert r["calls_off"] == 0
        # Two layers (three), four epochs: every aggregation ran split (SAGE's means too).
        assert r["calls_on"] == (3 if kind == "sage3" else 2) * EPOCHS
        # Backward: the halo gradients of every layer whose rows need a gradient (not the
        # first of GIN and SAGE, whose input is the features) start back to their owners, an
        # owned-source sum's backward runs, then they complete.
        events = r["events_on"]
        backward = [i for i, e in enumerate(events) if e[1] == "backward"]
        layers = 1 if kind in ("gin", "sage") else 2  # GCN transforms before it aggregates
        assert len(backward) == 2 * layers * EPOCHS
        pairs = list(zip(backward[::2], backward[1::2]))
        for s, c in pairs:
            assert events[s] == ("start", "backward") and events[c] == ("complete", "backward")
            assert ("sum backward", None) in events[s + 1:c]
        weights = [e for e in events if e[0] == "weight backward"]
        if kind == "sage3":
            # The middle layer's lin_l weight gradient ran while its halo gradients travelled
            # (the last layer narrows: it maps first, nothing after its aggregation to defer;
            # the first layer's input has no halo gradients, its deferred one runs anyway).
            assert len(weights) == 2 * EPOCHS
            assert sum(events[s + 1:c].count(("weight backward", None))
                       for s, c in pairs) == EPOCHS, events
        else:  # the last layer narrows; GCN and GIN map before they aggregate
            assert len(weights) == (EPOCHS if kind == "sage" else 0)
        if kind in ("sage", "sage3"):
            # SAGEConv's root term x_r @ W_r^T ran while each forward halo was in flight, and
            # its backward while the halo gradients travelled back.
            for direction, noted in (("forward", "in flight"), ("backward", "in-flight backward")):
                at = [i for i, e in enumerate(events) if e[1] == direction]
                pairs = list(zip(at[::2], at[1::2]))
                assert pairs and all((noted, None) in events[s + 1:c] for s, c in pairs), \
                    (direction, events)
        assert r["bytes_on"] == r["bytes_off"]
        assert r["loss_error"] <= 1e-6
        assert r["param_error"] <= 1e-5 and r["single_error"] <= 1e-5
        assert r["logits_error"] <= 1e-4


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_boundary_sampling_overlaps_too(kind):
    # Training steps under boundary sampling: the kept rows travel while the owned part
    # aggregates and their gradients while its backward runs, as in exact modes; the same
    # draws, bytes and model as the synchronous exchange, to fp32 rounding.
    for r in run_distributed(_run, 2, kind, "post", 0.5):
        assert r["calls_off"] == 0 and r["calls_on"] == 2 * EPOCHS
        events = r["events_on"]
        backward = [i for i, e in enumerate(events) if e[1] == "backward"]
        layers = 2 if kind == "gcn" else 1
        assert len(backward) == 2 * layers * EPOCHS
        for s, c in zip(backward[::2], backward[1::2]):
            assert events[s] == ("start", "backward") and events[c] == ("complete", "backward")
            assert ("sum backward", None) in events[s + 1:c]
        forward = [e for e in events if e[1] == "forward"]
        assert forward.count(("start", "forward")) == 2 * EPOCHS
        assert r["bytes_on"] == r["bytes_off"]
        assert r["loss_error"] <= 1e-6 and r["param_error"] <= 1e-5


def test_a_hook_on_lin_l_keeps_its_call():
    # A forward hook on the middle layer's lin_l: the layer calls it (the hook sees every
    # forward), so its weight gradient is not deferred; the first layer's still is.
    for r in run_distributed(_run, 2, "sage3", "post", None, True):
        assert r["hooked_on"] == EPOCHS
        assert [e for e in r["events_on"] if e[0] == "weight backward"] == \
            [("weight backward", None)] * EPOCHS
        assert r["param_error"] <= 1e-5 and r["single_error"] <= 1e-5
