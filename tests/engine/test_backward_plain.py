r"""A plain ``loss.backward()`` on an attached model trains what one process trains.

The engine's gradient hooks (:class:`~lightning_fullgraph.engine.gradients.BackwardHooks`)
weight the output's gradient by :math:`P \cdot n_r / N` and average the parameter gradients
over the ranks when the pass completes.  Checked at P = 2 against single-process PyG (fp32,
1e-5 per tensor): logits, gradients and 10 Adam steps with ``loss.backward()``, with
``engine.backward(loss)`` beside it (unchanged), two backward calls per step, an L2 term on the
parameters, a summed loss, a learnable input outside the model; what is left alone
(``torch.autograd.grad``, eval mode, ``scale_loss`` + ``all_reduce_gradients``); and the
refusal of a backward that bypasses the model's output, raised on every rank.
"""
import copy
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lightning_fullgraph.engine import FullGraphEngine
from lightning_fullgraph.engine.gradients import UnreducedBackwardError
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .models import Net, skewed_graph

FP32 = 1e-5
STEPS = 10
L2 = 1e-2


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _setup(rank: int, world_size: int, **engine_kwargs):
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    engine = FullGraphEngine(build_local_partitions(data, parts)[rank], **engine_kwargs)
    return data, engine, engine.data


def _pair(data, engine):
    torch.manual_seed(1)
    ref = Net("gcn", data.num_features, 4)
    model = copy.deepcopy(ref)
    engine.attach(model)
    return ref, model


def _loss(model, graph, mode: str, x=None):
    out = model(graph.x if x is None else x, graph.edge_index)
    mask = graph.train_mask
    if mode == "sum":
        loss = F.cross_entropy(out[mask], graph.y[mask], reduction="sum")
    else:
        loss = F.cross_entropy(out[mask], graph.y[mask])
    if mode == "l2":  # the same on every rank and bypasses the output
        loss = loss + L2 * sum(p.pow(2).sum() for p in model.parameters())
    return out, loss


def _backward(loss, mode: str, engine=None) -> None:
    if mode == "engine":
        engine.backward(loss)
    elif mode == "accumulate":  # two backward calls before one optimizer step
        loss.backward(retain_graph=True)
        (0.5 * loss).backward()
    else:
        loss.backward()


def _train_side_by_side(rank: int, world_size: int, mode: str) -> dict:
    data, engine, local = _setup(rank, world_size,
                                 loss_reduction="sum" if mode == "sum" else "mean")
    ref, model = _pair(data, engine)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=0.01)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    err = {}
    for step in range(STEPS):
        opt_ref.zero_grad()
        out_ref, loss_ref = _loss(ref, data, mode)
        _backward(loss_ref, "plain" if mode == "engine" else mode)
        opt_ref.step()
        opt.zero_grad()
        out, loss = _loss(model, local, mode)
        _backward(loss, mode, engine)
        if step == 0:
            err["logits"] = _rel(engine.gather(out.detach()), out_ref.detach())
            err["grads"] = {n: _rel(p.grad, q.grad) for (n, p), q in
                            zip(model.named_parameters(), ref.parameters())}
        opt.step()
    err["params"] = {n: _rel(p.detach(), q.detach()) for (n, p), q in
                     zip(model.named_parameters(), ref.parameters())}
    err["codec_step"] = engine.exchange.step  # stochastic codecs draw anew per backward
    # Each reduction's collectives outside the exchange, counted for the planner (the presence
    # mask and one bucket): a plain backward's as engine.backward's.
    err["collectives"] = engine.stats.collectives
    engine.detach()
    return err


MODES = ["plain", "engine", "accumulate", "l2", "sum"]


def _all_modes(rank: int, world_size: int) -> dict:
    return {mode: _train_side_by_side(rank, world_size, mode) for mode in MODES}


@pytest.mark.multiprocess
def test_plain_backward_equals_single_process():
    for rank, errors in enumerate(run_distributed(_all_modes, 2)):
        for mode, err in errors.items():
            where = (rank, mode)
            assert err["logits"] < FP32, (where, err["logits"])
            for name, value in err["grads"].items():
                assert value < FP32, (where, "gradient", name, value)
            for name, value in err["params"].items():
                assert value < FP32, (where, f"parameters after {STEPS} Adam steps", name,
                                      value)
            assert err["codec_step"] == STEPS * (2 if mode == "accumulate" else 1), where
            assert err["collectives"] == 2 * STEPS * (2 if mode == "accumulate" else 1), where


def _left_alone(rank: int, world_size: int) -> dict:
    r"""What the hooks leave as it is: each rank weights its own loss by its share, the
    gradients summed over the ranks are then the single-process gradient only if nothing
    was scaled; and a learnable input."""
    data, engine, local = _setup(rank, world_size)
    ref, model = _pair(data, engine)
    w = engine.loss_weight()

    def summed(grads):  # over the ranks
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        return [t.view_as(g) for t, g in zip(flat.split([g.numel() for g in grads]), grads)]

    def versus_ref(grads):
        return max(_rel(g, q.grad) for g, q in zip(grads, ref.parameters()))

    err = {}
    # Eval mode (first: training-mode forwards move the running statistics): a backward is
    # this rank's own, unscaled and unreduced (explainers run there).
    ref.eval(), model.eval()
    _loss(ref, data, "plain")[1].backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (w * _loss(model, local, "plain")[1]).backward()
    err["eval"] = versus_ref(summed([p.grad for p in model.parameters()]))
    # ... with a warning, once, in case the model is trained in eval mode.
    err["eval warned"] = float(sum("model.train()" in str(c.message) for c in caught) != 1)
    ref.zero_grad(), model.zero_grad(set_to_none=True)
    ref.train(), model.train()

    _loss(ref, data, "plain")[1].backward()
    grads = torch.autograd.grad(w * _loss(model, local, "plain")[1], list(model.parameters()))
    err["autograd.grad"] = versus_ref(summed(grads))
    assert all(p.grad is None for p in model.parameters())

    # scale_loss + plain backward + all_reduce_gradients: the caller reduces, as before.
    with torch.no_grad():
        ref(data.x, data.edge_index)  # the same training-mode forwards (running statistics)
    engine.scale_loss(_loss(model, local, "plain")[1]).backward()
    engine.all_reduce_gradients(model.parameters())
    err["scale_loss"] = versus_ref([p.grad for p in model.parameters()])

    # A learnable input outside the model gets what one process gives its rows.
    x_ref = data.x.clone().requires_grad_()
    x = local.x.clone().requires_grad_()
    _loss(ref, data, "plain", x_ref)[1].backward()
    _loss(model, local, "plain", x)[1].backward()
    err["input"] = _rel(x.grad, x_ref.grad[engine.partition.owned_ids])
    engine.detach()
    return err


@pytest.mark.multiprocess
def test_autograd_grad_eval_mode_and_scale_loss_are_left_alone():
    for rank, err in enumerate(run_distributed(_left_alone, 2)):
        for what, value in err.items():
            assert value < FP32, (rank, what, value)


def _bypass(rank: int, world_size: int) -> dict:
    r"""A loss from a submodule called directly (its halo exchange included) is refused on
    every rank, the gradients are left as they were, and the ranks stay in step."""
    data, engine, local = _setup(rank, world_size)
    ref, model = _pair(data, engine)
    _loss(model, local, "plain")[1].backward()
    before = [p.grad.clone() for p in model.parameters()]
    h = model.bn(model.lin_in(local.x)).relu()
    out = model.conv1(h, local.edge_index)
    message = None
    try:
        out[local.train_mask].sum().backward()
    except UnreducedBackwardError as error:
        message = str(error)
    unchanged = all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before))
    model.zero_grad()
    _, loss = _loss(model, local, "plain")
    loss.backward()  # the next pass works
    _loss(ref, data, "plain")[1].backward()
    after = max(_rel(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters()))
    engine.detach()
    return dict(message=message, unchanged=unchanged, after=after)


@pytest.mark.multiprocess
def test_backward_bypassing_the_output_is_refused_on_every_rank():
    for rank, r in enumerate(run_distributed(_bypass, 2, timeout_s=60)):
        assert r["message"] is not None, (rank, "no error")
        assert "engine.backward(loss)" in r["message"] and f"rank {rank}" in r["message"], r
        assert r["unchanged"], rank
        assert r["after"] < FP32, (rank, r["after"])
