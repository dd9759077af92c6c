"""Calibration without a process group (the multi-rank case runs in test_distributed.py)."""
import math

import pytest

from lightning_fullgraph.planner import calibrate, calibrate_codec
from lightning_fullgraph.planner.calibrate import _fit


def test_single_process_calibration_is_a_copy():
    link = calibrate(sizes=(0, 1 << 16, 1 << 20), repeats=3, warmup=1, codec_rows=256)
    assert (link.world_size, link.backend, link.device) == (1, "none", "cpu")
    for value in (link.alpha, link.beta, link.codec_throughput):
        assert math.isfinite(value) and value > 0
    assert [s for s, _ in link.samples] == [0, 1 << 16, 1 << 20]
    assert link.exchange_seconds(1 << 20, 1) == 0.0  # one rank exchanges nothing


def test_codec_timing_and_fit():
    assert calibrate_codec(rows=64, width=8, repeats=2) > 0
    # 1 ms latency over 3 peers, 1 GB/s: recovered exactly from noiseless samples.
    sizes = [0, 10**6, 10**7]
    alpha, beta = _fit(sizes, [3e-3 + s / 1e9 for s in sizes], world=4)
    assert alpha == pytest.approx(1e-3) and beta == pytest.approx(1e9)
    alpha, beta = _fit(sizes, [3e-3, 2e-3, 2e-3], world=4)  # noise: no negative bandwidth
    assert beta > 0 and alpha == pytest.approx(1e-3)


def test_bad_arguments():
    with pytest.raises(ValueError, match="repeats"):
        calibrate(repeats=0)
    with pytest.raises(ValueError, match="at least 2"):
        from lightning_fullgraph.planner import calibrate_local
        calibrate_local(1)
