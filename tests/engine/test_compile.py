"""A ``torch.compile``d model exchanges halo rows exactly as an eager one.

PyG's generated ``propagate`` skips its pre-hooks while compiling; without the engine's
eager wrappers the halo never reaches the layer (a silent wrong answer, or an error far
from the cause).  Compared here against single-process eager PyG: logits and gradients.
"""
import copy

import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.engine import FullGraphEngine
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .models import Net, skewed_graph

KINDS = ("gcn", "sage_mean", "gat", "appnp")


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _compiled_equals_eager(rank, world_size, kernels, backend):
    import torch._dynamo
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    engine = FullGraphEngine(build_local_partitions(data, parts)[rank])
    local = engine.data
    errors = {}
    for kind in KINDS:
        torch._dynamo.reset()
        torch.manual_seed(1)
        ref = Net(kind, data.num_features, 4)
        model = copy.deepcopy(ref)
        engine.attach(model)
        engine.use_kernels(kernels)
        compiled = torch.compile(model, backend=backend)
        out_ref = ref(data.x, data.edge_index)
        F.cross_entropy(out_ref[data.train_mask], data.y[data.train_mask]).backward()
        out = compiled(local.x, local.edge_index)
        engine.backward(F.cross_entropy(out[local.train_mask], local.y[local.train_mask]))
        grads = {name: _rel(p.grad, q.grad) for (name, p), q in
                 zip(model.named_parameters(), ref.parameters())}
        errors[kind] = dict(logits=_rel(engine.gather(out), out_ref.detach()), grads=grads,
                            exchanged=engine.stats.total("forward").calls)
        engine.detach()
        engine.stats.reset()
    return errors


@pytest.mark.multiprocess
@pytest.mark.parametrize("kernels,backend", [(None, "aot_eager"), ("auto", "aot_eager")])
def test_compiled_model_is_exact(kernels, backend):
    for rank, errors in enumerate(run_distributed(_compiled_equals_eager, 2, kernels, backend)):
        for kind, err in errors.items():
            assert err["exchanged"] > 0, (rank, kind, err)  # the halo did cross the wire
            assert err["logits"] < 1e-5, (rank, kind, err)
            for name, value in err["grads"].items():
                assert value < 1e-5, (rank, kind, name, err)
