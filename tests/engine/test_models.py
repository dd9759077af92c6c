"""PyG's prebuilt models (``torch_geometric.nn.models``) under partitioned execution.

``GCN``, ``GraphSAGE``, ``GIN``, ``GAT``, ``PNA`` and ``EdgeCNN`` with jumping knowledge
(``"cat"``, ``"max"``, ``"lstm"``), their ``norm`` options (batch, layer, graph and instance
norm, synchronized across ranks; a ``BatchNorm1d`` instance as in PyG's GraphSAGE example) and
``MLP`` heads: logits and gradients equal single-process PyG at P = 2 and 3, and 20 Adam epochs
of ``GraphSAGE(jk="cat")`` follow the same trajectory.  Every model with a normalization
trains a few steps too, after which its parameters, buffers (running statistics) and eval-mode
logits are compared (:func:`_norm_trajectories`).
"""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import models as M

from lightning_fullgraph.engine import FullGraphEngine
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .catalogue import EDGE_DIM, catalogue_graph, degree_histogram

FP32, FP64 = 1e-5, 1e-10
IN, HIDDEN, OUT = 8, 16, 4


class Head(nn.Module):
    r"""A prebuilt GNN body followed by an ``MLP`` head (with BatchNorm, synchronized)."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.head = M.MLP([HIDDEN, HIDDEN, OUT], norm="batch_norm")

    def forward(self, x, edge_index, edge_weight=None, edge_attr=None):
        return self.head(self.body(x, edge_index, edge_weight=edge_weight,
                                   edge_attr=edge_attr).relu())


def _models(deg: torch.Tensor) -> dict:
    r"""Name -> (builder, uses edge weights, uses edge attributes)."""
    def body(cls, **kwargs):
        return lambda: cls(IN, HIDDEN, num_layers=3, out_channels=OUT, **kwargs)

    def headed(cls, **kwargs):
        return lambda: Head(cls(IN, HIDDEN, num_layers=2, **kwargs))

    return {
        "GCN(jk=cat, batch_norm)": (body(M.GCN, jk="cat", norm="batch_norm"), True, False),
        "GCN(jk=max, layer_norm) + MLP": (headed(M.GCN, jk="max", norm="layer_norm"), True,
                                          False),
        "GraphSAGE(jk=cat)": (body(M.GraphSAGE, jk="cat"), False, False),
        # PyG's examples/pytorch_lightning/graph_sage.py: a module instance, copied per layer.
        "GraphSAGE(norm=BatchNorm1d)": (body(M.GraphSAGE, norm=nn.BatchNorm1d(HIDDEN)), False,
                                        False),
        "GraphSAGE(jk=lstm, graph_norm)": (body(M.GraphSAGE, jk="lstm", norm="graph_norm"),
                                           False, False),
        "GIN(jk=max, batch_norm)": (body(M.GIN, jk="max", norm="batch_norm"), False, False),
        "GAT(v2, edge_dim, heads=2, jk=cat)": (body(M.GAT, v2=True, heads=2, edge_dim=EDGE_DIM,
                                                    jk="cat"), False, True),
        "GAT(edge_dim, heads=2) + MLP": (headed(M.GAT, heads=2, edge_dim=EDGE_DIM), False,
                                         True),
        "GAT(edge_dim, heads=2)": (body(M.GAT, heads=2, edge_dim=EDGE_DIM), False, True),
        "PNA(edge_dim, jk=lstm)": (body(M.PNA, aggregators=["mean", "min", "max", "std"],
                                        scalers=["identity", "amplification", "attenuation"],
                                        deg=deg, edge_dim=EDGE_DIM, towers=2, jk="lstm"),
                                   False, True),
        "EdgeCNN(jk=cat, instance_norm)": (body(M.EdgeCNN, jk="cat", norm="instance_norm"),
                                           False, False),
    }


# (A bias followed by a Linear and BatchNorm, as in the MLP head, has a nearly zero gradient
# that Adam turns into rounding-size steps: trajectories are compared without the head.)
TRAJECTORIES = ("GraphSAGE(jk=cat)", "GAT(edge_dim, heads=2)")


def _rel(a, b, floor: float = 1e-12) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(floor))


def _has_norm(model: nn.Module) -> bool:
    norms = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.InstanceNorm1d,
             nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LayerNorm, nn.GroupNorm)
    return any(isinstance(m, norms) or type(m).__module__.startswith("torch_geometric.nn.norm")
               for m in model.modules())


# Training steps of every model with a normalization, two ways.  A bias right before a
# mean-subtracting norm has a mathematically zero gradient, i.e. rounding noise whose sign
# depends on the summation order (one process with its nodes permuted differs as much):
# momentum SGD keeps it at that size, so fp32 stays within 1e-5; Adam divides it by its own
# magnitude and moves that bias by whole learning rates, and the running mean, which tracks
# the bias, with it (issue 37: "running_mean 15 % off" in fp32) -- exact arithmetic has no
# such step, and in float64 the noise is 1e-16, so Adam's steps stay near 1e-9 (measured at
# P = 2 and 3: buffers 4.7e-9, eval logits 3.1e-9, parameters 3.2e-9 of the model's largest --
# a small bias before the MLP head's BatchNorm moves 1.4e-8 of its own size, so Adam's
# parameters are compared against the largest; momentum SGD in fp32: parameters 2.0e-6,
# buffers 6.9e-7, eval logits 8.6e-7).  (dtype, optimizer, bound, parameters against the
# largest)
NORM_STEPS = 5
NORM_RUNS = {
    "sgd32": (torch.float32, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), FP32, False),
    "adam64": (torch.float64, lambda p: torch.optim.Adam(p, lr=0.01), 3e-8, True),
}


def _norm_trajectories(build, data, local, engine, weighted, attributed) -> dict:
    r"""Per run: the relative error of each parameter (those that stayed below 1e-4 of the
    largest, or all in Adam's run, against the largest, as in :func:`_grad_errors`), of every
    buffer (integer ones must be equal) and of the eval-mode logits, after
    :data:`NORM_STEPS`."""
    errors = {}
    for run, (dtype, optimizer, _, against_largest) in NORM_RUNS.items():
        torch.manual_seed(1)
        ref = build().to(dtype)
        model = copy.deepcopy(ref)
        engine.attach(model)
        opt_ref, opt = optimizer(ref.parameters()), optimizer(model.parameters())
        for _ in range(NORM_STEPS):
            opt_ref.zero_grad()
            _loss(ref, data, weighted, attributed, dtype).backward()
            opt_ref.step()
            opt.zero_grad()
            engine.backward(_loss(model, local, weighted, attributed, dtype))
            opt.step()
        largest = max(float(q.detach().abs().max()) for q in ref.parameters())
        err = {}
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            small = against_largest or float(q.detach().abs().max()) < 1e-4 * largest
            err[f"param {n}"] = _rel(p.detach(), q.detach(), largest if small else 1e-12)
        for (n, b), c in zip(model.named_buffers(), ref.buffers()):
            err[f"buffer {n}"] = _rel(b, c) if b.is_floating_point() else \
                float(not torch.equal(b, c))
        model.eval(), ref.eval()
        with torch.no_grad():
            err["eval logits"] = _rel(
                engine.gather(_call(model, local, weighted, attributed, dtype)),
                _call(ref, data, weighted, attributed, dtype))
        engine.detach()
        errors[run] = err
    return errors


def _grad_errors(model, ref) -> dict:
    r"""Per-tensor relative gradient errors.  A bias right before a mean-subtracting norm
    (conv bias → BatchNorm/GraphNorm/...) has a mathematically zero gradient: its reference
    gradient is rounding noise (measured below 1e-6 of the model's largest; tensors below
    1e-4 count as such), compared against the largest gradient instead of their own."""
    largest = max(float(q.grad.abs().max()) for q in ref.parameters())
    errors = {}
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        zero = float(q.grad.abs().max()) < 1e-4 * largest
        errors[n] = _rel(p.grad, q.grad, largest if zero else 1e-12)
    return errors


def _call(model, data, weighted, attributed, dtype):
    return model(data.x.to(dtype), data.edge_index,
                 edge_weight=data.edge_weight.to(dtype) if weighted else None,
                 edge_attr=data.edge_attr.to(dtype) if attributed else None)


def _loss(model, data, weighted, attributed, dtype):
    out = _call(model, data, weighted, attributed, dtype)
    return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])


def _compare_models(rank: int, world_size: int) -> dict:
    torch.manual_seed(0)
    data = catalogue_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    engine = FullGraphEngine(build_local_partitions(data, parts)[rank])
    local = engine.data
    results = {}
    for name, (build, weighted, attributed) in _models(degree_histogram(data)).items():
        torch.manual_seed(1)
        ref = build()
        model = copy.deepcopy(ref)
        engine.attach(model)
        out_ref = _call(ref, data, weighted, attributed, torch.float32)
        F.cross_entropy(out_ref[data.train_mask], data.y[data.train_mask]).backward()
        out = _call(model, local, weighted, attributed, torch.float32)
        engine.backward(F.cross_entropy(out[local.train_mask], local.y[local.train_mask]))
        err = dict(logits=_rel(engine.gather(out), out_ref.detach()),
                   grads=_grad_errors(model, ref))
        engine.detach()
        if _has_norm(ref):
            err["norm"] = _norm_trajectories(build, data, local, engine, weighted, attributed)
        if name in TRAJECTORIES:
            torch.manual_seed(1)
            ref = build().double()
            model = copy.deepcopy(ref)
            engine.attach(model)
            opt_ref = torch.optim.Adam(ref.parameters(), lr=0.01)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            for _ in range(20):
                opt_ref.zero_grad()
                _loss(ref, data, weighted, attributed, torch.float64).backward()
                opt_ref.step()
                opt.zero_grad()
                engine.backward(_loss(model, local, weighted, attributed, torch.float64))
                opt.step()
            err["params64"] = {n: _rel(p.detach(), q.detach()) for (n, p), q in
                               zip(model.named_parameters(), ref.parameters())}
            model.eval(), ref.eval()
            with torch.no_grad():
                err["eval64"] = _rel(
                    engine.gather(_call(model, local, weighted, attributed, torch.float64)),
                    _call(ref, data, weighted, attributed, torch.float64))
            engine.detach()
        results[name] = err
    return results


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_prebuilt_models_equal_single_process(world_size):
    results = run_distributed(_compare_models, world_size, timeout_s=600)
    for rank, errors in enumerate(results):
        assert set(TRAJECTORIES) <= set(errors)
        for name, err in errors.items():
            assert err["logits"] < FP32, (rank, name, err["logits"])
            for param, value in err["grads"].items():
                assert value < FP32, (rank, name, param, value)
            for param, value in err.get("params64", {}).items():
                assert value < FP64, (rank, name, "float64 trajectory", param, value)
            if "eval64" in err:
                assert err["eval64"] < FP64, (rank, name, err["eval64"])
            for run, values in err.get("norm", {}).items():
                for what, value in values.items():
                    assert value < NORM_RUNS[run][2], (rank, name, run, what, value)
        assert {name for name, err in errors.items() if "norm" in err} == NORMED, rank


# The models with a normalization (each trains NORM_STEPS steps; _has_norm finds them).
NORMED = {"GCN(jk=cat, batch_norm)", "GCN(jk=max, layer_norm) + MLP",
          "GraphSAGE(norm=BatchNorm1d)", "GraphSAGE(jk=lstm, graph_norm)",
          "GIN(jk=max, batch_norm)", "GAT(edge_dim, heads=2) + MLP",
          "EdgeCNN(jk=cat, instance_norm)"}


class PostProcessing(nn.Module):
    r"""Label propagation and Correct & Smooth (both scalings) on fixed soft predictions."""

    def __init__(self) -> None:
        super().__init__()
        self.lp = M.LabelPropagation(num_layers=3, alpha=0.9)
        self.cs = M.CorrectAndSmooth(2, 0.8, 2, 0.7, autoscale=True)
        self.cs_fixed = M.CorrectAndSmooth(2, 0.8, 2, 0.7, autoscale=False, scale=0.5)

    def forward(self, y_soft, y, mask, edge_index, edge_weight=None):
        out = [self.lp(y, edge_index, mask=mask, edge_weight=edge_weight)]
        for cs in (self.cs, self.cs_fixed):
            corrected = cs.correct(y_soft, y[mask], mask, edge_index, edge_weight)
            out.append(cs.smooth(corrected, y[mask], mask, edge_index, edge_weight))
        return out


def _post_process(rank: int, world_size: int, weighted: bool) -> dict:
    data = catalogue_graph()
    data.soft = torch.softmax(data.x @ torch.randn(IN, OUT + 1, generator=torch.Generator()
                                                   .manual_seed(3)), dim=-1).double()
    # Labels whose largest class is missing on some ranks: the one-hot width is global.
    data.y = torch.where(torch.arange(data.num_nodes) == 0, OUT, data.y)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    engine = FullGraphEngine(build_local_partitions(data, parts)[rank])
    local = engine.data
    ref, model = PostProcessing(), PostProcessing()
    engine.attach(model)
    w_ref = data.edge_weight.double() if weighted else None
    w = local.edge_weight.double() if weighted else None
    expected = ref(data.soft, data.y, data.train_mask, data.edge_index, w_ref)
    got = model(local.soft, local.y, local.train_mask, local.edge_index, w)
    return [_rel(engine.gather(g), e) for g, e in zip(got, expected)]


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size,weighted", [(2, False), (3, True)])
def test_label_propagation_and_correct_and_smooth_equal_single_process(world_size, weighted):
    for rank, errors in enumerate(run_distributed(_post_process, world_size, weighted)):
        assert len(errors) == 3
        assert max(errors) < FP64, (rank, errors)
