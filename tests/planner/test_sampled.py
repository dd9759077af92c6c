"""Boundary sampling in the planner: a sampled transfer is recorded as a call of its channel
whose rows are the plan's times the rate, and those expected rows match what the run sends on
average (the draws vary from step to step)."""
import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
from lightning_fullgraph.planner import RankCounts
from lightning_fullgraph.planner.model import CommunicationModel
from lightning_fullgraph.planner.profile import ExchangeRecorder
from lightning_fullgraph.testing import run_distributed

from .conftest import build, partitions

RATE, STEPS = 0.5, 24


def _sampled_rows(rank, world_size, mode):
    data, parts = partitions(world_size)
    engine = FullGraphEngine(parts[rank], exchange=ExchangeConfig(
        aggregation=mode, sampling=RATE, step_aside=False))
    model = build("sage", data.num_features)
    engine.attach(model)
    local = engine.data
    counts = RankCounts.from_engine(engine)
    measured, predicted, fractions = [], [], set()
    with ExchangeRecorder(engine.exchanges) as recorder:
        for step in range(STEPS):
            engine.set_step(step)  # a new sample every step
            engine.stats.reset()
            recorder.begin()
            # The raw input's aggregation is kept after step 0 (exact, once): the steady
            # steps exchange the hidden layer's rows, sampled.
            out = model(local.x, local.edge_index)
            engine.backward(F.cross_entropy(out[local.train_mask], local.y[local.train_mask]))
            calls = recorder.end()
            if step == 0:
                continue
            fractions |= {c.fraction for c in calls}
            measured.append(sum(c.rows_sent for c in engine.stats.counters.values()))
            predicted.append(sum(sum(CommunicationModel.call_rows(c, counts)[0])
                                 for c in calls))
    engine.detach()
    return measured, predicted, sorted(fractions)


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["post", "hybrid"])
def test_sampled_calls_predict_the_expected_rows(mode):
    for rank, (measured, predicted, fractions) in enumerate(
            run_distributed(_sampled_rows, 2, mode)):
        assert fractions == [RATE], (rank, fractions)  # every training call is sampled
        assert len(set(predicted)) == 1  # the expectation, the same every step
        mean = sum(measured) / len(measured)
        assert len(set(measured)) > 1, (rank, measured)  # the draws do vary
        assert abs(mean - predicted[0]) <= 0.15 * predicted[0], (rank, mean, predicted[0])
