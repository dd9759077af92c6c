"""The C++ kernels' output pool (``csrc/aggregate.cpp``, :func:`kernels.pool_info`).

Outputs of at least 8 MiB come from recycled buffers. An idle buffer is memory no tensor
uses, so a size is kept only while its buffers are reused more often than dropped unused.
The pool steps aside while the huge-page allocator's block cache is on (the default), so
these tests turn the cache off.
"""
import os
import sys

import pytest
import torch

import lightning_fullgraph.kernels as K

from kernel_testutils import cpp_or_skip

MIB = 1 << 20
NUM_DST = (9 * MIB) // (32 * 4)  # [NUM_DST, 32] float32 outputs: 9 MiB, pooled

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.environ.get("LIGHTNING_FULLGRAPH_POOL_MB") == "0",
    reason="the output pool exists on Linux, and LIGHTNING_FULLGRAPH_POOL_MB=0 turns it off")


@pytest.fixture(autouse=True)
def _block_cache_off():
    previous = K.get_block_cache()
    K.set_block_cache(0)
    yield
    K.set_block_cache(previous)


def _aggregate(num_dst: int) -> torch.Tensor:
    edge_index = torch.stack([torch.arange(num_dst) % 1000, torch.arange(num_dst)])
    return K.aggregate(torch.ones(1000, 32), edge_index, None, "sum", num_dst, backend="cpp")


def _stats_since(start: dict) -> dict:
    now = K.pool_info()
    return {**now, "hits": now["hits"] - start["hits"], "misses": now["misses"] - start["misses"]}


def test_outputs_of_one_size_reuse_one_buffer():
    cpp_or_skip()
    K.clear_memos()
    start = K.pool_info()
    for _ in range(4):
        out = _aggregate(NUM_DST)
        assert float(out.sum()) == NUM_DST * 32
        del out
    stats = _stats_since(start)
    assert stats["misses"] == 1 and stats["hits"] == 3
    assert stats["idle_buffers"] == 1 and stats["idle_bytes"] >= 9 * MIB
    K.clear_memos()
    assert K.pool_info()["idle_bytes"] == 0


def test_sizes_that_alternate_are_not_kept_idle():
    # Two sizes in turn: each request drops the other size's idle buffer unused. After one
    # such drop per size, neither is kept, and nothing sits idle between calls.
    cpp_or_skip()
    K.clear_memos()
    start = K.pool_info()
    for _ in range(4):
        for num_dst in (NUM_DST, 2 * NUM_DST):
            out = _aggregate(num_dst)
            del out
    stats = _stats_since(start)
    assert stats["hits"] == 0 and stats["misses"] == 8
    assert stats["idle_bytes"] == 0 and stats["idle_buffers"] == 0
    # clear_memos forgets that history: one size alone is reused again.
    K.clear_memos()
    start = K.pool_info()
    for _ in range(3):
        del_me = _aggregate(2 * NUM_DST)
        del del_me
    assert _stats_since(start)["hits"] == 2


def test_pool_info_reports_the_limit_in_effect():
    cpp_or_skip()
    info = K.pool_info()
    assert set(info) == {"hits", "misses", "idle_bytes", "idle_buffers", "limit_bytes"}
    assert info["limit_bytes"] == int(os.environ.get("LIGHTNING_FULLGRAPH_POOL_MB", 2048)) * MIB
