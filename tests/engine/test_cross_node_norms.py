"""PyG's cross-node normalizations under partitioned execution equal single-process PyG.

Per tensor, relative to the tensor's own magnitude: fp32 within 1e-5, float64 within 1e-10.
Spawning dominates the run time, so one spawn of three ranks runs every norm at P=3 on the
world and at P=2 on a subgroup of ranks 0 and 1 (which also checks that the norms reduce
over the engine's group, not the world).
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import (DiffGroupNorm, GCNConv, GraphNorm, GraphSizeNorm, InstanceNorm,
                                LayerNorm, MeanSubtractionNorm, PairNorm)

from lightning_fullgraph.engine import FullGraphEngine, UnsupportedLayerError, check_model
from lightning_fullgraph.engine.graphnorm import (DistributedGraphNorm, MultipleGraphsError,
                                                  convert_cross_node_norms,
                                                  revert_cross_node_norms)
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .models import HIDDEN, skewed_graph
from lightning_fullgraph.engine import ExchangeConfig

FP32, FP64 = 1e-5, 1e-10
EPOCHS = 20

NORMS = {
    "graph": lambda: GraphNorm(HIDDEN),
    "pair": lambda: PairNorm(scale=1.5),
    "pair_individual": lambda: PairNorm(scale_individually=True),
    "layer_graph": lambda: LayerNorm(HIDDEN, mode="graph"),
    "layer_graph_plain": lambda: LayerNorm(HIDDEN, affine=False, mode="graph"),
    "instance": lambda: InstanceNorm(HIDDEN),
    "instance_affine": lambda: InstanceNorm(HIDDEN, affine=True),
    "instance_tracked": lambda: InstanceNorm(HIDDEN, affine=True, track_running_stats=True),
    "mean_subtraction": MeanSubtractionNorm,
    "diff_group": lambda: DiffGroupNorm(HIDDEN, groups=3, lamda=0.5),
    "graph_size": GraphSizeNorm,
}
# Norms taking a batch vector: an all-zero one (one graph) selects PyG's batched formula.
BATCHED = ["graph", "pair", "pair_individual", "layer_graph", "instance_tracked",
           "mean_subtraction", "graph_size"]


class NormNet(nn.Module):
    r"""Linear → norm → GCNConv → norm → GCNConv → Linear.

    No bias right before a norm: most of them subtract a per-channel mean, which makes
    such a bias's gradient mathematically zero, i.e. rounding noise with no relative scale.
    """

    def __init__(self, norm: str, in_channels: int, out_channels: int):
        super().__init__()
        self.lin_in = nn.Linear(in_channels, HIDDEN, bias=False)
        self.norm1 = NORMS[norm]()
        self.conv1 = GCNConv(HIDDEN, HIDDEN, bias=False)
        self.norm2 = NORMS[norm]()
        self.conv2 = GCNConv(HIDDEN, HIDDEN)
        self.lin_out = nn.Linear(HIDDEN, out_channels)
        with torch.no_grad():  # away from the identity init, e.g. GraphNorm's mean_scale = 1
            for module in (self.norm1, self.norm2):
                for p in module.parameters():
                    p.add_(0.3 * torch.randn_like(p))

    def forward(self, x, edge_index):
        x = self.norm1(self.lin_in(x)).relu()
        x = self.norm2(self.conv1(x, edge_index)).relu()
        return self.lin_out(self.conv2(x, edge_index))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max() / b.detach().abs().max().clamp_min(1e-12))


def _pair(norm, data, engine, dtype=torch.float32):
    torch.manual_seed(1)
    ref = NormNet(norm, data.num_features, 4).to(dtype)
    model = copy.deepcopy(ref)
    engine.attach(model)
    return ref, model


def _step(model, data, dtype):
    out = model(data.x.to(dtype), data.edge_index)
    return out, F.cross_entropy(out[data.train_mask], data.y[data.train_mask])


def _compare_norms(rank: int, world_size: int, aggregation: str, group=None):
    torch.manual_seed(0)
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    engine = FullGraphEngine(build_local_partitions(data, parts)[rank], group,
                             exchange=ExchangeConfig(aggregation=aggregation))
    local = engine.data
    errors = {}
    for norm in NORMS:
        ref, model = _pair(norm, data, engine)
        out_ref, loss_ref = _step(ref, data, torch.float32)
        loss_ref.backward()
        out, loss = _step(model, local, torch.float32)
        engine.backward(loss)
        err = dict(logits=_rel(engine.gather(out), out_ref.detach()),
                   grads={n: _rel(p.grad, q.grad) for (n, p), q in
                          zip(model.named_parameters(), ref.parameters())},
                   buffers={n: _rel(b.float(), c.float()) for (n, b), c in
                            zip(model.named_buffers(), ref.buffers())})
        model.eval(), ref.eval()  # running statistics where the norm keeps them
        with torch.no_grad():
            err["eval"] = _rel(engine.gather(model(local.x, local.edge_index)),
                               ref(data.x, data.edge_index))
        engine.detach()
        errors[norm] = err

    # 20 Adam epochs of GraphNorm in float64 from the same start.
    ref, model = _pair("graph", data, engine, torch.float64)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=0.01)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(EPOCHS):
        opt_ref.zero_grad()
        _step(ref, data, torch.float64)[1].backward()
        opt_ref.step()
        opt.zero_grad()
        engine.backward(_step(model, local, torch.float64)[1])
        opt.step()
    errors["trajectory64"] = {n: _rel(p.detach(), q.detach()) for (n, p), q in
                              zip(model.named_parameters(), ref.parameters())}
    engine.detach()
    errors.update(_batch_vectors(rank, local.n_id, group))
    return errors


def _both_world_sizes(rank: int, world_size: int) -> dict:
    pair = dist.new_group([0, 1])  # every rank takes part in creating it
    results = {3: _compare_norms(rank, world_size, "hybrid")}
    if rank < 2:
        results[2] = _compare_norms(rank, 2, "post", pair)
    return results


def _batch_vectors(rank: int, n_id: torch.Tensor, group) -> dict:
    r"""Direct calls with ``batch``: all zeros equals PyG (float64, output and input
    gradient); several graphs fail on every rank, naming the module."""
    torch.manual_seed(2)
    ref = nn.ModuleDict({name: NORMS[name]() for name in BATCHED}).double().train()
    model = copy.deepcopy(ref)
    convert_cross_node_norms(model, group)
    x = torch.randn(120, HIDDEN, dtype=torch.float64)
    weight = torch.randn_like(x)  # a loss that weights every output entry differently
    zeros = torch.zeros(120, dtype=torch.long)
    errors = {}
    for name in BATCHED:
        x_ref, x_local = x.clone().requires_grad_(), x[n_id].clone().requires_grad_()
        out_ref = ref[name](x_ref, zeros)
        (out_ref * weight).sum().backward()
        out = model[name](x_local, zeros[n_id])
        (out * weight[n_id]).sum().backward()
        errors[f"batch_zeros/{name}"] = max(_rel(out.detach(), out_ref.detach()[n_id]),
                                            _rel(x_local.grad, x_ref.grad[n_id]))
    several = zeros[n_id].clone()
    if rank == 0:
        several[-1] = 1  # only rank 0 sees a second graph: every rank must still raise
    messages = []
    for batch, size in ((several, None), (zeros[n_id], 2)):
        try:
            model["graph"](x[n_id], batch, size)
            messages.append(None)
        except MultipleGraphsError as e:
            messages.append(str(e))
    dist.barrier(group)  # the ranks are still in step after the refusals
    errors["refusals"] = messages
    return errors


@pytest.mark.multiprocess
def test_cross_node_norms_equal_single_process():
    results = run_distributed(_both_world_sizes, 3)
    runs = [((3, rank), r[3]) for rank, r in enumerate(results)] + \
        [((2, rank), r[2]) for rank, r in enumerate(results[:2])]
    for rank, errors in runs:  # rank: (world size, rank)
        for norm in NORMS:
            err, where = errors[norm], (rank, norm)
            assert err["logits"] < FP32, (where, err)
            assert err["eval"] < FP32, (where, err)
            for name, value in {**err["grads"], **err["buffers"]}.items():
                assert value < FP32, (where, name, value)
        for name, value in errors["trajectory64"].items():
            assert value < FP64, (rank, "GraphNorm float64 trajectory", name, value)
        for name in BATCHED:
            assert errors[f"batch_zeros/{name}"] < FP64, (rank, name, errors)
        several, size = errors["refusals"]
        assert several and "'graph' (GraphNorm) received a batch vector" in several
        assert size and "batch_size=2" in size


def test_one_process_is_plain_pyg_and_keeps_the_state_dict():
    torch.manual_seed(0)
    data = skewed_graph()
    for norm in NORMS:
        ref = NormNet(norm, data.num_features, 4)
        model = copy.deepcopy(ref)
        keys, params = list(model.state_dict()), list(model.parameters())
        swaps = convert_cross_node_norms(model)
        assert len(swaps) == 2, norm  # both norms (DiffGroupNorm: its BatchNorm1d)
        assert list(model.state_dict()) == keys
        assert all(p is q for p, q in zip(model.parameters(), params))
        # No process group: PyG's own forward, bit for bit (training mode, statistics updated);
        # DiffGroupNorm runs DistributedBatchNorm's formula, equal up to rounding.
        out, out_ref = model(data.x, data.edge_index), ref(data.x, data.edge_index)
        assert torch.equal(out, out_ref) if norm != "diff_group" else _rel(out, out_ref) < FP32
        for b, c in zip(model.buffers(), ref.buffers()):
            assert torch.allclose(b.double(), c.double(), rtol=1e-6), norm
        model.eval()
        revert_cross_node_norms(swaps)
        assert [type(m) for m in model.modules()] == [type(m) for m in ref.modules()]
        assert not model.norm1.training  # the mode set while swapped survives the revert
        assert list(model.state_dict()) == keys
    model = NormNet("graph", 8, 4)
    convert_cross_node_norms(model)
    assert isinstance(model.norm1, DistributedGraphNorm)
    check_model(model)  # an attached (converted) model is accepted as well


def test_subclassed_cross_node_norm_is_refused():
    class MyNorm(GraphNorm):
        def forward(self, x, batch=None, batch_size=None):
            return x

    with pytest.raises(UnsupportedLayerError, match=r"'1' \(MyNorm\) subclasses GraphNorm"):
        check_model(nn.Sequential(GCNConv(8, 8), MyNorm(8)))
