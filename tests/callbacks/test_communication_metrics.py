"""What CommunicationMonitor logs about the wire is what crossed it: ``comm/bits`` is the
forward rows' measured width (per-node widths included), ``comm/async`` the share of the epoch's
pipelined exchanges that ran on stale rows (0 for the epochs the pipeline forces synchronous)."""
from types import SimpleNamespace

import pytest
import torch

from lightning_fullgraph.engine import AsyncPipeline, ExchangeConfig, FullGraphEngine
from lightning_fullgraph.engine.codecs.node_adaptive import NodeAdaptiveCodec
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from ..engine.models import layer_exchange, skewed_graph

F = 16


def _epochs(engine, epochs):
    r"""Drives a monitor through :obj:`epochs` training epochs of one probe exchange each;
    returns what it logged per epoch."""
    from lightning_fullgraph.callbacks import CommunicationMonitor
    logged = {}
    module = SimpleNamespace(log=lambda name, value, **kw: logged.__setitem__(name, value))
    trainer = SimpleNamespace(strategy=SimpleNamespace(engine=engine), datamodule=None,
                              loggers=[], state=SimpleNamespace(fn="fit"), world_size=2)
    monitor = CommunicationMonitor(predict=False, per_layer=False)
    monitor.on_fit_start(trainer, module)
    x = engine.data.x.clone().requires_grad_()
    out = []
    for step in range(epochs):
        engine.set_step(step)
        monitor.on_train_epoch_start(trainer, module)
        monitor.on_train_batch_start(trainer, module, None, 0)
        layer_exchange(engine.exchange, x).sum().backward()  # a training layer's exchange
        monitor.on_train_batch_end(trainer, module, None, None, 0)
        monitor.on_train_epoch_end(trainer, module)
        out.append(dict(logged))
    return out


def _part(rank, world_size):
    data = skewed_graph(num_nodes=200, num_features=F)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    return build_local_partitions(data, parts)[rank]


def _adaptive(rank, world_size):
    engine = FullGraphEngine(_part(rank, world_size),
                             exchange=ExchangeConfig(codec=NodeAdaptiveCodec(bits=1),
                                                     aggregation="post", step_aside=False))
    logged = _epochs(engine, 1)[0]
    engine.drain()
    ex = engine.exchange
    codec = ex.policy.codec("probe", "forward")
    bits = codec.row_bits(ex.send_levels)  # the widths of the rows this rank sent
    return dict(logged=logged["comm/bits"], bits=int(bits.sum()), rows=bits.numel())


@pytest.mark.multiprocess
def test_bits_of_a_per_node_codec_are_the_widths_sent():
    # `--codec adaptive` reported its base width (1 bit) while sending wider rows.
    results = run_distributed(_adaptive, 2)
    expected = sum(r["bits"] for r in results) / sum(r["rows"] for r in results)
    assert expected > 1.5  # boundary nodes of higher levels go wider than the base width
    for r in results:
        assert r["logged"] == pytest.approx(expected)


def _pipelined(rank, world_size):
    engine = FullGraphEngine(_part(rank, world_size),
                             exchange=ExchangeConfig(pipeline=AsyncPipeline("async", 2),
                                                     aggregation="post", step_aside=False))
    logged = [e["comm/async"] for e in _epochs(engine, 5)]
    engine.drain()
    return logged


@pytest.mark.multiprocess
def test_async_is_zero_for_the_epochs_the_pipeline_runs_synchronously():
    # The first exchange is synchronous (nothing older), then two asynchronous ones
    # (max_async_epochs=2), then a synchronous one: comm/async used to say 1 for all.
    for logged in run_distributed(_pipelined, 2):
        assert logged == [0.0, 1.0, 1.0, 0.0, 1.0], logged
