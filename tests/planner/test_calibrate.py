"""Calibration without a process group (the multi-rank case runs in test_distributed.py)."""
import importlib
import math

import pytest
import torch

from lightning_fullgraph.planner import (calibrate, calibrate_codec, calibrate_codec_costs,
                                         calibrate_contention, calibrate_queue_wait)
from lightning_fullgraph.planner.calibrate import _fastest_rank_means, _fit
from lightning_fullgraph.testing import run_distributed


def test_single_process_calibration_is_a_copy():
    link = calibrate(sizes=(0, 1 << 16, 1 << 20), repeats=3, warmup=1, codec_rows=256)
    assert (link.world_size, link.backend, link.device) == (1, "none", "cpu")
    for value in (link.alpha, link.beta, link.codec_throughput):
        assert math.isfinite(value) and value > 0
    assert [s for s, _ in link.samples] == [0, 1 << 16, 1 << 20]
    assert link.exchange_seconds(1 << 20, 1) == 0.0  # one rank exchanges nothing


def test_codec_timing_and_fit():
    # Timed on rows of its own generator: training's random state does not move (a
    # calibration at fit start changed the run's dropout draws).
    before = torch.random.get_rng_state()
    assert calibrate_codec(rows=64, width=8, repeats=2) > 0
    assert torch.equal(torch.random.get_rng_state(), before)
    # 1 ms latency over 3 peers, 1 GB/s: recovered exactly from noiseless samples.
    sizes = [0, 10**6, 10**7]
    alpha, beta = _fit(sizes, [3e-3 + s / 1e9 for s in sizes], world=4)
    assert alpha == pytest.approx(1e-3) and beta == pytest.approx(1e9)
    alpha, beta = _fit(sizes, [3e-3, 2e-3, 2e-3], world=4)  # noise: no negative bandwidth
    assert beta > 0 and alpha == pytest.approx(1e-3)


def test_codec_costs_split_bytes_and_rows(monkeypatch):
    # A codec of 1 GB/s and 100 ns per row: both recovered from its two blocks' times.
    def timed(codec=None, *, rows, width, **kwargs):
        return rows * (100e-9 + width * 4 / 1e9)

    module = importlib.import_module("lightning_fullgraph.planner.calibrate")
    monkeypatch.setattr(module, "calibrate_codec", timed)
    throughput, row_s = calibrate_codec_costs(rows=4096, width=128)
    assert throughput == pytest.approx(1e9) and row_s == pytest.approx(100e-9)
    assert calibrate_codec_costs(rows=4096, width=8) == pytest.approx((4096 * 8 * 4 / timed(
        rows=4096, width=8), 0.0))  # no narrower block: the bytes alone
    # Narrow rows timed cheaper per value than wide ones (noise): the bytes alone, no
    # negative row cost.
    monkeypatch.setattr(module, "calibrate_codec",
                        lambda codec=None, *, rows, width, **kw: rows * width * (
                            1e-9 if width < 128 else 2e-9))
    assert calibrate_codec_costs(rows=4096, width=128) == pytest.approx((2e9, 0.0))
    # calibrate() holds both in its LinkModel.
    monkeypatch.setattr(module, "calibrate_codec", timed)
    link = calibrate(sizes=(0, 1 << 16), repeats=2, warmup=0, codec_rows=256)
    assert link.codec_throughput == pytest.approx(1e9)
    assert link.codec_row_seconds == pytest.approx(100e-9)


def test_quantized_codec_costs_are_measured():
    from lightning_fullgraph.engine.codecs import QuantizedCodec
    throughput, row_s = calibrate_codec_costs(QuantizedCodec(2), rows=256, width=256,
                                              repeats=2)
    assert 0 < throughput < math.inf and row_s >= 0


def _gathered_means(rank, world_size):
    # Rank r's times: repetition i took (i + 1)^2 ms plus r ms of waiting for the others.
    times = torch.tensor([[1e-3 * (i + 1) ** 2 + 1e-3 * rank, 5e-3 + 1e-3 * rank]
                          for i in range(4)], dtype=torch.float64)
    return _fastest_rank_means(times, world_size, "gloo", None, torch.device("cpu"))


@pytest.mark.multiprocess
def test_estimator_is_the_mean_of_the_fastest_rank():
    # Per repetition the rank that waited least (rank 0 here), then the mean over
    # repetitions -- not a median: an epoch's exchange time is a sum of heavy-tailed ones.
    means = run_distributed(_gathered_means, 2)
    assert means[0] == means[1] == pytest.approx([7.5e-3, 5e-3])  # median: 6.5e-3
    times = torch.tensor([[1e-3], [1e-3], [10e-3]], dtype=torch.float64)
    assert _fastest_rank_means(times, 1, "none", None, torch.device("cpu")) == \
        pytest.approx([4e-3])  # one rank: the mean, tail included (the median is 1 ms)


def _contention(rank, world_size):
    torch.set_num_threads(1)
    asked = calibrate(sizes=(0, 1 << 16), repeats=2, warmup=0, codec_rows=64, contention=True)
    plain = calibrate(sizes=(0, 1 << 16), repeats=2, warmup=0, codec_rows=64)
    return (asked.contention, plain.contention, calibrate_contention(beta=1e8, block_s=0.02),
            asked.queue_wait, plain.queue_wait)


@pytest.mark.multiprocess
def test_contention_is_agreed_by_every_rank():
    # Compute seconds lost per second of transfer in flight: measured only when asked, in
    # [0, 1), the same number on every rank (all-reduced: it changes no wire size, but every
    # rank must predict the same step).
    results = run_distributed(_contention, 2)
    assert results[0] == results[1]
    asked, plain, direct, queued, unasked = results[0]
    assert 0.0 <= asked < 1.0 and 0.0 <= direct < 1.0 and plain == 0.0
    assert queued >= 0.0 and unasked == 0.0  # the queue wait too: only when asked
    assert calibrate_contention(beta=1e8) == 0.0  # one process: nothing in flight
    assert calibrate_queue_wait(beta=1e8) == 0.0


def _queue_wait_on_a_subgroup(rank, world_size):
    import torch.distributed as dist
    sub = dist.new_group(ranks=[0, 1])
    wait = calibrate_queue_wait(sub, beta=1e8, fill_s=0.01, repeats=1, timeout=60) \
        if rank < 2 else None
    dist.barrier()  # the rank outside the subgroup waits here, creating nothing
    return wait


@pytest.mark.multiprocess
def test_queue_wait_on_a_subgroup_needs_only_its_ranks():
    # Its second group is made over the subgroup's ranks alone (as the pipeline's is): a
    # rank outside never calls it, and nothing hangs.
    results = run_distributed(_queue_wait_on_a_subgroup, 3, timeout_s=60)
    assert results[0] == results[1] >= 0.0 and results[2] is None


def test_a_bulk_size_is_timed_a_few_times_and_counts_its_mean(monkeypatch):
    # Every exchange the sweep runs, by bytes sent: the sizes up to 8 MiB every repetition
    # (warm-ups included), a bulk one only in the last bulk_repeats and one warm-up right
    # before; each size's mean is over its own timed turns.
    module = importlib.import_module("lightning_fullgraph.planner.calibrate")
    calls = []

    def timed(send, recv, splits, world, group, device, before):
        calls.append(send.numel() * 4)
        return 1e-3 * len(calls)  # the call's position: which turns were timed

    monkeypatch.setattr(module, "_time_once", timed)
    link = calibrate(sizes=(0, 1 << 20, 1 << 25), repeats=5, warmup=2, bulk_repeats=2,
                     codec_rows=64)
    assert [calls.count(s) for s in (0, 1 << 20, 1 << 25)] == [7, 7, 3]
    # Seven turns: two warm-ups and five timed; the bulk size joins at the fifth (its
    # warm-up) and is timed in the last two.
    assert calls == [0, 1 << 20] * 4 + [0, 1 << 20, 1 << 25] * 3
    means = [t for _, t in link.samples]
    assert means[0] == pytest.approx(1e-3 * (5 + 7 + 9 + 12 + 15) / 5)
    assert means[2] == pytest.approx(1e-3 * (14 + 17) / 2)
    assert module.DEFAULT_SIZES[-1] > module.BULK_BYTES  # the default sweep ends with one
    calls.clear()  # without warm-ups, the bulk size runs only its timed turns
    calibrate(sizes=(0, 1 << 25), repeats=3, warmup=0, bulk_repeats=5, codec_rows=64)
    assert calls == [0, 1 << 25] * 3
    with pytest.raises(ValueError, match="bulk_repeats"):
        calibrate(bulk_repeats=0)


def _bulk_calibration(rank, world_size):
    link = calibrate(sizes=(0, 1 << 16, (1 << 23) + (1 << 16)), repeats=3, warmup=1,
                     bulk_repeats=1, codec_rows=64)
    return link.samples, link.beta


@pytest.mark.multiprocess
def test_ranks_agree_on_a_sweep_with_a_bulk_size():
    # The bulk size's untimed turns are NaN on every rank alike: the gathered minimum keeps
    # them NaN, and its mean skips them.
    results = run_distributed(_bulk_calibration, 2)
    assert results[0] == results[1]
    samples, beta = results[0]
    assert all(math.isfinite(t) and t > 0 for _, t in samples) and beta > 0


def test_barrier_protocol_still_available():
    link = calibrate(sizes=(0, 1 << 16), repeats=2, warmup=0, skew_s=0.0, codec_rows=64)
    assert link.alpha > 0 and link.beta > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="repeats"):
        calibrate(repeats=0)
    with pytest.raises(ValueError, match="skew_s"):
        calibrate(skew_s=-1.0)
    with pytest.raises(ValueError, match="at least 2"):
        from lightning_fullgraph.planner import calibrate_local
        calibrate_local(1)
