"""Both strategies refuse at construction what they would otherwise ignore or fail on later,
on every rank: misspelled options, DistributedDataParallel's options, unknown codecs, timeouts
that are not positive."""
from datetime import timedelta

import pytest

from lightning_fullgraph import FourDStrategy, FullGraphStrategy, KernelConfig, TimeoutConfig
from lightning_fullgraph.engine import ExchangeConfig


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
def test_a_misspelled_option_is_refused_with_the_closest_name(strategy):
    typo = {FullGraphStrategy: ("exchanges", "exchange"), FourDStrategy: ("bf16", "bf16_comm")}
    wrong, right = typo[strategy]
    with pytest.raises(TypeError, match=rf"'{wrong}' \(did you mean '{right}'\?\)"):
        strategy(**{wrong: True})


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
@pytest.mark.parametrize("option", ["find_unused_parameters", "static_graph", "ddp_comm_hook",
                                    "model_averaging_period"])
def test_ddp_options_are_refused_because_the_model_is_never_wrapped(strategy, option):
    with pytest.raises(TypeError, match="does not wrap the model in DistributedDataParallel"):
        strategy(**{option: 1})


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
def test_launch_options_still_reach_ddp_strategy(strategy):
    s = strategy(process_group_backend="gloo", start_method="spawn")
    assert s._process_group_backend == "gloo" and s._start_method == "spawn"


def test_an_unknown_codec_is_refused_at_construction():
    with pytest.raises(ValueError, match="unknown codec 'int3'"):
        FullGraphStrategy(exchange=ExchangeConfig(codec="int3"))


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
@pytest.mark.parametrize("value", [0, -1, timedelta(0)])
def test_timeouts_must_be_positive(strategy, value):
    with pytest.raises(ValueError, match="timeout must be positive"):
        strategy(timeout=value)
    with pytest.raises(ValueError, match="startup must be positive"):
        strategy(timeout=TimeoutConfig(startup=value))
    with pytest.raises(ValueError, match="collectives must be positive"):
        strategy(timeout=TimeoutConfig(collectives=value))


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
def test_the_two_timeouts_keep_their_roles(strategy):
    s = strategy(timeout=TimeoutConfig(collectives=7, startup=timedelta(minutes=3)))
    assert s.collective_timeout == timedelta(seconds=7)  # training's collectives
    assert s._timeout == timedelta(minutes=3)  # Lightning's: the process group at start-up
    s = strategy()  # start-up may be slow (rank 0 partitions), a stuck peer is noticed soon
    assert (s._timeout, s.collective_timeout) == (timedelta(minutes=30), timedelta(minutes=5))


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
def test_one_timeout_keeps_lightnings_meaning(strategy):
    # DDPStrategy(timeout=...) is the process group's timeout, start-up and collectives alike.
    s = strategy(timeout=timedelta(minutes=3))
    assert s._timeout == s.collective_timeout == timedelta(minutes=3)


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
def test_grouped_arguments_are_refused_with_their_new_place(strategy):
    with pytest.raises(TypeError, match=r"timeout=TimeoutConfig\(startup=60\)"):
        strategy(startup_timeout=60)
    if strategy is FullGraphStrategy:
        with pytest.raises(TypeError, match=r"kernels=KernelConfig\(huge_pages=True\)"):
            strategy(huge_pages=True)
        with pytest.raises(TypeError, match=r"kernels=KernelConfig\(num_threads=2\)"):
            strategy(num_threads=2)


def test_at_most_eight_arguments():
    import inspect
    for strategy in (FullGraphStrategy, FourDStrategy):
        own = [n for n, p in inspect.signature(strategy.__init__).parameters.items()
               if n != "self" and p.kind is not p.VAR_KEYWORD]
        assert len(own) <= 8, (strategy.__name__, own)


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
def test_ddp_options_at_their_defaults_are_accepted(strategy):
    # LightningCLI resolves **kwargs through DDPStrategy into DistributedDataParallel and
    # passes every option at its default.
    strategy(find_unused_parameters=False, static_graph=False, ddp_comm_hook=None,
             bucket_cap_mb=None)


def test_num_threads_must_be_positive():
    # (Set only when given, restored at teardown: tests/strategies/test_fullgraph.py.)
    with pytest.raises(ValueError, match="num_threads must be at least 1"):
        FullGraphStrategy(kernels=KernelConfig(num_threads=0))
    with pytest.raises(ValueError, match="num_threads must be at least 1"):
        FourDStrategy(num_threads=0)


def test_reductions_step_aside_by_default():
    # A reduction never makes training slower: the strategy, Fabric's setup and the engine
    # share one ExchangeConfig, which times the configured stages unless told not to (an
    # exact policy has nothing to try).
    assert ExchangeConfig().step_aside is True
    assert FullGraphStrategy().exchange.step_aside is True
    assert FullGraphStrategy(exchange=ExchangeConfig(step_aside=False)).exchange.step_aside \
        is False


@pytest.mark.parametrize("old, field", [("codec", "codec"), ("cache", "cache"),
                                        ("boundary_sampling", "sampling"),
                                        ("aggregation", "aggregation"), ("overlap", "overlap"),
                                        ("step_aside", "step_aside"), ("pipeline", "pipeline")])
def test_exchange_options_passed_directly_name_their_config_field(old, field):
    from lightning_fullgraph.fabric import setup_fullgraph
    with pytest.raises(TypeError, match=rf"exchange=ExchangeConfig\({field}="):
        FullGraphStrategy(**{old: None})
    with pytest.raises(TypeError, match=rf"exchange=ExchangeConfig\({field}="):
        setup_fullgraph(None, None, None, **{old: None})


def test_the_strategy_takes_a_mapping_as_its_exchange_config():
    s = FullGraphStrategy(exchange={"codec": "int2", "aggregation": "post"})
    assert s.exchange == ExchangeConfig(codec="int2", aggregation="post")
