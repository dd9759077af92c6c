"""StepAside: a stage that does not shorten the step is left out, by every rank alike.

The step clock is replaced by one that charges each step by the stages running in it, so the
decisions are those of known timings; a real run times real steps (python -m benchmarks cluster).
"""
import json

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


def _drive(aside, cost, ticks=40, start=None):
    # start: the stages running at the first tick (default: the first arm's).
    running = [tuple(start) if start is not None else tuple(aside.arms[0])]
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


def test_state_dict_round_trip_keeps_the_decision():
    aside = StepAside(warmup=0, steps=2)
    aside.bind(("codec", ))
    _drive(aside, lambda s: 0.5 if s else 1.0)
    fresh = StepAside(warmup=0, steps=2)
    fresh.bind(("codec", ))
    assert fresh.load_state_dict(aside.state_dict()) == ("codec", )
    assert fresh.done and fresh.tick() is None
    assert StepAside().load_state_dict(StepAside().state_dict()) is None
    # A decision saved alone (before the trial's progress was saved) is kept too.
    older = StepAside(warmup=0, steps=2)
    older.bind(("codec", ))
    assert older.load_state_dict({"decision": aside.decision}) == ("codec", )


@pytest.mark.parametrize("stop", range(1, 17))
def test_a_resumed_trial_goes_on_where_it_stopped(stop):
    # Interrupted after `stop` ticks, the resumed trial runs the same stages at the same
    # steps as the one that was not, and decides from the steps timed in both parts (the
    # step in progress at the checkpoint is not timed).
    def cost(stages):
        return 1.0 + 0.3 * ("cache" in stages) - 0.4 * ("codec" in stages)

    def run(aside, ticks, running):
        clock = FakeClock(lambda: running[0], cost)
        saved, step_aside_module._clock = step_aside_module._clock, clock
        seen = []
        try:
            for _ in range(ticks):
                stages = aside.tick()
                if stages is not None:
                    running[0] = stages
                seen.append(running[0])
        finally:
            step_aside_module._clock = saved
        return seen

    def make():
        aside = StepAside(warmup=1, steps=3)  # two timed steps an arm: one may be cut
        aside.bind(("cache", "codec"))
        return aside

    straight = make()
    whole = run(straight, 18, [("cache", "codec")])
    first = make()
    part = run(first, stop, [("cache", "codec")])
    resumed = make()
    now = resumed.load_state_dict(first.state_dict())
    rest = run(resumed, 18 - stop, [now if now is not None else ("cache", "codec")])
    assert part + rest == whole
    assert resumed.decision["stages"] == straight.decision["stages"] == ["codec"]


def test_an_arm_a_checkpoint_left_untimed_is_not_chosen_and_the_decision_is_json():
    # With one timed step an arm, a checkpoint taken while that step runs leaves the arm
    # with no time: it is not chosen, and its time is None in the decision (the decision
    # goes to ``train --json`` and to checkpoints, where an infinite float is not JSON).
    untimed = 0

    def cost(stages):
        return 0.5 if stages == ("codec", ) else 1.0

    for stop in range(1, 12):
        first = StepAside(warmup=0, steps=2)
        first.bind(("codec", ))
        _drive(first, cost, stop)
        resumed = StepAside(warmup=0, steps=2)
        resumed.bind(("codec", ))
        _drive(resumed, cost, 12 - stop, start=resumed.load_state_dict(first.state_dict()))
        decision = resumed.decision
        json.dumps(decision, allow_nan=False)
        seconds = dict(zip(map(tuple, decision["arms"]), decision["seconds"]))
        assert seconds[tuple(decision["stages"])] is not None
        untimed += None in seconds.values()
    assert untimed > 0  # some checkpoint did leave the faster arm untimed


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


def test_exact_post_has_nothing_to_step_aside():
    data, part = rank_partition(0, 1)
    exact = ExchangeConfig(aggregation="post", step_aside=True)
    assert FullGraphEngine(part, exchange=exact).step_aside is None


def test_the_aggregation_mode_is_an_arm_where_a_layer_can_run_it():
    from torch_geometric.nn.models import GAT, GCN
    data, part = rank_partition(0, 1)
    # Exact hybrid (the default): hybrid against post.
    engine = FullGraphEngine(part, exchange=ExchangeConfig(step_aside=True))
    assert engine.step_aside.arms == [("hybrid", ), ()]
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation="auto", codec="int2",
                                                           step_aside=True))
    assert engine.step_aside.arms == [("auto", "codec"), ("auto", ), ("codec", ), ()]
    engine.attach(GCN(data.num_features, 16, 2, 4))
    try:
        assert engine.step_aside.arms == [("auto", "codec"), ("auto", ), ("codec", ), ()]
    finally:
        engine.detach()  # the model's hooks and PyG's gcn_norm as they were
    # No layer can be pre-aggregated (attention): the mode is not tried.
    engine = FullGraphEngine(part, exchange=ExchangeConfig(codec="int2", step_aside=True))
    engine.attach(GAT(data.num_features, 16, 2, 4))
    try:
        assert engine.step_aside.arms == [("codec", ), ()]
    finally:
        engine.detach()


def _step_bytes(engine):
    return engine.stats.total().bytes_sent


def _train_modes(rank, world_size):
    from torch_geometric.nn.models import GraphSAGE
    data, part = rank_partition(rank, world_size)
    runs = {}
    for name, config in [
            ("aside", ExchangeConfig(codec="int2", aggregation="hybrid",
                                     step_aside=StepAside(warmup=1, steps=2))),
            ("post", ExchangeConfig(codec="int2", aggregation="post", step_aside=False))]:
        engine = FullGraphEngine(part, exchange=config, seed=3)
        torch.manual_seed(0)
        model = GraphSAGE(data.num_features, 16, 2, 4, dropout=0.0)
        engine.attach(model)
        engine.use_kernels(None)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        local = engine.data
        seen, sent, losses = [], [], []

        def running():
            mode = () if engine.router.post_held else ("hybrid", )
            return mode + engine.exchange.policy.stages()

        # Hybrid adds 20 % to the step, the codec halves it: post + the codec wins.
        clock = FakeClock(running, lambda s: (1.2 if "hybrid" in s else 1.0)
                          * (0.5 if "codec" in s else 1.0))
        saved, step_aside_module._clock = step_aside_module._clock, clock
        try:
            for _ in range(1 + 1 + 4 * 2 + 3):
                seen.append(running())
                before = _step_bytes(engine)
                optimizer.zero_grad()
                out = model(local.x, local.edge_index)
                loss = F.cross_entropy(out[local.train_mask], local.y[local.train_mask])
                loss.backward()
                optimizer.step()
                sent.append(_step_bytes(engine) - before)
                losses.append(float(loss.detach()))
        finally:
            step_aside_module._clock = saved
        runs[name] = dict(seen=seen, sent=sent, losses=losses,
                          decision=engine.step_aside.decision if engine.step_aside else None,
                          state=engine.step_aside_state())
    restored = FullGraphEngine(part, exchange=ExchangeConfig(codec="int2", step_aside=True))
    restored.load_step_aside_state(runs["aside"]["state"])
    runs["restored"] = (restored.router.post_held, restored.exchange.policy.stages())
    # A decision that did not try the mode (checkpointed before it was an arm) keeps it.
    older = FullGraphEngine(part, exchange=ExchangeConfig(codec="int2", step_aside=True))
    older.load_step_aside_state({"decision": {"stages": ["codec"], "arms": [["codec"], []],
                                              "seconds": [0.5, 1.0], "step": 6}})
    runs["older"] = (older.router.post_held, older.exchange.policy.stages())
    return runs


@pytest.mark.multiprocess
def test_hybrid_steps_aside_for_post_when_its_partial_sums_cost_more_than_they_save():
    results = run_distributed(_train_modes, 2)
    hybrid_fewer = False
    for runs in results:
        aside, post = runs["aside"], runs["post"]
        arms = [("hybrid", "codec"), ("hybrid", ), ("codec", ), ()]
        # step 0 and the warm-up step as configured, then each arm for 2 steps, decided.
        assert aside["seen"][:2] == [arms[0]] * 2
        for i, arm in enumerate(arms):
            assert aside["seen"][2 + 2 * i:4 + 2 * i] == [arm] * 2
        assert aside["seen"][10:] == [("codec", )] * 3
        assert aside["decision"]["stages"] == ["codec"]
        assert aside["decision"]["seconds"] == pytest.approx([0.6, 1.2, 0.5, 1.0])
        # What crossed the wire is each arm's: hybrid's rows in its arms, post's after the
        # decision, as a post-aggregated run sends them.
        assert aside["sent"][10:] == post["sent"][10:]
        assert aside["sent"][6] == aside["sent"][11]  # the ("codec",) arm: post with int2
        hybrid_fewer |= aside["sent"][2] < aside["sent"][6]
        assert aside["sent"][2] <= aside["sent"][6]
        # Both modes compute the same model: the trial's switches change no loss beyond the
        # 2-bit codec's noise (both runs draw the same stochastic rounding).
        assert aside["losses"] == pytest.approx(post["losses"], abs=0.05)
        assert runs["restored"] == (True, ("codec", ))
        assert runs["older"] == (False, ("codec", ))
    assert hybrid_fewer  # the graph has pre edges: the arms differ on the wire


def _train_switching(rank, world_size, pipeline):
    from torch_geometric.nn.models import GCN
    data, part = rank_partition(rank, world_size)
    runs = {}
    for name, config in [
            ("aside", ExchangeConfig(aggregation="hybrid", pipeline=pipeline,
                                     step_aside=pipeline is None and StepAside(warmup=1,
                                                                               steps=2))),
            ("post", ExchangeConfig(aggregation="post", pipeline=pipeline, step_aside=False))]:
        engine = FullGraphEngine(part, exchange=config)
        torch.manual_seed(0)
        model = GCN(data.num_features, 16, 2, 4, dropout=0.0)
        engine.attach(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        local = engine.data
        # Exact: post is faster, the trial ends in post. Pipelined: the trial's arms are
        # replaced by switches of the mode alone, the pipeline on throughout (as between
        # the arms of a trial of three stages, or a trial run again with `every`).
        clock = FakeClock(lambda: () if engine.router.post_held else ("hybrid", ),
                          lambda s: 1.5 if s else 1.0)
        saved, step_aside_module._clock = step_aside_module._clock, clock
        losses, fresh = [], []
        try:
            for step in range(8):
                if pipeline is not None and name == "aside" and step in (2, 4):
                    engine.run_stages(("pipeline", ) if step == 2 else ("hybrid", "pipeline"))
                before = engine.stats.total()
                optimizer.zero_grad()
                logits = model(local.x, local.edge_index)
                loss = F.cross_entropy(logits[local.train_mask], local.y[local.train_mask])
                loss.backward()
                optimizer.step()
                after = engine.stats.total()
                losses.append(float(loss.detach()))
                fresh.append((after.pipelined - after.stale) - (before.pipelined - before.stale))
        finally:
            step_aside_module._clock = saved
        engine.drain()
        runs[name] = dict(losses=losses, fresh=fresh, held=engine.router.post_held)
    return runs


@pytest.mark.multiprocess
@pytest.mark.parametrize("pipeline", [None, "async"])
def test_switching_mode_keeps_the_exact_trajectory_and_restarts_the_pipeline(pipeline):
    for runs in run_distributed(_train_switching, 2, pipeline):
        aside, post = runs["aside"], runs["post"]
        if pipeline is None:
            assert aside["held"]
            # Hybrid and post are the same model: the trial's switches are invisible.
            assert aside["losses"] == pytest.approx(post["losses"], rel=1e-5, abs=1e-6)
            continue
        # Steps 0-1 hybrid, 2-3 post, from 4 hybrid again, pipelined throughout. Each switch
        # restarts the pipeline: the step that starts in another mode exchanges
        # synchronously (else step 4 would hand the layers hybrid's rows of step 1).
        assert not aside["held"]
        assert [i for i, n in enumerate(aside["fresh"]) if n] == [0, 2, 4]
        assert [i for i, n in enumerate(post["fresh"]) if n] == [0]
        assert aside["losses"][:2] == pytest.approx(post["losses"][:2], rel=1e-5)
