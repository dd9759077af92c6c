"""StepAside: a stage that does not shorten the step is left out, by every rank alike.

The step clock is replaced by one that charges each step by the stages running in it, so the
decisions are those of known timings; a real run times real steps (python -m benchmarks cluster).
"""
import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.engine import ExchangeConfig, ExchangePolicy, FullGraphEngine
from lightning_fullgraph.engine import step_aside as step_aside_module
from lightning_fullgraph.engine.step_aside import StepAside, policy_with
from lightning_fullgraph.testing import run_distributed

from .models import rank_partition


class FakeClock:
    r"""Advances by ``cost(stages)`` at every reading; ``stages`` is read from a callable."""

    def __init__(self, running, cost):
        self.now, self.running, self.cost = 0.0, running, cost

    def __call__(self):
        self.now += self.cost(self.running())
        return self.now


def _drive(aside, cost, ticks=40):
    running = [tuple(aside.arms[0])]
    clock = FakeClock(lambda: running[0], cost)
    saved, step_aside_module._clock = step_aside_module._clock, clock
    try:
        for _ in range(ticks):
            stages = aside.tick()
            if stages is not None:
                running[0] = stages
    finally:
        step_aside_module._clock = saved
    return running[0]


def test_arms_every_subset_for_two_stages_and_leave_one_out_for_more():
    aside = StepAside()
    assert aside.bind(("cache", "codec"))
    assert aside.arms == [("cache", "codec"), ("cache", ), ("codec", ), ()]
    aside.bind(("sampling", "cache", "codec"))
    assert aside.arms == [("sampling", "cache", "codec"), ("cache", "codec"),
                          ("sampling", "codec"), ("sampling", "cache"), ()]
    assert not StepAside().bind(())


@pytest.mark.parametrize("codec_cost,expected", [
    (0.5, ("codec", )),   # the codec halves the step: kept
    (2.0, ()),            # it doubles it: left out
    (0.99, ()),           # it saves 1 %, less than the margin (3 %): not worth its error
])
def test_the_fastest_arm_is_kept(codec_cost, expected):
    aside = StepAside(warmup=2, steps=3)
    aside.bind(("codec", ))
    chosen = _drive(aside, lambda stages: codec_cost if "codec" in stages else 1.0)
    assert chosen == expected
    assert aside.done and aside.decision["stages"] == list(expected)
    assert aside.decision["seconds"] == pytest.approx(
        [codec_cost, 1.0] if codec_cost != 0.99 else [0.99, 1.0])
    # The first step that runs the decision (0-based; the first step is not ticked): the
    # trial's steps come before it.
    assert aside.decision["step"] == aside.trial_steps == 1 + 2 + 2 * 3


def test_each_stage_is_judged_by_what_it_saves():
    # The cache costs more than it saves; the codec pays: the codec alone is kept.
    aside = StepAside(warmup=0, steps=2)
    aside.bind(("cache", "codec"))
    chosen = _drive(aside, lambda s: 1.0 + 0.3 * ("cache" in s) - 0.4 * ("codec" in s))
    assert chosen == ("codec", )


def test_the_first_step_of_each_arm_is_not_timed():
    # A switch's transition (10 s in the first step of each arm) must not decide: the
    # pipeline's steady step (1.2 s) is slower than the exact one (1.0 s).
    aside = StepAside(warmup=0, steps=2)
    aside.bind(("pipeline", ))
    running, since_switch, now = [("pipeline", )], [-1], [0.0]

    def clock():  # read at the start of every step: it ends the step before
        since_switch[0] += 1
        if since_switch[0] > 0:
            now[0] += 10.0 if since_switch[0] == 1 else (1.2 if running[0] else 1.0)
        return now[0]

    saved, step_aside_module._clock = step_aside_module._clock, clock
    try:
        for _ in range(10):
            stages = aside.tick()
            if stages is not None:
                running[0], since_switch[0] = stages, 0
    finally:
        step_aside_module._clock = saved
    assert running[0] == ()
    assert aside.decision["seconds"] == pytest.approx([1.2, 1.0])


def test_every_runs_the_trial_again_and_follows_a_changing_gain():
    # The codec costs more than it saves at first, then (say, the model settled) it pays.
    aside = StepAside(warmup=0, steps=2, every=5)
    aside.bind(("codec", ))
    readings = [0]

    def cost(stages):
        readings[0] += 1
        if not stages:
            return 1.0
        return 2.0 if readings[0] <= 8 else 0.5

    running = [tuple(aside.arms[0])]
    history = []
    clock = FakeClock(lambda: running[0], cost)
    saved, step_aside_module._clock = step_aside_module._clock, clock
    try:
        for _ in range(30):
            stages = aside.tick()
            if stages is not None:
                running[0] = stages
                if aside._origin is None:  # a decision, not an arm
                    history.append(stages)
    finally:
        step_aside_module._clock = saved
    assert history[0] == ()  # first trial: the codec slowed the step
    assert history[-1] == ("codec", )  # a later one: it pays now
    assert running[0] == ("codec", )
    with pytest.raises(ValueError, match="every >= 0"):
        StepAside(every=-1)


def test_policy_without_stages():
    policy = ExchangePolicy.of("int2").with_cache(0.01).with_sampling(0.5)
    assert policy.stages() == ("sampling", "cache", "codec")
    exact = policy.without("sampling", "cache", "codec")
    assert exact.stages() == () and exact.lossless
    only_codec = policy_with(policy, ("codec", ))
    assert only_codec.stages() == ("codec", )
    assert only_codec.codec("x", "forward") is policy.codec("x", "forward")
    with pytest.raises(ValueError, match="unknown stage"):
        policy.without("compression")


def test_state_dict_round_trip_restarts_an_unfinished_trial():
    aside = StepAside(warmup=0, steps=2)
    aside.bind(("codec", ))
    _drive(aside, lambda s: 0.5 if s else 1.0)
    fresh = StepAside(warmup=0, steps=2)
    fresh.bind(("codec", ))
    assert fresh.load_state_dict(aside.state_dict()) == ("codec", )
    assert fresh.done and fresh.tick() is None
    assert StepAside().load_state_dict(StepAside().state_dict()) is None


def _train(rank, world_size, slow_rank):
    from torch_geometric.nn.models import GCN
    data, part = rank_partition(rank, world_size)
    aside = StepAside(warmup=1, steps=2)
    engine = FullGraphEngine(part,
                             exchange=ExchangeConfig(codec="int2", aggregation="post",
                                                     step_aside=aside))
    torch.manual_seed(0)
    model = GCN(data.num_features, 16, 2, 4, dropout=0.0)
    engine.attach(model)
    engine.use_kernels(None)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    local = engine.data
    seen = []

    def running():
        return engine.exchange.policy.stages()

    # Each rank measures its own times: on rank `slow_rank` the codec doubles the step, on
    # the other it halves it. The slowest rank decides the step, so both leave it out.
    clock = FakeClock(running, lambda s: (2.0 if rank == slow_rank else 0.5) if s else 1.0)
    saved, step_aside_module._clock = step_aside_module._clock, clock
    try:
        for _ in range(aside.trial_steps + 3):
            seen.append(running())
            optimizer.zero_grad()
            out = model(local.x, local.edge_index)
            F.cross_entropy(out[local.train_mask], local.y[local.train_mask]).backward()
            optimizer.step()
    finally:
        step_aside_module._clock = saved
    restored = FullGraphEngine(part,
                               exchange=ExchangeConfig(codec="int2", aggregation="post",
                                                       step_aside=True))
    restored.load_step_aside_state(engine.step_aside_state())
    return dict(seen=seen, decision=aside.decision, policy=engine.exchange.policy.stages(),
                restored=restored.exchange.policy.stages(),
                reverse=engine.policy.stages())


@pytest.mark.multiprocess
def test_ranks_decide_alike_from_the_slowest_rank():
    results = run_distributed(_train, 2, 1)
    for result in results:
        # warmup 1 (+ step 0) with the codec; arms (codec) then () for 2 steps each; decided.
        assert result["seen"][:2] == [("codec", )] * 2
        assert result["seen"][2:4] == [("codec", )] * 2
        assert result["seen"][4:6] == [()] * 2
        assert result["seen"][6:] == [()] * 3
        assert result["decision"]["stages"] == []
        assert result["decision"]["seconds"] == pytest.approx([2.0, 1.0])
        assert result["policy"] == () and result["restored"] == ()
        assert result["reverse"] == ("codec", )  # the configured policy is unchanged


def test_an_exact_policy_has_nothing_to_step_aside():
    data, part = rank_partition(0, 1)
    assert FullGraphEngine(part, exchange=ExchangeConfig(step_aside=True)).step_aside is None
