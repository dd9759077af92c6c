"""``ExchangeConfig(duplex=True)``: every exchange's two directions at once on two gloo groups.
The same bytes land in the same places as in one all-to-all, so training is bit for bit what
it is without it, in every exchange path (post rows with overlap, hybrid's rows and partials
in one buffer, a lossy codec's byte wire, the pipeline's background transfers)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .models import Net, skewed_graph

CONFIGS = {
    "post": dict(aggregation="post"),
    "hybrid": dict(aggregation="hybrid"),
    "int2-hybrid": dict(aggregation="hybrid", codec="int2"),
    "pipeline": dict(aggregation="post", pipeline="async"),
}


def _train(part, num_features, kind, config, duplex, steps=3):
    engine = FullGraphEngine(part, exchange=ExchangeConfig(step_aside=False, duplex=duplex,
                                                           **config))
    torch.manual_seed(1)
    model = Net(kind, num_features, 4)
    engine.attach(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    local = engine.data
    outs = []
    for _ in range(steps):
        opt.zero_grad()
        out = model(local.x, local.edge_index)
        engine.backward(F.cross_entropy(out[local.train_mask], local.y[local.train_mask]))
        opt.step()
        outs.append(out.detach().clone())
    grads = [p.grad.clone() for p in model.parameters()]
    params = [p.detach().clone() for p in model.parameters()]
    split = engine.transport.duplex_group is not None
    engine.detach()
    engine.transport.close()
    return outs, grads, params, split


def _compare(rank, world_size):
    torch.manual_seed(0)
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    result = {}
    for name, config in CONFIGS.items():
        for kind in ("sage_mean", "gcn"):
            plain = _train(part, data.num_features, kind, config, duplex=False)
            both = _train(part, data.num_features, kind, config, duplex=True)
            result[(name, kind)] = dict(
                split=(plain[3], both[3]),
                equal=[all(torch.equal(a, b) for a, b in zip(x, y))
                       for x, y in zip(plain[:3], both[:3])])
    return result


@pytest.mark.multiprocess
def test_duplex_training_is_bit_for_bit_the_same():
    results = run_distributed(_compare, 3, timeout_s=240)
    for rank, result in enumerate(results):
        assert set(result) == {(n, k) for n in CONFIGS for k in ("sage_mean", "gcn")}
        for where, r in result.items():
            assert r["split"] == (False, True), (rank, where)
            assert r["equal"] == [True, True, True], (rank, where, "outputs, grads, params")


def test_duplex_is_a_bool_and_is_described():
    assert ExchangeConfig().duplex is False
    assert ExchangeConfig(duplex=True).describe().endswith("duplex")
    with pytest.raises(TypeError, match="duplex"):
        ExchangeConfig(duplex="yes")


def _aside(rank, world_size, duplex_cost):
    r"""Exact post with duplex, step aside on; the step clock charges :obj:`duplex_cost`
    for a step that splits its exchanges, 1 for one that does not."""
    import torch.distributed as dist

    from lightning_fullgraph.engine import step_aside as step_aside_module
    from lightning_fullgraph.engine.step_aside import StepAside

    from .models import rank_partition
    from .test_step_aside import FakeClock
    data, part = rank_partition(rank, world_size)
    calls = [0]
    real = dist.all_to_all_single

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    runs = {}
    for name, config in [("aside", ExchangeConfig(aggregation="post", duplex=True,
                                                  step_aside=StepAside(warmup=1, steps=2))),
                         ("one", ExchangeConfig(aggregation="post", step_aside=False))]:
        engine = FullGraphEngine(part, exchange=config)
        torch.manual_seed(1)
        model = Net("sage_mean", data.num_features, 4)
        engine.attach(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        local = engine.data
        seen, collectives, outs = [], [], []
        clock = FakeClock(lambda: engine.transport.duplex,
                          lambda split: duplex_cost if split else 1.0)
        saved, step_aside_module._clock = step_aside_module._clock, clock
        dist.all_to_all_single = counted
        try:
            for _ in range(1 + 1 + 2 * 2 + 2):
                seen.append(engine.transport.duplex)
                before = calls[0]
                opt.zero_grad()
                out = model(local.x, local.edge_index)
                F.cross_entropy(out[local.train_mask], local.y[local.train_mask]).backward()
                opt.step()
                collectives.append(calls[0] - before)
                outs.append(out.detach().clone())
        finally:
            step_aside_module._clock = saved
            dist.all_to_all_single = real
        runs[name] = dict(seen=seen, collectives=collectives, outs=outs,
                          arms=engine.step_aside.arms if engine.step_aside else None,
                          decision=engine.step_aside.decision if engine.step_aside else None,
                          state=engine.step_aside_state())
        engine.detach()
        engine.transport.close()
    # A resumed run takes the decision; one checkpointed before duplex was an arm keeps it.
    restored = FullGraphEngine(part, exchange=ExchangeConfig(aggregation="post", duplex=True))
    restored.load_step_aside_state(runs["aside"]["state"])
    older = FullGraphEngine(part, exchange=ExchangeConfig(aggregation="hybrid", duplex=True))
    older.load_step_aside_state({"decision": {"stages": [], "arms": [["hybrid"], []],
                                              "seconds": [1.0, 0.9], "step": 6}})
    runs["restored"] = (restored.transport.duplex, older.transport.duplex,
                        older.router.post_held)
    for engine in (restored, older):
        engine.transport.close()
    a, b = runs["aside"], runs["one"]
    runs["equal"] = [torch.equal(x, y) for x, y in zip(a["outs"], b["outs"])]
    for run in (a, b):
        del run["outs"], run["state"]
    return runs


@pytest.mark.multiprocess
@pytest.mark.parametrize("duplex_cost,kept", [(2.0, False), (0.5, True)])
def test_duplex_steps_aside_where_it_does_not_shorten_the_step(duplex_cost, kept):
    results = run_distributed(_aside, 2, duplex_cost, timeout_s=120)
    for runs in results:
        aside, one = runs["aside"], runs["one"]
        assert aside["arms"] == [("duplex", ), ()] and one["arms"] is None
        # Step 0 and the warm-up split, then each arm for 2 steps, then the decision.
        assert aside["seen"] == [True] * 4 + [False] * 2 + [kept] * 2
        assert aside["decision"]["stages"] == (["duplex"] if kept else [])
        assert aside["decision"]["seconds"] == pytest.approx([duplex_cost, 1.0])
        # A split step issues two all-to-alls per exchange, one that is not as many as a
        # run without duplex: the choice is what crosses the wire, not a label.
        per_step = one["collectives"][0]
        assert per_step > 0 and set(one["collectives"]) == {per_step}
        assert aside["collectives"] == [2 * per_step if split else per_step
                                        for split in aside["seen"]]
        assert runs["equal"] == [True] * 8  # exact, split or not: bit for bit
        assert runs["restored"] == (kept, True, True)
