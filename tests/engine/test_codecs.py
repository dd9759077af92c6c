"""Wire codecs: the shared ``WireContext``, the exact codec, and a lossy codec whose decode
information travels inside the wire rows, decoded on the receiving rank by ``HaloExchange``.

One gloo job of 3 processes covers the exchange: ``extend`` (post channel), ``reduce`` and
``to_slots`` (pre channel), exact and through the toy codec, with their gradients.
"""
import dataclasses

import pytest
import torch

from lightning_fullgraph.engine import (Codec, ExchangePolicy, HaloExchange, IdentityCodec,
                                        Transport, WireContext)
from lightning_fullgraph.testing import run_distributed

F_IN = 6
SEED = 7
STEP = 3


class ScaledInt8(Codec):
    r"""A toy lossy codec: per row, a float32 scale (4 bytes) then ``F`` int8 values,
    stochastically rounded with the sender's :meth:`WireContext.generator`.

    :meth:`decode` reads everything from the wire rows (and the row width and dtype from
    the context both ends share); the sender's draws and scales never reach it.
    """

    lossless = False

    def __init__(self):
        self.decoded = []  # (key, direction, step, rank) of every decode, for the test

    @staticmethod
    def scales(rows):
        return (rows.abs().amax(1, keepdim=True).float() / 127).clamp_min(1e-30)

    def encode(self, rows, ctx):
        scale = self.scales(rows)
        u = torch.rand(rows.shape, generator=ctx.generator(), dtype=torch.float32)
        q = torch.floor(rows.float() / scale + u).clamp(-127, 127).to(torch.int8)
        return torch.cat([scale.view(torch.uint8), q.view(torch.uint8)], 1)

    def decode(self, wire, ctx):
        assert wire.dtype == torch.uint8 and wire.size(1) == 4 + ctx.num_features, wire.shape
        self.decoded.append((ctx.key, ctx.direction, ctx.step, ctx.rank))
        # A copy: the bytes of a row slice need not be aligned for float32.
        scale = wire[:, :4].clone(memory_format=torch.contiguous_format).view(torch.float32)
        q = wire[:, 4:].view(torch.int8)
        return (q.float() * scale).to(ctx.dtype)


# -- the shared context -----------------------------------------------------------------------

CTX = WireContext("conv1.propagate0.x", "forward", step=4, rank=1, num_features=8,
                  dtype=torch.float32, seed=11)


def _draws(ctx, n=16):
    return torch.rand(n, generator=ctx.generator())


def test_generator_is_reproducible():
    first = _draws(CTX)
    assert torch.equal(first, _draws(CTX))  # asked again: the same draws
    assert torch.equal(first, _draws(dataclasses.replace(CTX)))  # an equal context
    g = CTX.generator()
    assert g.device == torch.device("cpu")
    # The same fresh generator each time, not one that advances.
    assert torch.equal(torch.rand(4, generator=CTX.generator()),
                       torch.rand(4, generator=CTX.generator()))


@pytest.mark.parametrize("field, value", [("seed", 12), ("rank", 0), ("step", 5),
                                          ("key", "conv1.propagate0.x.pre"),
                                          ("direction", "backward")])
def test_generator_changes_with_every_input(field, value):
    other = dataclasses.replace(CTX, **{field: value})
    assert not torch.equal(_draws(CTX), _draws(other))


def test_generator_draws_are_fixed_across_processes_and_versions():
    # blake2b of the fields, not Python's salted hash(): every process draws the same.
    import hashlib
    text = b"11|4|conv1.propagate0.x|forward|1"
    seed = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & (2**63 - 1)
    assert torch.equal(_draws(CTX), torch.rand(16, generator=torch.Generator().manual_seed(seed)))


def test_context_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CTX.step = 5


# -- codecs on one process ------------------------------------------------------------------

def test_identity_codec_round_trips_and_reports_wire_bytes():
    codec = IdentityCodec()
    assert codec.lossless
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        rows = torch.randn(5, 8).to(dtype)
        wire = codec.encode(rows, dataclasses.replace(CTX, dtype=dtype))
        assert wire is rows  # nothing copied
        back = codec.decode(wire, dataclasses.replace(CTX, dtype=dtype))
        assert back.dtype == dtype and torch.equal(back, rows)
    assert codec.wire_bytes(10, 16, torch.float32) == 640
    assert codec.wire_bytes(10, 16, torch.bfloat16) == 320
    assert codec.wire_bytes(0, 16, torch.float64) == 0
    # The base class's probe gives the same answer for the identity.
    assert Codec.wire_bytes(codec, 10, 16, torch.float32) == 640


def test_base_codec_is_abstract():
    codec = Codec()
    assert codec.lossless
    with pytest.raises(NotImplementedError):
        codec.encode(torch.zeros(1, 2), CTX)
    with pytest.raises(NotImplementedError):
        codec.decode(torch.zeros(1, 2), CTX)


def test_toy_codec_rows_are_self_describing():
    codec = ScaledInt8()
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(12, 8, generator=g) * torch.logspace(-3, 3, 12).unsqueeze(1)
    wire = codec.encode(rows, CTX)
    assert wire.shape == (12, 4 + 8) and wire.dtype == torch.uint8
    assert codec.wire_bytes(100, 8, torch.float32) == 100 * 12  # the base class's probe
    back = codec.decode(wire, CTX)
    # Within one quantization step of each row's own scale.
    step = ScaledInt8.scales(rows)
    assert bool(((back - rows).abs() <= step * (1 + 1e-6)).all())
    # Any subset of wire rows, in any order, decodes to the same rows: nothing positional.
    perm = torch.randperm(12, generator=g)[:7]
    assert torch.equal(codec.decode(wire[perm], CTX), back[perm])
    # Encoding is reproducible from the context (the test below relies on it).
    assert torch.equal(codec.encode(rows, CTX), wire)
    assert not torch.equal(codec.encode(rows, dataclasses.replace(CTX, step=5)), wire)


# -- through HaloExchange on 3 gloo processes --------------------------------------------------

def _partitions(world_size):
    from lightning_fullgraph.partition import build_local_partitions, metis_partition

    from .models import skewed_graph
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    return data.num_nodes, build_local_partitions(data, parts)


def _block(counts, dst):
    start = int(counts[:dst].sum())
    return slice(start, start + int(counts[dst]))


def _exchange_job(rank, world_size):
    N, parts = _partitions(world_size)
    part = parts[rank]
    own = part.owned_ids
    post = {r: p.plan("post") for r, p in enumerate(parts)}
    pre = {r: p.plan("pre") for r, p in enumerate(parts)}
    g = torch.Generator().manual_seed(1)
    X = torch.randn(N, F_IN, generator=g) * torch.logspace(-2, 2, N).unsqueeze(1)
    W = torch.randn(N, F_IN, generator=g)
    out = dict(num_halo=post[rank].num_halo, num_slots=pre[rank].num_pre_slots)

    # 1. Exact extend (float64) and its backward.
    ex = HaloExchange(post[rank], Transport(), seed=SEED)
    x = X.double()[own].requires_grad_()
    ext = ex.extend(x, key="exact")
    out["extend_exact"] = torch.equal(ext[:len(own)], x.detach()) and torch.equal(
        ext[len(own):].detach(), X.double()[post[rank].halo_ids])
    w = {r: torch.randn(parts[r].num_owned + post[r].num_halo, F_IN,
                        generator=torch.Generator().manual_seed(100 + r), dtype=torch.float64)
         for r in range(world_size)}
    (ext * w[rank]).sum().backward()
    G = torch.zeros(N, F_IN, dtype=torch.float64)
    for r in range(world_size):
        G.index_add_(0, torch.cat([parts[r].owned_ids, post[r].halo_ids]), w[r])
    out["extend_grad_err"] = float((x.grad - G[own]).abs().max())

    # 2. bf16 rows through the exchange: bit for bit.
    xb = X.bfloat16()
    extb = ex.extend(xb[own], key="bf16")
    out["extend_bf16"] = extb.dtype == torch.bfloat16 and torch.equal(
        extb[len(own):].view(torch.int16), xb[post[rank].halo_ids].view(torch.int16))

    # 3. The toy codec forward, exact backward (direction-specific policy).
    toy = ScaledInt8()
    policy = ExchangePolicy(points={"lossy*": ExchangePolicy(forward=toy)})
    lx = HaloExchange(post[rank], Transport(), policy, seed=SEED)
    lx.step = STEP
    x = X[own].clone().requires_grad_()
    ext = lx.extend(x, key="lossy.x")
    # What every sender s encoded for this rank, recomputed from the shared context.
    expect = []
    for s in range(world_size):
        rows = X[parts[s].owned_ids][post[s].post.send_index]
        ctx = WireContext("lossy.x", "forward", STEP, s, F_IN, torch.float32, SEED)
        wire = ScaledInt8().encode(rows, ctx)[_block(post[s].post.send_counts, rank)]
        expect.append(ScaledInt8().decode(wire, ctx))
    expect = torch.cat(expect)
    halo = ext[len(own):].detach()
    out["lossy_exact_decode"] = torch.equal(halo, expect)
    true = X[post[rank].halo_ids]
    out["lossy_within_step"] = bool(
        ((halo - true).abs() <= ScaledInt8.scales(true) * (1 + 1e-6)).all())
    out["lossy_differs"] = post[rank].num_halo == 0 or not torch.equal(halo, true)
    wf = {r: w[r].float() for r in w}
    (ext * wf[rank]).sum().backward()
    out["lossy_grad_err"] = float((x.grad - G.float()[own]).abs().max())
    out["decoded"] = sorted(set(toy.decoded))

    # 4. Exact reduce and to_slots on the pre channel, and reduce's backward.
    px = HaloExchange(pre[rank], Transport(), seed=SEED)
    vals = {r: ((r + 1) * 1000 + pre[r].pre_slot_ids.double()).unsqueeze(1).expand(-1, F_IN)
            for r in range(world_size)}
    agg = torch.cat([X.double()[own], vals[rank]]).requires_grad_()
    red = px.reduce(agg, key="agg.pre")
    S = X.double().clone()
    for r in range(world_size):
        S.index_add_(0, pre[r].pre_slot_ids, vals[r])
    out["reduce_err"] = float((red.detach() - S[own]).abs().max())
    out["reduce_shape"] = list(red.shape)
    (red * W.double()[own]).sum().backward()
    out["reduce_grad_own"] = torch.equal(agg.grad[:len(own)], W.double()[own])
    out["reduce_grad_slots"] = torch.equal(agg.grad[len(own):], W.double()[pre[rank].pre_slot_ids])
    slots = px.to_slots(W[own], key="deg")
    out["to_slots"] = torch.equal(slots, W[pre[rank].pre_slot_ids])
    # in_place=True adds into the aggregation's own storage (no copy of the owned rows) with
    # the same result and gradients; the default leaves its input alone.
    base = torch.cat([X.double()[own], vals[rank]]).requires_grad_()
    fresh = base * 1.0
    kept = fresh.detach().clone()
    copied = px.reduce(fresh, key="agg.pre")
    out["reduce_keeps_input"] = torch.equal(fresh.detach(), kept)
    added = px.reduce(fresh, key="agg.pre", in_place=True)
    out["reduce_in_place_shares"] = (
        added.untyped_storage().data_ptr() == fresh.untyped_storage().data_ptr())
    out["reduce_in_place_equal"] = torch.equal(added.detach(), copied.detach())
    (added * W.double()[own]).sum().backward()
    out["reduce_in_place_grad"] = torch.equal(base.grad, agg.grad)
    leaf = torch.cat([X.double()[own], vals[rank]]).requires_grad_()
    leaf_kept = leaf.detach().clone()
    px.reduce(leaf, key="agg.pre", in_place=True)
    out["reduce_in_place_spares_leaf"] = torch.equal(leaf.detach(), leaf_kept)

    # 5. reduce through the toy codec: decoded partial aggregates added into their owners.
    ptoy = HaloExchange(pre[rank], Transport(), ExchangePolicy(forward=ScaledInt8()), seed=SEED)
    ptoy.step = STEP
    fvals = {r: torch.randn(pre[r].num_pre_slots, F_IN,
                            generator=torch.Generator().manual_seed(200 + r))
             for r in range(world_size)}
    red = ptoy.reduce(torch.cat([X[own], fvals[rank]]), key="agg.pre")
    S = X.clone()
    for s in range(world_size):
        ctx = WireContext("agg.pre", "forward", STEP, s, F_IN, torch.float32, SEED)
        S.index_add_(0, pre[s].pre_slot_ids, ScaledInt8().decode(
            ScaledInt8().encode(fvals[s], ctx), ctx))
    out["lossy_reduce_err"] = float((red - S[own]).abs().max())

    # 6. What was counted.
    c = lx.stats.counters
    out["lossy_bytes"] = (c[("lossy.x", "forward")].bytes_sent,
                          c[("lossy.x", "backward")].bytes_sent, post[rank].post.num_send)
    out["draws"] = _draws(CTX).tolist()  # every process draws the same
    return out


@pytest.fixture(scope="module")
def job():
    return run_distributed(_exchange_job, 3, timeout_s=90)


@pytest.mark.multiprocess
def test_exact_channels(job):
    assert sum(r["num_halo"] for r in job) > 0 and sum(r["num_slots"] for r in job) > 0
    for r in job:
        assert r["extend_exact"] and r["extend_bf16"]
        assert r["extend_grad_err"] < 1e-12
        assert r["reduce_err"] < 1e-9
        assert r["reduce_grad_own"] and r["reduce_grad_slots"] and r["to_slots"]
        assert r["reduce_keeps_input"] and r["reduce_in_place_equal"]
        assert r["reduce_in_place_grad"] and r["reduce_in_place_spares_leaf"]
        assert r["reduce_in_place_shares"]


@pytest.mark.multiprocess
def test_lossy_codec_decodes_from_the_wire_on_the_receiving_rank(job):
    for rank, r in enumerate(job):
        assert r["lossy_exact_decode"], rank  # bit for bit what the sender encoded
        assert r["lossy_within_step"] and r["lossy_differs"]
        assert r["lossy_grad_err"] < 1e-5  # backward has no codec: exact
        # Decoded by this rank with its own context (its rank, not a sender's): forward
        # rows of that point only, the backward gradients being exact.
        assert r["decoded"] == [("lossy.x", "forward", STEP, rank)]
        assert r["lossy_reduce_err"] < 1e-5
        sent_fwd, sent_bwd, rows = r["lossy_bytes"]
        assert sent_fwd == rows * (4 + F_IN)  # wire rows: scale + int8 values
        assert sent_bwd == r["num_halo"] * F_IN * 4  # float32 gradients
        assert r["draws"] == job[0]["draws"] == _draws(CTX).tolist()
