"""``Transport``: one all-to-all of wire rows (or bytes), with exact accounting.

One gloo job of 4 processes covers the multi-process cases (a process start costs seconds):
the inter-host counters on the world group, everything else on a group of ranks 0..2
(P=3, so splits can be unequal and some pairs exchange nothing).
"""
import time
from datetime import timedelta

import pytest
import torch

from lightning_fullgraph.engine import CommStats, PendingExchange, Transport
from lightning_fullgraph.testing import run_distributed

# ROWS[s][d]: rows rank s sends to rank d (P=3): unequal, with empty pairs and self-sends.
ROWS = [[1, 0, 3],
        [2, 2, 0],
        [0, 4, 1]]
# BYTES[s][d]: bytes rank s sends to rank d in the byte-unit exchange (variable-width rows).
BYTES = [[0, 7, 13],
         [5, 0, 1],
         [9, 3, 0]]
WIDTH = 3


def _rows(src, dst, n, dtype=torch.float32):
    r"""The rows :obj:`src` sends :obj:`dst`: each names its source, target and index."""
    i = torch.arange(n, dtype=torch.float64)
    return torch.stack([torch.full_like(i, src), torch.full_like(i, dst), i], 1).to(dtype)


def _bytes(src, dst, n):
    return ((torch.arange(n) * 7 + src * 50 + dst * 13) % 256).to(torch.uint8)


def _half_rows(src, dst, n, dtype):
    r"""Half-precision rows with awkward bit patterns (signed zero, inf, NaN payload,
    subnormals), as int16 bits."""
    g = torch.Generator().manual_seed(100 * src + dst)
    bits = torch.randint(-2**15, 2**15, (n, 5), generator=g, dtype=torch.int32).to(torch.int16)
    inf, nan = (0x7C00, 0x7E01) if dtype == torch.float16 else (0x7F80, 0x7F81)
    special = torch.tensor([-0x8000, inf, nan, 0x0001, -1], dtype=torch.int16)  # -0, inf,
    # a NaN with a payload, the smallest subnormal, a negative NaN
    if n:
        bits[0] = special
    return bits


def _counter(stats, key, direction="forward"):
    c = stats.counters[(key, direction)]
    return dict(calls=c.calls, bytes_sent=c.bytes_sent, bytes_received=c.bytes_received,
                rows_sent=c.rows_sent, rows_received=c.rows_received,
                inter_sent=c.inter_host_bytes_sent, inter_received=c.inter_host_bytes_received,
                seconds=c.seconds)


def _p3(rank, group):
    r"""The P=3 battery of rank :obj:`rank` of :obj:`group`; returns plain values."""
    import torch.distributed as dist
    t = Transport(group, timeout=timedelta(seconds=60))
    assert (t.world_size, t.rank, t.backend) == (3, rank, "gloo")
    out = {}
    send_counts = ROWS[rank]
    recv_counts = [ROWS[s][rank] for s in range(3)]
    send = torch.cat([_rows(rank, d, ROWS[rank][d]) for d in range(3)])

    got = t.exchange(send, send_counts, recv_counts, key="rows", direction="forward")
    out["rows"] = got.tolist()
    out["rows_dtype"] = str(got.dtype)
    out["rows_counter"] = _counter(t.stats, "rows")

    # Asynchronous: a PendingExchange, counted once however often it is waited for.
    pending = t.exchange(send, send_counts, recv_counts, key="async", direction="backward",
                         async_op=True)
    out["async_type"] = type(pending).__name__
    first = pending.wait()
    out["async_equal"] = torch.equal(first, got)
    out["async_same_object"] = pending.wait() is first
    out["async_completed"] = pending.is_completed()
    out["async_counter"] = _counter(t.stats, "async", "backward")

    # Several exchanges in flight at once, waited for in reverse order.
    many = [t.exchange(send * (k + 1), send_counts, recv_counts, key="many", direction="forward",
                       async_op=True) for k in range(3)]
    out["many_equal"] = [torch.equal(p.wait(), got * (k + 1))
                         for k, p in reversed(list(enumerate(many)))]

    # Byte unit: variable-width rows, flat uint8; the row counters come from `rows`.
    bsend = torch.cat([_bytes(rank, d, BYTES[rank][d]) for d in range(3)])
    brecv_counts = [BYTES[s][rank] for s in range(3)]
    received = t.exchange(bsend, BYTES[rank], brecv_counts, key="bytes", direction="forward",
                          unit="bytes", rows=(2, 5))
    out["bytes"] = received.tolist()
    out["bytes_dtype"] = str(received.dtype)
    out["bytes_counter"] = _counter(t.stats, "bytes")
    apending = t.exchange(bsend, BYTES[rank], brecv_counts, key="bytes_async",
                          direction="forward", unit="bytes", async_op=True)
    out["bytes_async_equal"] = torch.equal(apending.wait(), received)

    # Half precision travels as int16 on gloo, bit for bit, and comes back in its dtype.
    for dtype in (torch.bfloat16, torch.float16):
        name = str(dtype).split(".")[1]
        hsend = torch.cat([_half_rows(rank, d, ROWS[rank][d], dtype) for d in range(3)]).view(dtype)
        hgot = t.exchange(hsend, send_counts, recv_counts, key=name, direction="forward")
        out[name] = dict(dtype=str(hgot.dtype), bits=hgot.view(torch.int16).tolist(),
                         counter=_counter(t.stats, name))
        hasync = t.exchange(hsend, send_counts, recv_counts, key=name + "_async",
                            direction="forward", async_op=True).wait()
        out[name]["async_equal"] = hasync.dtype == dtype and torch.equal(
            hasync.view(torch.int16), hgot.view(torch.int16))
        # A 1-D tensor: one value per row.
        one = t.exchange(hsend[:, 1].contiguous(), send_counts, recv_counts, key=name + "_1d",
                         direction="forward")
        out[name]["one_d"] = dict(shape=list(one.shape), dtype=str(one.dtype), equal=torch.equal(
            one.view(torch.int16), hgot[:, 1].contiguous().view(torch.int16)),
            bytes_sent=t.stats.counters[(name + "_1d", "forward")].bytes_sent)

    # out=: received into the tail of a larger buffer (no second buffer), also for a dtype
    # the backend carries as bytes (bfloat16 over gloo: then copied there), refused when
    # it does not fit.
    n_recv = sum(recv_counts)
    buf = torch.full((2 + n_recv, WIDTH), -1.0)
    into = t.exchange(send, send_counts, recv_counts, key="out", direction="forward",
                      out=buf[2:])
    hbuf = torch.zeros(n_recv, WIDTH, dtype=torch.bfloat16)
    hinto = t.exchange(send.to(torch.bfloat16), send_counts, recv_counts, key="out_bf16",
                       direction="forward", out=hbuf)
    out["into"] = dict(same=into.data_ptr() == buf[2:].data_ptr(), equal=torch.equal(into, got),
                       head_kept=bool((buf[:2] == -1).all()), half_same=hinto is hbuf,
                       half_equal=torch.equal(hbuf, got.to(torch.bfloat16)))
    try:
        t.exchange(send, send_counts, recv_counts, key="out_bad", direction="forward",
                   out=torch.empty(n_recv + 1, WIDTH))
        out["into"]["bad"] = None
    except ValueError as e:
        out["into"]["bad"] = str(e)

    # Trailing dimensions: one row is everything after the first dimension.
    wide = send.reshape(-1, 1, WIDTH).expand(-1, 2, WIDTH).contiguous()
    wgot = t.exchange(wide, send_counts, recv_counts, key="wide", direction="forward")
    out["wide"] = dict(shape=list(wgot.shape), equal=torch.equal(wgot[:, 1], got),
                       counter=_counter(t.stats, "wide"))

    # Invalid inputs raise on every rank before any collective (nothing is left waiting).
    errors = {}
    for name, kwargs in {
        "num_counts": dict(send=send, send_counts=send_counts[:2], recv_counts=recv_counts),
        "num_recv_counts": dict(send=send, send_counts=send_counts,
                                recv_counts=recv_counts + [0]),
        "sum": dict(send=send[1:], send_counts=send_counts, recv_counts=recv_counts),
        "bytes_dtype": dict(send=send, send_counts=send_counts, recv_counts=recv_counts,
                            unit="bytes"),
        "bytes_2d": dict(send=bsend.view(-1, 1), send_counts=BYTES[rank],
                         recv_counts=brecv_counts, unit="bytes"),
        "unit": dict(send=send, send_counts=send_counts, recv_counts=recv_counts, unit="kb"),
    }.items():
        try:
            t.exchange(key="bad", direction="forward", **kwargs)
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    out["errors"] = errors
    out["bad_recorded"] = ("bad", "forward") in t.stats.counters
    # The group still works after the refused calls.
    out["after_errors"] = torch.equal(
        t.exchange(send, send_counts, recv_counts, key="rows", direction="forward"), got)

    # A background group (the pipeline's) of the subgroup's ranks only: rank 3 of the world
    # takes no part in creating it.  A synchronous exchange on the main group runs while the
    # background transfer is in flight, and both deliver.
    bg = Transport(group, timeout=timedelta(seconds=60), background=True)
    pending = bg.exchange(send, send_counts, recv_counts, key="bg", direction="forward",
                          async_op=True, background=True)
    now = bg.exchange(send, send_counts, recv_counts, key="rows", direction="forward")
    out["background"] = dict(
        group=(bg.background_group is not None and bg.background_group is not group
               and sorted(dist.get_process_group_ranks(bg.background_group)) == [0, 1, 2]),
        equal=torch.equal(pending.wait(), got) and torch.equal(now, got),
        counted=_counter(bg.stats, "bg")["bytes_sent"] == out["rows_counter"]["bytes_sent"],
        # Waited for as a background transfer (the planner leaves it out of the step's link).
        waits=[bg.stats.counters[("bg", "forward")].waits,
               bg.stats.counters[("bg", "forward")].background_waits])
    # close() releases the background group; background transfers then run on the main
    # group, and still deliver.  A subgroup's sibling is kept for the subgroup's next
    # transport, not destroyed: torch would name a new group of the same ranks after the
    # destroyed one, and its rendezvous would read the old group's addresses in the store.
    released = bg.background_group
    bg.close()
    after = bg.exchange(send, send_counts, recv_counts, key="bg", direction="forward",
                        async_op=True, background=True).wait()
    bg.close()  # a second close does nothing
    out["background"].update(closed=bg.background_group is None and _alive(released),
                             after_close=torch.equal(after, got))
    # The queue-wait calibration borrows it and gives it back; the next transport reuses
    # it (and makes a new group for what it needs beyond it, unharmed by the reuse); a
    # transport with another collective timeout makes its own.
    from lightning_fullgraph.planner.calibrate import calibrate_queue_wait
    wait = calibrate_queue_wait(group, beta=1e8, repeats=1, fill_s=0.01, timed=1,
                                max_bytes=1 << 16, timeout=timedelta(seconds=60))
    dx = Transport(group, timeout=timedelta(seconds=60), background=True, duplex=True)
    other = Transport(group, timeout=timedelta(seconds=61), background=True)
    out["background"].update(
        calibrated=wait >= 0.0, reused=dx.background_group is released,
        others=(other.background_group not in (released, dx.duplex_group)
                and torch.equal(other.exchange(send, send_counts, recv_counts, key="o",
                                               direction="forward", async_op=True,
                                               background=True).wait(), got)))
    other.close()

    # Duplex: each exchange's two directions at once on two groups of the subgroup's ranks
    # (rank 3 of the world takes no part), the same bytes into the same places as one
    # all-to-all, in every form above; a background transfer stays on its own group.
    pend = [dx.exchange(send * (k + 1), send_counts, recv_counts, key="dx", direction="forward",
                        async_op=True) for k in range(3)]
    bg_pending = dx.exchange(send, send_counts, recv_counts, key="dx_bg", direction="forward",
                             async_op=True, background=True)
    dbuf = torch.full((2 + n_recv, WIDTH), -1.0)
    hsend = send.to(torch.bfloat16)
    out["duplex"] = dict(
        group=(dx.duplex_group is not None and dx.duplex_group not in (group,
                                                                       dx.background_group)
               and sorted(dist.get_process_group_ranks(dx.duplex_group)) == [0, 1, 2]),
        rows=torch.equal(dx.exchange(send, send_counts, recv_counts, key="dx",
                                     direction="forward"), got),
        many=[torch.equal(p.wait(), got * (k + 1)) for k, p in reversed(list(enumerate(pend)))],
        bytes=torch.equal(dx.exchange(bsend, BYTES[rank], brecv_counts, key="dx_bytes",
                                      direction="forward", unit="bytes"), received),
        bytes_async=torch.equal(dx.exchange(bsend, BYTES[rank], brecv_counts, key="dx_bytes",
                                            direction="forward", unit="bytes",
                                            async_op=True).wait(), received),
        into=(dx.exchange(send, send_counts, recv_counts, key="dx_out", direction="forward",
                          out=dbuf[2:]).data_ptr() == dbuf[2:].data_ptr()
              and torch.equal(dbuf[2:], got) and bool((dbuf[:2] == -1).all())),
        half=torch.equal(dx.exchange(hsend, send_counts, recv_counts, key="dx_bf16",
                                     direction="forward"), got.to(torch.bfloat16)),
        one_d=torch.equal(dx.exchange(send[:, 2].contiguous(), send_counts, recv_counts,
                                      key="dx_1d", direction="forward"), got[:, 2]),
        background=torch.equal(bg_pending.wait(), got),
        counted=_counter(dx.stats, "dx")["bytes_sent"] == 4 * out["rows_counter"]["bytes_sent"])
    released = dx.duplex_group
    dx.close()
    out["duplex"]["closed"] = dx.duplex_group is None and _alive(released)
    plain = Transport(group, timeout=timedelta(seconds=60))
    out["duplex"]["off_by_default"] = plain.duplex_group is None
    return out


def _alive(group):
    import torch.distributed as dist
    try:
        dist.get_backend(group)
    except ValueError:  # "Invalid process group specified": destroyed
        return False
    return True


def _whole_world_siblings():
    r"""A transport of the whole world destroys its groups when closed (torch names a new
    group of all ranks by a counter that only grows: nothing to keep them for)."""
    t = Transport(background=True, duplex=True)
    made = (t.background_group, t.duplex_group)
    t.close()
    return dict(made=all(g is not None for g in made), destroyed=[not _alive(g) for g in made])


def _inter_host(rank, world_size):
    r"""World of 4 as 2 hosts x 2 ranks: every pair exchanges ``rank + peer + 1`` rows."""
    send_counts = [rank + d + 1 for d in range(world_size)]
    send = torch.cat([_rows(rank, d, send_counts[d]) for d in range(world_size)])
    out = {}
    for per in (2, 1, None):
        t = Transport(ranks_per_host=per)
        got = t.exchange(send, send_counts, send_counts, key="x", direction="forward")
        out[str(per)] = dict(counter=_counter(t.stats, "x"), snapshot=t.stats.snapshot(),
                             ok=torch.equal(got, torch.cat(
                                 [_rows(s, rank, rank + s + 1) for s in range(world_size)])))
    return out


def _job(rank, world_size):
    import torch.distributed as dist
    group = dist.new_group(ranks=[0, 1, 2], timeout=timedelta(seconds=60))
    result = dict(inter=_inter_host(rank, world_size), world=_whole_world_siblings())
    result["p3"] = _p3(rank, group) if rank < 3 else None
    dist.barrier()
    return result


@pytest.fixture(scope="module")
def job():
    return run_distributed(_job, 4, timeout_s=90)


def _expected_rows(rank):
    return torch.cat([_rows(s, rank, ROWS[s][rank]) for s in range(3)]).tolist()


@pytest.mark.multiprocess
def test_unequal_row_splits_arrive_in_source_order(job):
    for rank in range(3):
        r = job[rank]["p3"]
        assert r["rows"] == _expected_rows(rank)  # exactly what peers sent, by source rank
        assert r["rows_dtype"] == "torch.float32"
        n_sent, n_recv = sum(ROWS[rank]), sum(ROWS[s][rank] for s in range(3))
        c = r["rows_counter"]
        assert (c["calls"], c["rows_sent"], c["rows_received"]) == (1, n_sent, n_recv)
        row_bytes = WIDTH * 4
        assert (c["bytes_sent"], c["bytes_received"]) == (n_sent * row_bytes, n_recv * row_bytes)
        assert c["inter_sent"] == c["inter_received"] == 0  # one host by default
        assert c["seconds"] >= 0
        # Trailing dimensions are part of the row.
        w = r["wide"]
        assert w["shape"] == [n_recv, 2, WIDTH] and w["equal"]
        assert w["counter"]["bytes_sent"] == n_sent * 2 * row_bytes
        assert w["counter"]["rows_sent"] == n_sent


@pytest.mark.multiprocess
def test_async_exchange_equals_sync(job):
    for rank in range(3):
        r = job[rank]["p3"]
        assert r["async_type"] == "PendingExchange"
        assert r["async_equal"] and r["async_same_object"] and r["async_completed"]
        assert r["many_equal"] == [True, True, True]
        sync, asyn = r["rows_counter"], r["async_counter"]
        assert asyn["calls"] == 1  # waited twice, counted once
        for k in ("bytes_sent", "bytes_received", "rows_sent", "rows_received"):
            assert asyn[k] == sync[k]


@pytest.mark.multiprocess
def test_background_transfers_run_on_a_group_of_their_own(job):
    for rank in range(3):
        assert job[rank]["p3"]["background"] == dict(group=True, equal=True, counted=True,
                                                     waits=[1, 1], closed=True,
                                                     after_close=True, calibrated=True,
                                                     reused=True, others=True)


@pytest.mark.multiprocess
def test_a_transport_of_the_whole_world_destroys_its_groups_when_closed(job):
    for rank in range(4):
        assert job[rank]["world"] == dict(made=True, destroyed=[True, True])


@pytest.mark.multiprocess
def test_duplex_sends_both_directions_at_once_and_delivers_the_same(job):
    for rank in range(3):
        assert job[rank]["p3"]["duplex"] == dict(
            group=True, rows=True, many=[True, True, True], bytes=True, bytes_async=True,
            into=True, half=True, one_d=True, background=True, counted=True, closed=True,
            off_by_default=True)


def test_duplex_needs_gloo_and_peers():
    # One process: nothing to split, no group created (and no process group needed).
    t = Transport(duplex=True)
    assert t.duplex_group is None
    send = torch.arange(6.0).view(3, 2)
    assert torch.equal(t.exchange(send, [3], [3], key="x", direction="forward"), send)


@pytest.mark.multiprocess
def test_rows_are_received_into_a_given_buffer(job):
    for rank in range(3):
        r = job[rank]["p3"]["into"]
        assert r["same"] and r["equal"] and r["head_kept"], r
        assert r["half_same"] and r["half_equal"], r
        assert "out must be a contiguous" in r["bad"], r


@pytest.mark.multiprocess
def test_byte_unit_with_variable_sizes(job):
    for rank in range(3):
        r = job[rank]["p3"]
        expect = torch.cat([_bytes(s, rank, BYTES[s][rank]) for s in range(3)]).tolist()
        assert r["bytes"] == expect and r["bytes_dtype"] == "torch.uint8"
        c = r["bytes_counter"]
        assert c["bytes_sent"] == sum(BYTES[rank])
        assert c["bytes_received"] == sum(BYTES[s][rank] for s in range(3))
        assert (c["rows_sent"], c["rows_received"]) == (2, 5)  # as given by `rows`
        assert r["bytes_async_equal"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_half_precision_is_bit_exact_over_gloo(job, name):
    dtype = getattr(torch, name)
    for rank in range(3):
        h = job[rank]["p3"][name]
        assert h["dtype"] == f"torch.{name}"
        expect = torch.cat([_half_rows(s, rank, ROWS[s][rank], dtype) for s in range(3)])
        assert h["bits"] == expect.tolist()
        n_sent = sum(ROWS[rank])
        assert h["counter"]["bytes_sent"] == n_sent * 5 * 2  # rows x row bytes
        assert h["counter"]["rows_sent"] == n_sent
        assert h["async_equal"]
        n_recv = sum(ROWS[s][rank] for s in range(3))
        assert h["one_d"] == dict(shape=[n_recv], dtype=f"torch.{name}", equal=True,
                                  bytes_sent=2 * n_sent)


@pytest.mark.multiprocess
def test_invalid_inputs_give_clear_errors_on_every_rank(job):
    for rank in range(3):
        r = job[rank]["p3"]
        e = r["errors"]
        assert "2 send and 3 receive counts for a group of 3" in e["num_counts"]
        assert "3 send and 4 receive counts for a group of 3" in e["num_recv_counts"]
        n = sum(ROWS[rank])
        assert f"send counts add up to {n} but {n - 1} rows are given" in e["sum"]
        assert "unit='bytes' needs a flat uint8 tensor" in e["bytes_dtype"]
        assert "unit='bytes' needs a flat uint8 tensor" in e["bytes_2d"]
        assert "unit must be 'rows' or 'bytes', got 'kb'" in e["unit"]
        assert all("exchange 'bad'" in e[k] for k in ("num_counts", "sum"))
        assert not r["bad_recorded"]  # refused calls count nothing
        assert r["after_errors"]


@pytest.mark.multiprocess
def test_inter_host_counters(job):
    # Ranks 0, 1 on host 0 and 2, 3 on host 1 (host-major, as Lightning numbers nodes).
    row_bytes = WIDTH * 4
    totals = {"sent": 0, "received": 0}
    for rank in range(4):
        r = job[rank]["inter"]
        for per in ("2", "1", "None"):
            assert r[per]["ok"]
        c = r["2"]["counter"]
        far = [d for d in range(4) if d // 2 != rank // 2]
        assert c["inter_sent"] == row_bytes * sum(rank + d + 1 for d in far)
        assert c["inter_received"] == row_bytes * sum(d + rank + 1 for d in far)
        assert 0 < c["inter_sent"] < c["bytes_sent"]
        assert c["bytes_sent"] == row_bytes * sum(rank + d + 1 for d in range(4))
        snap = r["2"]["snapshot"]
        assert snap["comm/inter_host_bytes_sent"] == c["inter_sent"]
        assert snap["comm/inter_host_bytes_received"] == c["inter_received"]
        totals["sent"] += c["inter_sent"]
        totals["received"] += c["inter_received"]
        # One rank per host: everything but the self-send crosses hosts.
        one = r["1"]["counter"]
        assert one["inter_sent"] == one["bytes_sent"] - row_bytes * (2 * rank + 1)
        # Default: one host.
        assert r["None"]["counter"]["inter_sent"] == r["None"]["counter"]["inter_received"] == 0
    assert totals["sent"] == totals["received"]


# -- one process, no process group ---------------------------------------------------------

def test_single_process_without_a_process_group():
    import torch.distributed as dist
    assert not dist.is_initialized()
    stats = CommStats()
    t = Transport(stats=stats)
    assert (t.world_size, t.rank, t.backend, t.group) == (1, 0, "none", None)
    assert t.stats is stats
    x = torch.randn(4, 3)
    got = t.exchange(x, [4], [4], key="k", direction="forward")
    assert torch.equal(got, x) and got.data_ptr() != x.data_ptr()  # a copy, not the input
    pending = t.exchange(x, [4], [4], key="k", direction="backward", async_op=True)
    assert isinstance(pending, PendingExchange) and pending.is_completed()
    assert torch.equal(pending.wait(), x)
    for dtype in (torch.bfloat16, torch.float16):
        h = x.to(dtype)
        back = t.exchange(h, [4], [4], key="h", direction="forward")
        assert back.dtype == dtype and torch.equal(back.view(torch.int16), h.view(torch.int16))
    b = torch.arange(10, dtype=torch.uint8)
    assert torch.equal(t.exchange(b, [10], [10], key="b", direction="forward", unit="bytes",
                                  rows=(3, 3)), b)
    empty = t.exchange(torch.empty(0, 3), [0], [0], key="e", direction="forward")
    assert empty.shape == (0, 3)
    c = stats.counters[("k", "forward")]
    assert (c.calls, c.rows_sent, c.rows_received, c.bytes_sent, c.bytes_received) == \
        (1, 4, 4, 48, 48)
    assert c.inter_host_bytes_sent == 0
    assert stats.counters[("k", "backward")].calls == 1
    # A synchronous exchange keeps its wall-clock start and end (the planner's span across
    # ranks); an asynchronous one none (its end is the caller's wait, not the transfer's).
    (start, end), = c.marks
    assert end - start == pytest.approx(c.seconds, abs=1e-6) and abs(start - time.time()) < 60
    assert stats.counters[("k", "backward")].marks == []
    assert stats.counters[("h", "forward")].bytes_sent == 2 * 4 * 3 * 2
    bc = stats.counters[("b", "forward")]
    assert (bc.bytes_sent, bc.rows_sent) == (10, 3)
    assert stats.total().calls == 6


def test_single_process_invalid_inputs():
    t = Transport()
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"exchange 'k': 2 send and 1 receive counts for a "
                                         r"group of 1"):
        t.exchange(x, [2, 2], [4], key="k", direction="forward")
    with pytest.raises(ValueError, match="send counts add up to 5 but 4 rows are given"):
        t.exchange(x, [5], [5], key="k", direction="forward")
    with pytest.raises(ValueError, match="needs a flat uint8 tensor"):
        t.exchange(x.flatten(), [12], [12], key="k", direction="forward", unit="bytes")
    with pytest.raises(ValueError, match="unit must be 'rows' or 'bytes'"):
        t.exchange(x, [4], [4], key="k", direction="forward", unit="row")
    with pytest.raises(ValueError, match="ranks_per_host must be positive"):
        Transport(ranks_per_host=-1)
    assert not t.stats.counters


def test_pending_exchange_finishes_once():
    calls = []
    p = PendingExchange(torch.ones(2), None, lambda t: t * 2, lambda: calls.append(1))
    assert p.is_completed()  # no work in flight
    first = p.wait()
    assert torch.equal(first, torch.full((2, ), 2.0)) and p.wait() is first
    assert calls == [1]


def test_asynchronous_exchange_counts_the_work_it_was_in_flight_for():
    # The seconds between an asynchronous exchange's start and its wait are what the caller
    # computed while the rows travelled (what overlap hides a transfer behind); a synchronous
    # exchange has none.
    import time
    stats = CommStats()
    t = Transport(stats=stats)
    x = torch.randn(4, 3)
    t.exchange(x, [4], [4], key="k", direction="forward")
    pending = t.exchange(x, [4], [4], key="k", direction="backward", async_op=True)
    time.sleep(0.05)
    pending.wait()
    pending.wait()  # counted once
    sync, a = stats.counters[("k", "forward")], stats.counters[("k", "backward")]
    assert (sync.in_flight_seconds, sync.waits) == (0.0, 0)
    assert a.waits == 1 and 0.05 <= a.in_flight_seconds < 5
    assert a.seconds < a.in_flight_seconds  # the wait itself blocked for (almost) nothing
    total = stats.total()
    assert (total.in_flight_seconds, total.waits) == (a.in_flight_seconds, 1)
