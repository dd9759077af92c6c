"""A run resumed from a checkpoint equals the uninterrupted one bit for bit under a stochastic
codec: the static-input memo's kept aggregate does not depend on the step that computes it,
and its decisions (which calls still check, so which draws they use) are checkpoint state."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn.models import GCN, GraphSAGE

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
from lightning_fullgraph.engine.codecs import QuantizedCodec
from lightning_fullgraph.testing import run_distributed

from .models import rank_partition

STEPS = 6


def _train(engine, model, opt, steps, input_dropout):
    data = engine.data
    for step in steps:
        torch.manual_seed(100 + step)  # the same input masks in both runs
        opt.zero_grad()
        x = F.dropout(data.x, 0.5, training=True) if input_dropout else data.x
        out = model(x, data.edge_index)
        engine.backward(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]))
        opt.step()


def _resume(rank, world_size, kind, input_dropout, at):
    data, part = rank_partition(rank, world_size)
    models = {"sage": GraphSAGE, "gcn": GCN}

    def fresh(seed):
        torch.manual_seed(seed)
        model = models[kind](data.num_features, 16, 2, 4)
        engine = FullGraphEngine(part,
                                 exchange=ExchangeConfig(codec=QuantizedCodec(2), step_aside=False))
        engine.attach(model)
        engine.use_kernels("auto")  # GCNConv aggregates the unchanged features first
        return engine, model, torch.optim.Adam(model.parameters(), lr=0.01)

    engine, model, opt = fresh(0)
    _train(engine, model, opt, range(STEPS), input_dropout)
    straight = copy.deepcopy(model.state_dict())
    engine.detach()

    engine, model, opt = fresh(0)
    _train(engine, model, opt, range(at), input_dropout)
    checkpoint = copy.deepcopy(dict(model=model.state_dict(), opt=opt.state_dict(),
                                    static=engine.static.state_dict()))
    engine.detach()

    engine, model, opt = fresh(123)  # another initialization: everything from the checkpoint
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["opt"])
    engine.static.load_state_dict(checkpoint["static"])
    engine.set_step(at)  # the Trainer's global_step, as the strategy sets it
    _train(engine, model, opt, range(at, STEPS), input_dropout)
    resumed = model.state_dict()
    engine.detach()
    return dict(diff=max(float((resumed[k] - v).abs().max()) for k, v in straight.items()),
                moved=max(float((checkpoint["model"][k] - v).abs().max())
                          for k, v in straight.items()),
                hits=engine.static.hits)


@pytest.mark.parametrize("kind, input_dropout, at", [
    ("sage", False, 3),  # the raw features' aggregate: kept, recomputed on resume
    ("gcn", False, 3),   # the same through GCNConv's reordered aggregation
    ("sage", True, 2),   # a new input every step, resumed before the cache stops checking
    ("sage", True, 4),   # and after it stopped
])
def test_resume_with_a_stochastic_codec_equals_the_uninterrupted_run(kind, input_dropout, at):
    for r in run_distributed(_resume, 2, kind, input_dropout, at):
        assert r["diff"] == 0.0 and r["moved"] > 0, r
        assert (r["hits"] > 0) != input_dropout, r  # the kept aggregate was reused
