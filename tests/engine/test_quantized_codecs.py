"""The quantized and bfloat16 wire codecs: wire format and byte counts, error bounds,
unbiasedness, special rows, reproducibility, the three implementations (C++, pure PyTorch,
Triton) agreeing bit for bit, and a 2-rank halo exchange decoding from the wire alone.
"""
import dataclasses
import itertools
import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

if not torch.cuda.is_available():  # before anything imports triton (read at decoration)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from lightning_fullgraph.engine import HaloExchange, Transport  # noqa: E402
from lightning_fullgraph.engine.codecs import (BFloat16Codec, Codec, QuantizedCodec,  # noqa: E402
                                               WireContext)
from lightning_fullgraph.engine.codecs import quantize as Q  # noqa: E402
from lightning_fullgraph.testing import run_distributed  # noqa: E402

CTX = WireContext("conv1.propagate0.x", "forward", step=4, rank=1, num_features=8,
                  dtype=torch.float32, seed=11)
BITS = (1, 2, 4, 8)
ROUNDINGS = ("stochastic", "nearest")
ODD_WIDTHS = (1, 3, 5, 7, 13)
HEADERS = ("float32", "bfloat16")


def ctx_for(f, **kw):
    return dataclasses.replace(CTX, num_features=f, **kw)


def scales_of(wire):
    return Q.read_header(wire)[1]


def same_bits(a, b):
    r"""Bit-for-bit equality of float32 tensors (NaN included, -0.0 != +0.0)."""
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def mixed_rows(f, seed=0, n=40):
    r"""Rows at scales 1e-30 ... 1e30, plus every special row the format handles (the
    first 17)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=g) * torch.logspace(-30, 30, n).unsqueeze(1)
    x[0] = 0.0
    x[1] = -0.0
    x[2] = 2.5
    x[3] = -1e30
    x[4] = 1e-40  # subnormal constant
    x[5] = torch.rand(f, generator=g) * 1e-39  # range too small for 1 / S: sent as constant
    x[6, 0] = float("nan")
    x[7, -1] = float("inf")
    x[8, 0] = float("-inf")
    x[9] = torch.tensor([-3e38, 3e38]).repeat(f)[:f]  # the range overflows (F > 1): wide
    x[10, 0] = -0.0
    x[11] = torch.arange(f, dtype=torch.float32) % 4  # on the grid: exact at 2 bits
    x[12] = torch.randint(-3, 3, (f, ), generator=g).float() * 0.5  # few distinct values
    x[13] = torch.tensor([-Q.FLT_MAX, Q.FLT_MAX, 1.0]).repeat(f)[:f]  # the widest row
    x[14] = torch.tensor([-3.3999e38, 1.0, 2.0]).repeat(f)[:f]  # past a compact zero point
    # Z >= 0 near the top: Z + q S may round past the largest float32.
    x[15] = torch.linspace(1e38, Q.FLT_MAX, f) if f > 1 else Q.FLT_MAX
    x[16] = (torch.rand(f, generator=g) * 4.0 - 1.0).clamp(max=3.0) * 1e38  # wide, between
    x[16, 0] = -1e38
    x[16, -1] = 3e38
    return x


@pytest.fixture(scope="module")
def cpp_ext():
    from lightning_fullgraph.kernels import cpp, cpp_quantize
    from tests.kernels.kernel_testutils import skip_or_fail
    if cpp.disabled_by_env():  # deliberately switched off: a skip even in CI
        pytest.skip("C++ extension disabled by LIGHTNING_FULLGRAPH_NO_EXT=1")
    ext = cpp_quantize.load()
    if ext is None:  # a skip here, a failure under CI (which installs the compiler)
        skip_or_fail("C++ quantization kernels unavailable (no compiler, or the build failed; "
                     "see the RuntimeWarning)")
    return ext


@pytest.fixture(scope="module")
def triton_q():
    from tests.kernels.kernel_testutils import skip_or_fail
    try:
        import triton  # noqa: F401
    except ImportError:
        skip_or_fail("triton is not installed")
    from lightning_fullgraph.kernels import triton_quantize
    if not triton_quantize.is_available():  # CI runs it interpreted (TRITON_INTERPRET=1)
        skip_or_fail("Triton needs CUDA or TRITON_INTERPRET=1")
    return triton_quantize


# -- wire format -----------------------------------------------------------------------------

@pytest.mark.parametrize("header", HEADERS)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("f", ODD_WIDTHS + (8, 16, 128, 602))
def test_wire_bytes_are_exact(bits, f, header):
    codec = QuantizedCodec(bits, header=header)
    width = (8 if header == "float32" else 4) + math.ceil(f * bits / 8)
    wire = codec.encode(torch.randn(6, f), ctx_for(f))
    assert wire.dtype == torch.uint8 and wire.shape == (6, width)
    assert Q.wire_width(f, bits, header) == width
    assert codec.wire_bytes(100, f, torch.float32) == 100 * width
    assert codec.wire_bytes(100, f, torch.float64) == 100 * width  # independent of dtype
    assert Codec.wire_bytes(codec, 7, f, torch.float32) == 7 * width  # the base's probe agrees
    assert codec.wire_bytes(0, f, torch.float32) == 0


def test_wire_layout_header_then_codes_low_bits_first():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 2.0]])  # Z = 1, S = 1 at 2 bits: codes 0 1 2 3 1
    wire = QuantizedCodec(2, "nearest").encode(x, ctx_for(5))
    assert wire.shape == (1, 8 + 2)
    assert wire[0, :4].view(torch.float32).item() == 1.0  # zero point
    assert wire[0, 4:8].view(torch.float32).item() == 1.0  # scale
    assert wire[0, 8].item() == 0 | 1 << 2 | 2 << 4 | 3 << 6
    assert wire[0, 9].item() == 1  # the last code; the padding bits are zero
    one = QuantizedCodec(1, "nearest").encode(torch.tensor([[0., 1., 1., 0., 1., 0., 0., 0., 1.]]),
                                              ctx_for(9))
    assert one[0, 8:].tolist() == [0b00010110, 0b1]


def test_compact_header_is_two_bfloat16_then_the_codes():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 2.0]])  # bfloat16 values: the same grid as above
    wire = QuantizedCodec(2, "nearest", header="bfloat16").encode(x, ctx_for(5))
    assert wire.shape == (1, 4 + 2)
    assert wire[0, :2].view(torch.bfloat16).item() == 1.0  # zero point
    assert wire[0, 2:4].view(torch.bfloat16).item() == 1.0  # scale
    assert wire[0, 4].item() == 0 | 1 << 2 | 2 << 4 | 3 << 6 and wire[0, 5].item() == 1


@pytest.mark.parametrize("bits", BITS)
def test_compact_header_rounds_outwards_and_the_grid_covers_the_row(bits):
    g = torch.Generator().manual_seed(bits)
    # Rows far from zero (|Z| >> range) are where a bfloat16 cast would lose values.
    x = torch.randn(400, 29, generator=g) * torch.logspace(-4, 4, 400).unsqueeze(1) \
        + torch.randn(400, 1, generator=g) * torch.logspace(-3, 6, 400).unsqueeze(1)
    levels = 2**bits - 1
    codec = QuantizedCodec(bits, "nearest", header="bfloat16")
    wire = codec.encode(x, ctx_for(29))
    zero, scale = Q.read_header(wire, "bfloat16")
    assert torch.equal(zero, zero.bfloat16().float())
    assert torch.equal(scale, scale.bfloat16().float())
    lo, hi = x.amin(1), x.amax(1)
    assert bool((zero <= lo).all()) and bool((lo - zero <= lo.abs() * 2.0**-7).all())
    top = zero.double() + levels * scale.double()  # the grid's last point
    assert bool((top >= hi.double() * (1 - 1e-6 * hi.double().sign())).all())
    # The step widens by at most the zero point's rounding over L, plus bfloat16's own.
    exact = (hi - lo).double() / levels
    widened = (exact + (lo - zero).double() / levels) * (1 + 2.0**-7)
    assert bool((scale.double() <= widened * (1 + 1e-6)).all())
    back = codec.decode(wire, ctx_for(29))
    slack = 1e-6 * x.abs().amax(1, keepdim=True)
    assert bool(((back - x).abs() <= scale.unsqueeze(1) / 2 + slack).all())


@pytest.mark.parametrize("bits", BITS)
def test_compact_header_special_rows(bits):
    x = torch.zeros(7, 5)
    x[1] = -0.0
    x[2] = 2.5  # a bfloat16: exact
    x[3] = 1.001  # not a bfloat16: decodes within the (tiny) step
    x[4, 2] = float("nan")
    x[5] = torch.tensor([-3.3999e38, 0.0, 1.0, 2.0, 3.0])  # Z clamped to -B_max, not -inf
    x[6] = torch.tensor([1.0, 1.0, 2.0, 2.0, 1.5])
    codec = QuantizedCodec(bits, header="bfloat16")
    back = codec.decode(codec.encode(x, ctx_for(5)), ctx_for(5))
    assert torch.equal(back[:3], x[:3]) and not back[1].signbit().any()
    assert bool(((back[3] - x[3]).abs() <= 1.001 * 2.0**-7).all())
    assert back[4].isnan().all()
    wire = codec.encode(x, ctx_for(5))
    assert (wire[[4], :4].clone().view(torch.int16) == 0x7FC0).all()
    assert (wire[[4], 4:] == 0).all()
    assert torch.isfinite(back[6]).all()
    # The nearest value the header holds: the largest bfloat16, below it.
    assert back[5, 0] == -Q.BF16_MAX and torch.isfinite(back[5]).all()


@pytest.mark.parametrize("bits", BITS)
def test_padding_bits_are_zero(bits):
    per = 8 // bits
    for f in ODD_WIDTHS:
        if f % per == 0:
            continue
        wire = QuantizedCodec(bits).encode(torch.rand(50, f) * 10, ctx_for(f))
        used = (f % per) * bits
        assert int((wire[:, -1].to(torch.int32) >> used).sum()) == 0


# -- accuracy ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
def test_error_is_within_one_step(bits, rounding):
    g = torch.Generator().manual_seed(bits)
    x = torch.randn(300, 37, generator=g) * torch.logspace(-6, 6, 300).unsqueeze(1) \
        + torch.randn(300, 1, generator=g) * torch.logspace(-6, 6, 300).unsqueeze(1)
    codec = QuantizedCodec(bits, rounding)
    wire = codec.encode(x, ctx_for(37))
    back = codec.decode(wire, ctx_for(37))
    scale = scales_of(wire).unsqueeze(1)
    expect_scale = (x.amax(1) - x.amin(1)).unsqueeze(1) / (2**bits - 1)
    torch.testing.assert_close(scale, expect_scale, rtol=1e-6, atol=0)
    step = scale if rounding == "stochastic" else scale / 2
    slack = 1e-6 * x.abs().amax(1, keepdim=True)  # float32 rounding of Z + q S
    assert bool(((back - x).abs() <= step + slack).all())
    if rounding == "nearest":  # the nearest grid point: no rounding can beat it
        grid = Q.read_header(wire)[0].unsqueeze(1) + torch.round(
            (x - x.amin(1, keepdim=True)) / scale) * scale
        assert bool(((back - x).abs() <= (grid - x).abs() + slack).all())


@pytest.mark.parametrize("bits", [1, 2])
def test_stochastic_rounding_is_unbiased_over_steps(cpp_ext, bits):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 64, generator=g) * 3
    codec = QuantizedCodec(bits)
    n = 4000
    total = torch.zeros_like(x, dtype=torch.float64)
    for step in range(n):
        total += codec.decode(codec.encode(x, ctx_for(64, step=step)), ctx_for(64)).double()
    mean = total / n
    # Per element, q S + Z is Bernoulli between two grid points: sd = S sqrt(f (1 - f)).
    wire = codec.encode(x, ctx_for(64))
    zero, scale = (t.double().unsqueeze(1) for t in Q.read_header(wire))
    t = (x.double() - zero) / scale
    frac = t - t.floor()
    sd = scale * (frac * (1 - frac)).sqrt()
    err = (mean - x.double()).abs()
    assert bool((err <= 5 * sd / math.sqrt(n) + 1e-5 * scale).all()), float((err / sd).max())
    # And the errors are centred: their mean over all elements is a small fraction of S.
    assert abs(float(((mean - x.double()) / scale).mean())) < 3 / math.sqrt(n * x.numel()) * 0.5
    # Nearest rounding, by contrast, is biased for the same rows.
    near = QuantizedCodec(bits, "nearest")
    biased = near.decode(near.encode(x, CTX), ctx_for(64)).double()
    assert float((biased - x.double()).abs().mean()) > 10 * float(err.mean())


# -- special rows ---------------------------------------------------------------------------

@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
@pytest.mark.parametrize("f", ODD_WIDTHS)
def test_constant_zero_and_grid_rows_round_trip_exactly(bits, rounding, f):
    levels = 2**bits - 1
    k = torch.arange(f) * 7 % (levels + 1)
    k[0], k[-1] = 0, (levels if f > 1 else 0)  # the row spans the whole grid: S = 0.25
    rows = torch.stack([
        torch.zeros(f), torch.full((f, ), -0.0), torch.full((f, ), 2.5),
        torch.full((f, ), -1e30), torch.full((f, ), 7e-42),
        # Values on the grid Z + k S with S a power of two: no rounding at all.
        -3.0 + 0.25 * k.float(),
    ])
    codec = QuantizedCodec(bits, rounding)
    back = codec.decode(codec.encode(rows, ctx_for(f)), ctx_for(f))
    assert torch.equal(back, rows)
    # A fresh codec (no state) on another rank's context decodes the same.
    assert torch.equal(QuantizedCodec(bits, rounding).decode(
        codec.encode(rows, ctx_for(f)), ctx_for(f, rank=0, step=99)), back)


@pytest.mark.parametrize("bits", BITS)
def test_non_finite_rows_decode_to_nan_and_spare_the_others(bits):
    x = torch.randn(6, 5)
    x[1, 2] = float("nan")
    x[2, 0] = float("inf")
    x[3, 4] = float("-inf")
    x[4] = torch.tensor([-3e38, 3e38, 0.0, 1.0, 2.0])  # finite, its range overflows float32
    codec = QuantizedCodec(bits)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        wire = codec.encode(x, ctx_for(5))
    head = wire[:, :8].clone().view(torch.int32)
    bad = [1, 2, 3]
    assert (head[bad] == Q.NAN_BITS).all() and (wire[bad, 8:] == 0).all()
    back = codec.decode(wire, ctx_for(5))
    assert back[bad].isnan().all()
    assert torch.isfinite(back[[0, 4, 5]]).all()
    ok = [0, 5]
    step = scales_of(wire)[ok].unsqueeze(1)
    assert bool(((back[ok] - x[ok]).abs() <= step * (1 + 1e-6)).all())


def _backend(request, backend):
    # The C++ and Triton (interpreted on CPU) kernels need their fixtures; "torch" is the
    # reference, the fallback without the extension (and on CUDA without triton).
    if backend == "cpp":
        request.getfixturevalue("cpp_ext")
    elif backend == "triton":
        request.getfixturevalue("triton_q")
        if torch.cuda.is_available():
            return "cuda"
    return "cpu"


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
@pytest.mark.parametrize("header", HEADERS)
def test_finite_rows_whose_range_overflows_decode_finite_and_close(request, backend, header):
    device = _backend(request, backend)
    fmax = Q.BF16_MAX if header == "bfloat16" else Q.FLT_MAX
    x = torch.tensor([[-3e38, 3e38, 0.0, 1.0, 2e38, -1e38],
                      [-Q.FLT_MAX, Q.FLT_MAX, Q.FLT_MAX, -Q.FLT_MAX, 0.0, 1e-30],
                      [-1e38, 3e38, 1e38, 2.9e38, -0.5e38, 3e38],
                      [1e38, Q.FLT_MAX, 3e38, 2e38, 1.5e38, Q.FLT_MAX]])
    for bits, rounding in itertools.product(BITS, ROUNDINGS):
        codec = QuantizedCodec(bits, rounding, backend=backend, header=header)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy overflows
            wire = codec.encode(x.to(device), ctx_for(6))
            back = codec.decode(wire, ctx_for(6)).cpu()
        case = (bits, rounding)
        assert torch.isfinite(back).all(), case
        zero, scale = Q.read_header(wire.cpu(), header)
        assert torch.isfinite(zero).all() and torch.isfinite(scale).all(), case
        step = scale.unsqueeze(1) if rounding == "stochastic" else scale.unsqueeze(1) / 2
        err = (back - x).abs()
        slack = 1e-6 * fmax
        if bits == 1:  # the step is clamped to the header's largest value: the top saturates
            wide = [0, 1, 2]
            assert (scale[wide] == fmax).all(), case
            top = zero.unsqueeze(1) + scale.unsqueeze(1)
            covered = x <= top
            assert bool((err[covered] <= step.expand_as(x)[covered] + slack).all()), case
            assert torch.equal(back[~covered], top.expand_as(x)[~covered]), case
        else:
            # The minimum's bfloat16 rounding widens the step of a compact header a little.
            spread = (x.double().amax(1) - x.double().amin(1)) / (2**bits - 1)
            assert bool((scale.double() <= spread * (1 + 2**-6) + slack).all()), case
            assert bool((err <= step + slack).all()), case


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
@pytest.mark.parametrize("header", HEADERS)
def test_one_row_and_zero_row_wires_decode(request, backend, header):
    device = _backend(request, backend)
    x = torch.randn(5, 7, device=device)
    for bits in BITS:
        codec = QuantizedCodec(bits, backend=backend, header=header)
        ctx = ctx_for(7)
        wire = codec.encode(x, ctx)
        full = codec.decode(wire, ctx)
        # A one-row wire, on its own and as a slice at an odd byte offset of a larger one.
        one = codec.encode(x[:1], ctx)
        assert torch.equal(codec.decode(one, ctx), full[:1]), bits
        for r in range(5):
            assert torch.equal(codec.decode(wire[r:r + 1], ctx), full[r:r + 1]), (bits, r)
            zero, scale = Q.read_header(wire[r:r + 1].cpu(), header)
            assert zero.shape == scale.shape == (1, )
        empty = codec.decode(wire[2:2], ctx)
        assert empty.shape == (0, 7) and empty.dtype == torch.float32
        assert codec.encode(x[:0], ctx).shape == (0, wire.size(1))
    for bits in BITS:  # the reference functions themselves
        w = Q.quantize(x.cpu(), bits, True, (3, 4), header)
        assert torch.equal(Q.dequantize(w[3:4], bits, 7, header),
                           Q.dequantize(w, bits, 7, header)[3:4])
        assert Q.dequantize(w[:0], bits, 7, header).shape == (0, 7)


@pytest.mark.parametrize("codec", [QuantizedCodec(2), QuantizedCodec(8, "nearest"),
                                   BFloat16Codec()], ids=repr)
def test_no_rows_and_no_features(codec):
    for f in (0, 5):
        wire = codec.encode(torch.zeros(0, f), ctx_for(f))
        assert wire.shape == (0, codec.wire_bytes(1, f, torch.float32)) \
            and wire.dtype == torch.uint8
        assert codec.decode(wire, ctx_for(f)).shape == (0, f)
    back = codec.decode(codec.encode(torch.zeros(3, 0), ctx_for(0)), ctx_for(0))
    assert back.shape == (3, 0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_dtypes_are_quantized_in_float32_and_decoded_to_ctx_dtype(dtype):
    x = (torch.randn(9, 13) * 4).to(dtype)
    codec = QuantizedCodec(4)
    ctx = ctx_for(13, dtype=dtype)
    wire = codec.encode(x, ctx)
    assert torch.equal(wire, codec.encode(x.float(), ctx))
    back = codec.decode(wire, ctx)
    assert back.dtype == dtype
    assert torch.equal(back, codec.decode(wire, ctx_for(13)).to(dtype))


# -- reproducibility and statelessness ----------------------------------------------------------

def test_same_context_same_bytes_any_change_other_bytes():
    x = torch.randn(20, 33)
    codec = QuantizedCodec(2)
    wire = codec.encode(x, ctx_for(33))
    assert torch.equal(wire, QuantizedCodec(2).encode(x.clone(), ctx_for(33)))
    for field, value in [("step", 5), ("rank", 0), ("seed", 12), ("direction", "backward"),
                         ("key", "conv2.propagate0.x")]:
        other = codec.encode(x, ctx_for(33, **{field: value}))
        assert not torch.equal(other[:, 8:], wire[:, 8:]), field
        assert torch.equal(other[:, :8], wire[:, :8])  # the header does not depend on it
    # Nearest rounding draws nothing: the context does not matter.
    near = QuantizedCodec(2, "nearest")
    assert torch.equal(near.encode(x, ctx_for(33)), near.encode(x, ctx_for(33, step=9)))


def test_rounding_draws_are_uniform_and_distinct_per_row():
    u = Q.uniforms(0, 64, 128, Q.stream_key(CTX))
    assert u.dtype == torch.float32 and u.min() >= 0 and u.max() < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    assert u.unique().numel() > 0.99 * u.numel()  # rows are no shifted copies of each other
    # Rows are numbered in the encoded tensor: a later chunk continues the same stream.
    assert torch.equal(Q.uniforms(10, 5, 128, Q.stream_key(CTX)), u[10:15])
    seed = CTX.generator().initial_seed()
    assert Q.stream_key(CTX) == (seed & 0xFFFFFFFF, seed >> 32)


def test_decode_uses_only_the_wire_rows():
    f = 11
    x0, x1 = torch.randn(5, f), torch.randn(7, f) * 100
    codec = QuantizedCodec(4)
    sender0, sender1 = ctx_for(f, rank=0), ctx_for(f, rank=1)
    w0, w1 = codec.encode(x0, sender0), codec.encode(x1, sender1)
    # The receiver (rank 2, its own context) decodes rows of both senders in one call.
    receiver = ctx_for(f, rank=2, step=0, seed=0, key="other")
    both = QuantizedCodec(4).decode(torch.cat([w0, w1]), receiver)
    assert torch.equal(both[:5], codec.decode(w0, sender0))
    assert torch.equal(both[5:], codec.decode(w1, sender1))
    # Any subset of rows in any order (nothing positional), from a non-contiguous view too.
    perm = torch.tensor([6, 0, 3, 11, 2])
    assert torch.equal(codec.decode(torch.cat([w0, w1])[perm], receiver), both[perm])
    padded = torch.cat([torch.cat([w0, w1]), torch.zeros(12, 3, dtype=torch.uint8)], 1)
    assert torch.equal(codec.decode(padded[:, :-3], receiver), both)


# -- the implementations agree bit for bit -------------------------------------------------------

def _agree(a_enc, a_dec, b_enc, b_dec, device="cpu", rows=40,
           widths=(1, 3, 5, 7, 13, 64, 130, 300, 1100), headers=HEADERS):
    # Widths past one C++ chunk (256 features) and one Triton block (1024) too.
    for f in widths:
        x = mixed_rows(f, seed=f, n=rows)
        for bits, stochastic, header in itertools.product(BITS, (True, False), headers):
            key = Q.stream_key(ctx_for(f))
            case = (f, bits, stochastic, header)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # numpy on NaN rows
                wa = a_enc(x, bits, stochastic, key, header)
                wb = b_enc(x.to(device), bits, stochastic, key, header).cpu()
                assert torch.equal(wa, wb), case
                da = a_dec(wa, bits, f, header)
                db = b_dec(wa.to(device), bits, f, header).cpu()
            if device == "cpu":
                assert same_bits(da, db), case
            else:  # a GPU may write another NaN pattern
                assert torch.equal(da.isnan(), db.isnan())
                fin = ~da.isnan()
                assert same_bits(da[fin], db[fin]), case


def test_cpp_equals_reference_bit_for_bit(cpp_ext):
    _agree(Q.quantize, Q.dequantize,
           lambda x, b, s, k, h: cpp_ext.quantize(x, b, s, k[0], k[1], h == "bfloat16"),
           lambda w, b, f, h: cpp_ext.dequantize(w, b, f, h == "bfloat16"))


@pytest.mark.parametrize("rows, f", [(3000, 100), (20000, 5), (9000, 13), (2500, 64)])
def test_cpp_equals_reference_on_many_threads_and_large_inputs(cpp_ext, rows, f):
    # Narrow rows (<= 64 values) are quantized in blocks of rows: many blocks, split over
    # threads, with special rows among them.
    x = torch.randn(rows, f) * torch.logspace(-3, 3, rows).unsqueeze(1)
    x[7] = float("nan")
    x[rows // 3, f // 2] = float("inf")
    x[rows // 2] = 1.5
    x[-1, 0], x[-1, -1] = -3e38, 3e38  # a finite row whose range overflows
    key = Q.stream_key(CTX)
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(max(2, prev))
        for bits, compact, stochastic in itertools.product(BITS, (False, True), (True, False)):
            header = "bfloat16" if compact else "float32"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # numpy on NaN rows
                wire = cpp_ext.quantize(x, bits, stochastic, *key, compact)
                assert torch.equal(wire, Q.quantize(x, bits, stochastic, key, header))
                assert same_bits(cpp_ext.dequantize(wire, bits, f, compact),
                                 Q.dequantize(wire, bits, f, header))
    finally:
        torch.set_num_threads(prev)


def test_triton_equals_reference_bit_for_bit(triton_q):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # The interpreter runs one program at a time: fewer random rows (all the special ones).
    if device == "cuda":
        _agree(Q.quantize, Q.dequantize, triton_q.quantize, triton_q.dequantize, device)
    else:
        _agree(Q.quantize, Q.dequantize, triton_q.quantize, triton_q.dequantize, device,
               rows=18, widths=(1, 3, 5, 7, 13, 130, 1100))


def test_codec_backends_give_the_same_wire(cpp_ext, triton_q):
    x = mixed_rows(13)
    ctx = ctx_for(13)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        wires = [QuantizedCodec(2, backend=b).encode(x, ctx) for b in ("auto", "cpp", "torch")]
        # Triton on CPU tensors: the interpreter (with CUDA it gets CUDA tensors below).
        cpu = ("auto", "cpp", "torch") + (() if torch.cuda.is_available() else ("triton", ))
        compact = [QuantizedCodec(2, backend=b, header="bfloat16").encode(x, ctx) for b in cpu]
        if torch.cuda.is_available():
            compact.append(QuantizedCodec(2, header="bfloat16").encode(x.cuda(), ctx).cpu())
    assert all(torch.equal(w, compact[0]) for w in compact) and compact[0].size(1) == 4 + 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if torch.cuda.is_available():  # CUDA tensors: Triton
            gpu = QuantizedCodec(2).encode(x.cuda(), ctx)
            wires.append(gpu.cpu())
            back = QuantizedCodec(2).decode(gpu, ctx)
            assert back.is_cuda and torch.equal(back.isnan(), QuantizedCodec(2).decode(
                wires[0], ctx).isnan().cuda())
        else:  # Triton on CPU tensors: the interpreter
            wires.append(QuantizedCodec(2, backend="triton").encode(x, ctx))
    assert all(torch.equal(w, wires[0]) for w in wires)


# -- the fallback ------------------------------------------------------------------------------

FALLBACK = textwrap.dedent("""
    import warnings
    import torch
    from lightning_fullgraph.engine.codecs import QuantizedCodec, WireContext
    from lightning_fullgraph.engine.codecs import quantize as Q
    ctx = WireContext("k", "forward", 3, 1, 9, torch.float32, 5)
    x = torch.randn(20, 9)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        c = QuantizedCodec(4)
        w = c.encode(x, ctx)
        w2 = c.encode(x, ctx)
        back = c.decode(w, ctx)
    assert torch.equal(w, Q.quantize(x, 4, True, Q.stream_key(ctx))) and torch.equal(w, w2)
    assert torch.equal(back, Q.dequantize(w, 4, 9))
    msgs = [str(m.message) for m in rec if "pure-PyTorch fallback" in str(m.message)]
    assert len(msgs) == 1 and "quantization" in msgs[0], msgs
    print("OK")
""")


def test_forced_fallback_warns_once_and_matches_the_reference():
    env = dict(os.environ, LIGHTNING_FULLGRAPH_NO_EXT="1")
    res = subprocess.run([sys.executable, "-c", FALLBACK], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-2000:]


# -- bfloat16 ----------------------------------------------------------------------------------

def test_bfloat16_codec_rounds_to_nearest_even():
    codec = BFloat16Codec()
    assert not codec.lossless
    x = torch.tensor([[1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38, float("inf"),
                       float("nan"), -0.0, 1e-40]])
    ctx = ctx_for(8)
    wire = codec.encode(x, ctx)
    assert wire.dtype == torch.uint8 and wire.shape == (1, 16)
    assert codec.wire_bytes(10, 8, torch.float32) == 160
    assert Codec.wire_bytes(codec, 10, 8, torch.float32) == 160
    back = codec.decode(wire, ctx)
    assert back.dtype == torch.float32
    assert back[0, :3].tolist() == [1.0, 1 + 2**-6, -1.0]  # ties to even
    assert back[0, 3] == x.to(torch.bfloat16).float()[0, 3]
    assert back[0, 4] == float("inf") and back[0, 5].isnan()
    assert str(back[0, 6].item()) == "-0.0"
    assert same_bits(back, x.to(torch.bfloat16).float())


def test_bfloat16_codec_round_trips():
    codec = BFloat16Codec()
    x = torch.randn(50, 13) * 1e3
    for dtype in (torch.float32, torch.float64, torch.float16):
        ctx = ctx_for(13, dtype=dtype)
        xin = x.to(dtype)
        back = codec.decode(codec.encode(xin, ctx), ctx)
        assert back.dtype == dtype
        assert torch.equal(back, xin.to(torch.bfloat16).to(dtype))
        # Round to nearest: within half a bf16 ulp (2^-8 relative) of what was sent.
        assert bool(((back.double() - xin.double()).abs() <= xin.double().abs() * 2**-8).all())
    xb = x.bfloat16()  # bf16 rows cross exactly
    ctx = ctx_for(13, dtype=torch.bfloat16)
    back = codec.decode(codec.encode(xb, ctx), ctx)
    assert torch.equal(back.view(torch.int16), xb.view(torch.int16))
    # Rows of any subset decode alike (the wire is self-contained).
    wire = codec.encode(x, ctx_for(13))
    assert torch.equal(codec.decode(wire[[4, 1]], ctx_for(13)),
                       codec.decode(wire, ctx_for(13))[[4, 1]])


def test_invalid_arguments():
    with pytest.raises(ValueError, match="bits"):
        QuantizedCodec(3)
    with pytest.raises(ValueError, match="rounding"):
        QuantizedCodec(2, "up")
    with pytest.raises(ValueError, match="backend"):
        QuantizedCodec(2, backend="cuda")
    with pytest.raises(ValueError, match="header"):
        QuantizedCodec(2, header="float16")
    codec = QuantizedCodec(2)
    with pytest.raises(ValueError, match="10 bytes"):
        codec.decode(torch.zeros(3, 9, dtype=torch.uint8), ctx_for(5))
    with pytest.raises(ValueError, match="2-D"):
        codec.encode(torch.zeros(3), ctx_for(1))
    with pytest.raises(ValueError, match="bytes"):
        BFloat16Codec().decode(torch.zeros(3, 9, dtype=torch.uint8), ctx_for(5))


# -- through HaloExchange on 2 gloo processes ------------------------------------------------------

F_IN = 6
SEED = 7
STEP = 3


def _block(counts, dst):
    start = int(counts[:dst].sum())
    return slice(start, start + int(counts[dst]))


def _quantized_exchange_job(rank, world_size, header="float32"):
    from lightning_fullgraph.partition import build_local_partitions, metis_partition

    from .models import skewed_graph
    data = skewed_graph()
    n = data.num_nodes
    parts = build_local_partitions(data, metis_partition(data.edge_index, n, world_size, seed=0))
    post = {r: p.plan("post") for r, p in enumerate(parts)}
    own = parts[rank].owned_ids
    g = torch.Generator().manual_seed(1)
    X = torch.randn(n, F_IN, generator=g) * torch.logspace(-2, 2, n).unsqueeze(1)
    # What the sender (C++ there) must have sent.
    ref = QuantizedCodec(2, backend="torch", header=header)

    ex = HaloExchange(post[rank], Transport(), QuantizedCodec(2, header=header), seed=SEED)
    ex.step = STEP
    x = X[own].clone().requires_grad_()
    ext = ex.extend(x, key="q.x")
    expect = []
    for s in range(world_size):
        rows = X[parts[s].owned_ids][post[s].post.send_index]
        ctx = WireContext("q.x", "forward", STEP, s, F_IN, torch.float32, SEED)
        wire = ref.encode(rows, ctx)[_block(post[s].post.send_counts, rank)]
        expect.append(ref.decode(wire, ctx))
    halo = ext[len(own):].detach()
    out = dict(num_halo=post[rank].num_halo, halo_exact=torch.equal(halo, torch.cat(expect)))
    true = X[post[rank].halo_ids]
    # The step: the row's range over 3 (the compact header widens it by its rounding).
    step = (true.amax(1, keepdim=True) - true.amin(1, keepdim=True)) / 3
    if header == "bfloat16":
        step = (step + true.amin(1, keepdim=True).abs() * 2.0**-7 / 3) * (1 + 2.0**-7)
    out["within_step"] = bool(((halo - true).abs() <= step * (1 + 1e-5)).all())

    # Backward: halo gradients quantized by this rank, decoded by their owners.
    w = {r: torch.randn(parts[r].num_owned + post[r].num_halo, F_IN,
                        generator=torch.Generator().manual_seed(100 + r))
         for r in range(world_size)}
    (ext * w[rank]).sum().backward()
    grad = w[rank][:len(own)].clone()
    for s in range(world_size):
        ctx = WireContext("q.x", "backward", STEP, s, F_IN, torch.float32, SEED)
        wire = ref.encode(w[s][parts[s].num_owned:], ctx)[_block(post[s].post.recv_counts, rank)]
        idx = post[rank].post.send_index[_block(post[rank].post.send_counts, s)]
        grad.index_add_(0, idx, ref.decode(wire, ctx))
    out["grad_err"] = float((x.grad - grad).abs().max())
    c = ex.stats.counters[("q.x", "forward")]
    out["bytes"] = (c.bytes_sent, post[rank].post.num_send)
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("header", HEADERS)
def test_two_ranks_receive_exactly_what_the_sender_encoded(header):
    job = run_distributed(_quantized_exchange_job, 2, header, timeout_s=90)
    assert sum(r["num_halo"] for r in job) > 0
    for rank, r in enumerate(job):
        assert r["halo_exact"] and r["within_step"], rank
        assert r["grad_err"] < 1e-5, (rank, r["grad_err"])
        sent, rows = r["bytes"]
        assert sent == rows * ((8 if header == "float32" else 4) + math.ceil(F_IN * 2 / 8))
