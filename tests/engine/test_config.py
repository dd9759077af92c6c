"""ExchangeConfig: one object for the exchange options, checked when made."""
import pytest

from lightning_fullgraph.engine import (AsyncPipeline, BoundarySampling, ExchangeConfig,
                                        HaloCache)
from lightning_fullgraph.engine.config import AGGREGATIONS


def test_defaults_are_exact_hybrid_with_overlap_and_step_aside():
    config = ExchangeConfig()
    assert config.aggregation == "hybrid" and config.overlap and config.step_aside
    assert config.lossless and config.policy().stages() == ()


def test_stage_shorthands_become_their_objects():
    config = ExchangeConfig(cache="budgeted", sampling=0.5, codec="int2")
    assert config.cache == "budgeted"  # kept as written: the config compares and saves so
    policy = config.policy()
    assert isinstance(policy.cache("x", "forward"), HaloCache)
    assert policy.cache("x", "forward").budgeted
    assert isinstance(policy.sampling, BoundarySampling) and policy.sampling.rate == 0.5
    assert policy.stages() == ("sampling", "cache", "codec")
    assert not config.lossless
    assert isinstance(ExchangeConfig(pipeline="async").policy().pipeline, AsyncPipeline)
    assert config == ExchangeConfig(cache="budgeted", sampling=0.5, codec="int2")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(aggregation="mixed"), ValueError, r"aggregation='mixed'.*'auto'"),
    (dict(codec="int3"), ValueError, "unknown codec 'int3'"),
    (dict(cache="sometimes"), ValueError, "unknown cache"),
    (dict(overlap="yes"), TypeError, "overlap"),
    (dict(link="fast"), ValueError, "LinkModel"),
    (dict(link="missing.json"), FileNotFoundError, "--save-link"),
    (dict(cache=0.01, pipeline="async", sampling=0.5), ValueError, "cannot be combined"),
])
def test_bad_options_fail_when_the_config_is_made(kwargs, error, match):
    with pytest.raises(error, match=match):
        ExchangeConfig(**kwargs)


def test_of_takes_none_a_config_or_a_mapping():
    assert ExchangeConfig.of(None) == ExchangeConfig()
    config = ExchangeConfig(aggregation="post")
    assert ExchangeConfig.of(config) is config
    assert ExchangeConfig.of({"aggregation": "post"}).aggregation == "post"
    with pytest.raises(TypeError, match=r"no field\(s\) \['codecs'\]"):
        ExchangeConfig.of({"codecs": "int2"})
    assert config.replace(codec="int4").policy().stages() == ("codec", )


def test_a_link_file_is_loaded(tmp_path):
    from lightning_fullgraph.planner import LinkModel
    path = LinkModel(alpha=1e-4, beta=1.25e8).save(tmp_path / "link.json")
    config = ExchangeConfig(aggregation="auto", link=str(path))
    assert isinstance(config.link, LinkModel) and config.link.beta == 1.25e8
    assert "auto" in AGGREGATIONS
