"""Both strategies refuse at construction what they would otherwise ignore or fail on later,
on every rank: misspelled options, DistributedDataParallel's options, unknown codecs, timeouts
that are not positive."""
from datetime import timedelta

import pytest

from lightning_fullgraph import FourDStrategy, FullGraphStrategy


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
def test_a_misspelled_option_is_refused_with_the_closest_name(strategy):
    typo = {FullGraphStrategy: ("codecs", "codec"), FourDStrategy: ("bf16", "bf16_comm")}
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
        FullGraphStrategy(codec="int3")


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
@pytest.mark.parametrize("value", [0, -1, timedelta(0)])
def test_timeouts_must_be_positive(strategy, value):
    with pytest.raises(ValueError, match="timeout must be positive"):
        strategy(timeout=value)
    with pytest.raises(ValueError, match="startup_timeout must be positive"):
        strategy(startup_timeout=value)


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
def test_the_two_timeouts_keep_their_roles(strategy):
    s = strategy(timeout=7, startup_timeout=timedelta(minutes=3))
    assert s.collective_timeout == timedelta(seconds=7)  # training's collectives
    assert s._timeout == timedelta(minutes=3)  # Lightning's: the process group at start-up


@pytest.mark.parametrize("strategy", [FullGraphStrategy, FourDStrategy])
def test_ddp_options_at_their_defaults_are_accepted(strategy):
    # LightningCLI resolves **kwargs through DDPStrategy into DistributedDataParallel and
    # passes every option at its default.
    strategy(find_unused_parameters=False, static_graph=False, ddp_comm_hook=None,
             bucket_cap_mb=None)


@pytest.mark.parametrize("value, threads", [("3", 3), (" 1 ", 1), ("0", None), ("", None),
                                            ("four", None)])
def test_omp_num_threads_chooses_the_default_thread_count(monkeypatch, value, threads):
    # torchrun (and a user) ask for a thread count with $OMP_NUM_THREADS; without it the
    # strategy divides the node's cores among its processes.
    from lightning_fullgraph.strategies.fullgraph import _omp_threads
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert _omp_threads() == threads
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert _omp_threads() is None


def test_reductions_step_aside_by_default():
    # A reduction never makes training slower: the strategy and Fabric's setup time the
    # configured stages unless told not to (an exact policy has nothing to try).
    import inspect

    from lightning_fullgraph.engine.step_aside import StepAside
    from lightning_fullgraph.fabric import setup_fullgraph
    assert isinstance(FullGraphStrategy().step_aside, StepAside)
    assert FullGraphStrategy(step_aside=False).step_aside is None
    assert inspect.signature(setup_fullgraph).parameters["step_aside"].default is True
