// CPU kernels of the per-row min-max quantization codec (QuantizedCodec).
//
// The wire format, the rounding rule and the counter-based random numbers are specified in
// lightning_fullgraph/engine/codecs/quantize.py; the pure-PyTorch reference there and the
// Triton twin (lightning_fullgraph/kernels/triton_quantize.py) produce the same bytes.
//
// Two header formats: float32 Z and S (8 bytes), or the compact one (4 bytes): Z rounded down
// and S rounded up to bfloat16 (their high halves), the codes computed against the rounded
// values (see the reference's module docstring).
//
// Design (why):
//  * Bit-exact with the reference: every float step is one IEEE float32 operation in the
//    reference's order, and the library is built with -ffp-contract=off (the loader's
//    flags), so "Z + q * S" is never fused into an FMA; no -ffast-math (floor, the NaN test
//    and the -0.0 canonicalization depend on IEEE semantics).
//  * One pass over memory per row: the row (a few hundred bytes) is scanned once for
//    min / max / NaN, then again from L1 to quantize and pack.
//  * Vectorizable loops (built with -fno-trapping-math, without which GCC keeps the
//    rounding loop's comparisons as branches and runs it scalar, 4-5x slower; it changes
//    no value): the min/max scan is an OpenMP simd reduction (a float min/max
//    reduction would otherwise need -ffast-math to vectorize); the random
//    numbers are 32-bit integer hashes (vpmulld), and codes are computed into a small
//    per-thread buffer before a separate packing loop, so both loops have no carried
//    dependency.
//  * OpenMP over rows, static schedule (rows cost the same); small inputs stay on one
//    thread because a fork/join costs more than they do.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

constexpr int64_t kHeader = 8;
constexpr int64_t kCompactHeader = 4;
constexpr uint32_t kRowMul = 0x9E3779B9u;
constexpr uint32_t kColMul = 0x7FEB352Du;
constexpr uint32_t kFmix1 = 0x85EBCA6Bu;
constexpr uint32_t kFmix2 = 0xC2B2AE35u;
constexpr uint32_t kNanBits = 0x7FC00000u;
constexpr float kMinScale = 1.17549435e-38f;  // 2^-126, the smallest normal float
constexpr float kFloatMax = std::numeric_limits<float>::max();
constexpr uint32_t kBf16MaxBits = 0x7F7F0000u;  // the largest finite bfloat16
constexpr int64_t kChunk = 256;  // features per code buffer (a multiple of 8)

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= kFmix1;
  h ^= h >> 13;
  h *= kFmix2;
  h ^= h >> 16;
  return h;
}

inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// The largest bfloat16 <= x: truncation rounds towards zero, so a negative x with dropped
// bits takes one more unit of magnitude (-inf past the largest bfloat16).
inline float bf16_down(float x) {
  const uint32_t b = float_to_bits(x);
  uint32_t cut = b & 0xFFFF0000u;
  if ((b >> 31) && (b & 0xFFFFu) && x == x) cut += 0x10000u;
  return bits_to_float(cut);
}

// The smallest bfloat16 >= x, for x >= 0 (+inf past the largest).
inline float bf16_up(float x) {
  const uint32_t b = float_to_bits(x);
  uint32_t cut = b & 0xFFFF0000u;
  if ((b & 0xFFFFu) && x == x) cut += 0x10000u;
  return bits_to_float(cut);
}

int num_threads() { return std::max(1, at::get_num_threads()); }

struct Header {
  bool bad;     // the row holds NaN or +-inf: NaN header, zero codes
  bool wide;    // finite, but max - min overflows: codes computed in quarters
  float zero;   // Z used to compute codes (Z / 4 for a wide row, 0 for a non-finite one)
  float inv;    // 1 / S (1 / (S / 4) for a wide row; 0 for a constant or non-finite row)
  float head_zero, head_scale;  // what the header carries
};

template <bool SIMD = true>
inline Header row_header(const float* __restrict x, int64_t f, int bits, bool compact) {
  float lo = std::numeric_limits<float>::infinity();
  float hi = -std::numeric_limits<float>::infinity();
  int32_t any_nan = 0;
  if (SIMD) {
    // An OpenMP simd reduction vectorizes the min/max scan without -ffast-math; the order it
    // combines lanes in does not matter: NaN is tested apart and zeros are canonicalized below.
#pragma omp simd reduction(min : lo) reduction(max : hi) reduction(| : any_nan)
    for (int64_t j = 0; j < f; ++j) {
      const float v = x[j];
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
      any_nan |= (v != v);
    }
  } else {  // a row of a few values: a vector loop's prologue and remainder cost more
    for (int64_t j = 0; j < f; ++j) {
      const float v = x[j];
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
      any_nan |= (v != v);
    }
  }
  // + 0.0f: -0.0 becomes +0.0, whichever of two zeros the scan happened to keep.
  float zero = lo + 0.0f;
  const float top = hi + 0.0f;
  const float levels = static_cast<float>((1 << bits) - 1);
  Header h;
  h.bad = any_nan || !std::isfinite(zero) || !std::isfinite(top);
  h.wide = false;
  if (h.bad) {
    h.zero = 0.0f;
    h.inv = 0.0f;
    h.head_zero = h.head_scale = bits_to_float(kNanBits);
    return h;
  }
  const float max_scale = compact ? bits_to_float(kBf16MaxBits) : kFloatMax;
  if (compact) {  // the grid starts at the bfloat16 below the minimum, at least -B_max
    zero = bf16_down(zero);
    if (zero < -max_scale) zero = -max_scale;
  }
  const float span = top - zero;
  h.wide = !std::isfinite(span);  // a finite row whose range overflows: in quarters
  float scale = h.wide ? (top * 0.25f - zero * 0.25f) / levels * 4.0f : span / levels;
  if (scale < kMinScale) scale = 0.0f;
  if (compact) scale = bf16_up(scale);
  if (scale > max_scale) scale = max_scale;  // a 1-bit wide row's step is not finite
  const float step = h.wide ? scale * 0.25f : scale;
  h.zero = h.wide ? zero * 0.25f : zero;
  h.inv = step > 0.0f ? 1.0f / step : 0.0f;
  h.head_zero = zero;
  h.head_scale = scale;
  return h;
}

// The row's header: Z and S as float32, or (compact) their high halves, exact: both values
// are bfloat16 (or the NaN).
inline void write_header(uint8_t* wr, const Header& h, bool compact) {
  if (compact) {
    const uint16_t hz = static_cast<uint16_t>(float_to_bits(h.head_zero) >> 16);
    const uint16_t hs = static_cast<uint16_t>(float_to_bits(h.head_scale) >> 16);
    std::memcpy(wr, &hz, 2);
    std::memcpy(wr + 2, &hs, 2);
  } else {
    std::memcpy(wr, &h.head_zero, 4);
    std::memcpy(wr + 4, &h.head_scale, 4);
  }
}

// The hash key of row r's random numbers (the column is mixed in per value).
inline uint32_t row_hash_key(int64_t r, uint32_t k0, uint32_t k1) {
  return fmix32(static_cast<uint32_t>(r) * kRowMul + k0) ^ k1;
}

// Codes of features [c0, c0 + n) of one row into codes[0, n); a WIDE row in quarters.
template <int BITS, bool STOCH, bool WIDE>
inline void row_codes(const float* __restrict x, int64_t c0, int64_t n, const Header& h, uint32_t row_key,
                      uint8_t* __restrict codes) {
  constexpr int kLevels = (1 << BITS) - 1;
  const float zero = h.zero, inv = h.inv;
  const uint32_t base = static_cast<uint32_t>(c0);
  for (int64_t j = 0; j < n; ++j) {
    const float v = WIDE ? x[c0 + j] * 0.25f : x[c0 + j];
    float t = (v - zero) * inv;
    t = t > 0.0f ? t : 0.0f;  // below a compact zero point clamped to -B_max
    // t >= 0 (and small), so truncation is floor: a vector conversion, where std::floor
    // would keep GCC from vectorizing the loop without -ffast-math.
    int32_t q = static_cast<int32_t>(t);
    const float frac = t - static_cast<float>(q);  // exact
    if (STOCH) {
      const uint32_t hash = fmix32(row_key ^ ((base + static_cast<uint32_t>(j)) * kColMul));
      const float u = static_cast<float>(hash >> 8) * 5.9604644775390625e-8f;  // 2^-24
      q += (u < frac) ? 1 : 0;
    } else {
      q += (frac >= 0.5f) ? 1 : 0;
    }
    q = q > kLevels ? kLevels : q;  // t may round past L at the row's maximum
    codes[j] = static_cast<uint8_t>(q);
  }
}

template <int BITS, bool STOCH>
void encode_rows(const float* x, int64_t r0, int64_t r1, int64_t f, int64_t width, bool compact,
                 uint32_t k0, uint32_t k1, uint8_t* wire) {
  constexpr int kPer = 8 / BITS;
  const int64_t head = compact ? kCompactHeader : kHeader;
  alignas(64) uint8_t codes[kChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * f;
    uint8_t* wr = wire + r * width;
    const Header h = row_header(xr, f, BITS, compact);
    write_header(wr, h, compact);
    const uint32_t row_key = row_hash_key(r, k0, k1);
    uint8_t* packed = wr + head;
    if (h.bad) {  // (x - 0) * 0 would be NaN for an infinite entry: no codes to compute
      std::memset(packed, 0, width - head);
      continue;
    }
    for (int64_t c0 = 0; c0 < f; c0 += kChunk) {
      const int64_t n = std::min(kChunk, f - c0);
      if (h.wide)
        row_codes<BITS, STOCH, true>(xr, c0, n, h, row_key, codes);
      else
        row_codes<BITS, STOCH, false>(xr, c0, n, h, row_key, codes);
      uint8_t* dst = packed + c0 / kPer;  // c0 is a multiple of kChunk, hence of kPer
      if (kPer == 1) {
        std::memcpy(dst, codes, n);
        continue;
      }
      const int64_t full = n / kPer;
      for (int64_t k = 0; k < full; ++k) {
        uint32_t byte = 0;
        for (int i = 0; i < kPer; ++i) byte |= static_cast<uint32_t>(codes[k * kPer + i]) << (i * BITS);
        dst[k] = static_cast<uint8_t>(byte);
      }
      if (full * kPer < n) {  // the last, partial byte: its unused high bits stay zero
        uint32_t byte = 0;
        for (int64_t i = 0; full * kPer + i < n; ++i)
          byte |= static_cast<uint32_t>(codes[full * kPer + i]) << (i * BITS);
        dst[full] = static_cast<uint8_t>(byte);
      }
    }
  }
}

// Narrow rows (a class-wide layer's rows: a few to a few dozen features) are dominated by
// per-row loop overhead when quantized row by row: a vector loop of one or two iterations,
// its remainder, and a packing loop of a few bytes (4 ns a value at 16 features against
// 0.5 ns at 256).  A block of such rows is quantized as one flat loop instead: each row's
// values, zero point, 1 / S and hash key are laid out in block arrays, every row padded to
// whole bytes of codes (the padding computes code 0: value, zero point and 1 / S all 0, so
// t = 0), then the block is packed at once and copied behind the rows' headers.  Every value
// goes through the same float operations as in row_codes, so the bytes are the same.
constexpr int64_t kNarrow = 64;   // widths quantized in blocks (one chunk: c0 == 0)
constexpr int64_t kBlock = 1024;  // values per block: its arrays (~20 KB) stay in L1

template <int BITS, bool STOCH>
void encode_rows_narrow(const float* x, int64_t r0, int64_t r1, int64_t f, int64_t width, bool compact,
                        uint32_t k0, uint32_t k1, uint8_t* wire) {
  constexpr int kPer = 8 / BITS;
  constexpr int kLevels = (1 << BITS) - 1;
  const int64_t head = compact ? kCompactHeader : kHeader;
  const int64_t fp = (f + kPer - 1) / kPer * kPer;  // a row's codes, padded to whole bytes
  const int64_t nbytes = fp / kPer;                 // == width - head
  const int64_t block = std::max<int64_t>(1, kBlock / fp);
  alignas(64) float xb[kBlock + kNarrow], zb[kBlock + kNarrow], ib[kBlock + kNarrow];
  alignas(64) uint32_t kb[kBlock + kNarrow], cb[kBlock + kNarrow];
  alignas(64) uint8_t codes[kBlock + kNarrow], packed[(kBlock + kNarrow) / kPer + 1];
  for (int64_t b = 0; b < block; ++b)  // the column term of each value's hash
    for (int64_t j = 0; j < fp; ++j) cb[b * fp + j] = static_cast<uint32_t>(j) * kColMul;
  for (int64_t rb = r0; rb < r1; rb += block) {
    const int64_t rows = std::min(block, r1 - rb);
    for (int64_t b = 0; b < rows; ++b) {
      const int64_t r = rb + b;
      const float* xr = x + r * f;
      uint8_t* wr = wire + r * width;
      const Header h = f < 16 ? row_header<false>(xr, f, BITS, compact) : row_header<true>(xr, f, BITS, compact);
      write_header(wr, h, compact);
      float* xo = xb + b * fp;
      float* zo = zb + b * fp;
      float* io = ib + b * fp;
      uint32_t* ko = kb + b * fp;
      const uint32_t row_key = row_hash_key(r, k0, k1);
      const int64_t live = h.bad ? 0 : f;  // a non-finite row's codes are all 0
      for (int64_t j = 0; j < live; ++j) xo[j] = h.wide ? xr[j] * 0.25f : xr[j];
      for (int64_t j = live; j < fp; ++j) xo[j] = 0.0f;
      const float zero = h.bad ? 0.0f : h.zero;
      for (int64_t j = 0; j < fp; ++j) {
        zo[j] = j < live ? zero : 0.0f;
        io[j] = j < live ? h.inv : 0.0f;
        ko[j] = row_key;
      }
    }
    const int64_t n = rows * fp;
    for (int64_t e = 0; e < n; ++e) {  // row_codes' float operations, over the block
      float t = (xb[e] - zb[e]) * ib[e];
      t = t > 0.0f ? t : 0.0f;
      int32_t q = static_cast<int32_t>(t);
      const float frac = t - static_cast<float>(q);
      if (STOCH) {
        const uint32_t hash = fmix32(kb[e] ^ cb[e]);
        const float u = static_cast<float>(hash >> 8) * 5.9604644775390625e-8f;  // 2^-24
        q += (u < frac) ? 1 : 0;
      } else {
        q += (frac >= 0.5f) ? 1 : 0;
      }
      q = q > kLevels ? kLevels : q;
      codes[e] = static_cast<uint8_t>(q);
    }
    const uint8_t* src = codes;
    if (kPer != 1) {
      const int64_t total = n / kPer;  // fp is whole bytes: rows pack back to back
      for (int64_t k = 0; k < total; ++k) {
        uint32_t byte = 0;
        for (int i = 0; i < kPer; ++i) byte |= static_cast<uint32_t>(codes[k * kPer + i]) << (i * BITS);
        packed[k] = static_cast<uint8_t>(byte);
      }
      src = packed;
    }
    for (int64_t b = 0; b < rows; ++b)
      std::memcpy(wire + (rb + b) * width + head, src + b * nbytes, nbytes);
  }
}

// The codes of every byte value, one per byte: unpacking is one table load and one small
// store per packed byte (a shift-and-mask loop over 1- or 2-bit fields does not vectorize
// and costs more than the float conversion that follows).
template <int BITS>
struct Unpack {
  static constexpr int kPer = 8 / BITS;
  alignas(64) uint8_t table[256][8];
  Unpack() {
    for (int b = 0; b < 256; ++b)
      for (int i = 0; i < 8; ++i) table[b][i] = i < kPer ? static_cast<uint8_t>((b >> (i * BITS)) & ((1 << BITS) - 1)) : 0;
  }
};

template <int BITS>
void decode_rows(const uint8_t* wire, int64_t r0, int64_t r1, int64_t f, int64_t width, bool compact,
                 float* out) {
  constexpr int kPer = 8 / BITS;
  static const Unpack<BITS> unpack;  // built once (thread-safe static initialization)
  const int64_t head = compact ? kCompactHeader : kHeader;
  alignas(64) uint8_t codes[kChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = wire + r * width;
    float zero, scale;
    if (compact) {
      uint16_t hz, hs;
      std::memcpy(&hz, wr, 2);
      std::memcpy(&hs, wr + 2, 2);
      zero = bits_to_float(static_cast<uint32_t>(hz) << 16);
      scale = bits_to_float(static_cast<uint32_t>(hs) << 16);
    } else {
      std::memcpy(&zero, wr, 4);
      std::memcpy(&scale, wr + 4, 4);
    }
    const uint8_t* packed = wr + head;
    float* outr = out + r * f;
    // Z + q S grows monotonically with q: if the top code stays finite, every code does.
    const bool overflows = std::isfinite(zero) && std::isfinite(scale) &&
                           std::isinf(static_cast<float>((1 << BITS) - 1) * scale + zero);
    for (int64_t c0 = 0; c0 < f; c0 += kChunk) {
      const int64_t n = std::min(kChunk, f - c0);
      const uint8_t* src = packed + c0 / kPer;
      const uint8_t* cs = src;
      if (kPer != 1) {
        const int64_t nb = (n + kPer - 1) / kPer;
        for (int64_t k = 0; k < nb; ++k) std::memcpy(codes + k * kPer, unpack.table[src[k]], kPer);
        cs = codes;
      }
      float* o = outr + c0;
      // A product, then a sum (no FMA: built with -ffp-contract=off), as the reference.
      for (int64_t j = 0; j < n; ++j) {
        const float prod = static_cast<float>(cs[j]) * scale;
        o[j] = prod + zero;
      }
      if (overflows) {  // Z + q S overflows for some codes: those in quarters, clamped
        const float zq = zero * 0.25f, sq = scale * 0.25f;
        for (int64_t j = 0; j < n; ++j) {
          if (!std::isinf(o[j])) continue;
          const float quarter = (static_cast<float>(cs[j]) * sq + zq) * 4.0f;
          o[j] = quarter > kFloatMax ? kFloatMax : (quarter < -kFloatMax ? -kFloatMax : quarter);
        }
      }
    }
  }
}

template <typename Fn>
void over_rows(int64_t n, int64_t f, Fn fn) {
  // Below ~64K elements one thread is faster than a fork/join.
  const int nt = num_threads();
  const bool parallel = n * std::max<int64_t>(f, 1) > (int64_t(1) << 16) && nt > 1 && n > 1;
  if (!parallel) {
    fn(0, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
#ifdef _OPENMP
    const int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
#else
    const int64_t t = 0, p = 1;
#endif
    const int64_t r0 = n * t / p, r1 = n * (t + 1) / p;
    if (r0 < r1) fn(r0, r1);
  }
}

template <int BITS>
void encode_dispatch(const float* x, int64_t n, int64_t f, int64_t width, bool compact, bool stochastic,
                     uint32_t k0, uint32_t k1, uint8_t* wire) {
  over_rows(n, f, [&](int64_t r0, int64_t r1) {
    if (f <= kNarrow) {
      if (stochastic)
        encode_rows_narrow<BITS, true>(x, r0, r1, f, width, compact, k0, k1, wire);
      else
        encode_rows_narrow<BITS, false>(x, r0, r1, f, width, compact, k0, k1, wire);
    } else if (stochastic) {
      encode_rows<BITS, true>(x, r0, r1, f, width, compact, k0, k1, wire);
    } else {
      encode_rows<BITS, false>(x, r0, r1, f, width, compact, k0, k1, wire);
    }
  });
}

}  // namespace

// rows: float32 [R, F] (made contiguous); returns uint8 [R, H + ceil(F * bits / 8)], H = 8, or 4
// with the compact header.
torch::Tensor quantize(const torch::Tensor& rows, int64_t bits, bool stochastic, int64_t k0, int64_t k1,
                       bool compact) {
  TORCH_CHECK_VALUE(bits == 1 || bits == 2 || bits == 4 || bits == 8, "quantize: bits must be 1, 2, 4 or 8, got ",
                    bits);
  TORCH_CHECK_VALUE(rows.dim() == 2, "quantize: rows must be 2-D, got ", rows.dim(), "-D");
  TORCH_CHECK_VALUE(rows.scalar_type() == at::kFloat, "quantize: rows must be float32");
  TORCH_CHECK_VALUE(rows.device().is_cpu(), "quantize: rows must be on the CPU");
  const auto x = rows.contiguous();
  const int64_t n = x.size(0), f = x.size(1);
  const int64_t width = (compact ? kCompactHeader : kHeader) + (f * bits + 7) / 8;
  auto wire = torch::empty({n, width}, x.options().dtype(at::kByte));
  if (n == 0) return wire;
  if (f == 0) return wire.zero_();
  const auto u0 = static_cast<uint32_t>(static_cast<uint64_t>(k0));
  const auto u1 = static_cast<uint32_t>(static_cast<uint64_t>(k1));
  const float* xp = x.data_ptr<float>();
  uint8_t* wp = wire.data_ptr<uint8_t>();
  switch (bits) {
    case 1: encode_dispatch<1>(xp, n, f, width, compact, stochastic, u0, u1, wp); break;
    case 2: encode_dispatch<2>(xp, n, f, width, compact, stochastic, u0, u1, wp); break;
    case 4: encode_dispatch<4>(xp, n, f, width, compact, stochastic, u0, u1, wp); break;
    default: encode_dispatch<8>(xp, n, f, width, compact, stochastic, u0, u1, wp); break;
  }
  return wire;
}

// wire: uint8 [R, H + ceil(F * bits / 8)]; returns float32 [R, F].
torch::Tensor dequantize(const torch::Tensor& wire, int64_t bits, int64_t f, bool compact) {
  TORCH_CHECK_VALUE(bits == 1 || bits == 2 || bits == 4 || bits == 8, "dequantize: bits must be 1, 2, 4 or 8, got ",
                    bits);
  const int64_t width = (compact ? kCompactHeader : kHeader) + (f * bits + 7) / 8;
  TORCH_CHECK_VALUE(wire.dim() == 2 && wire.scalar_type() == at::kByte && wire.size(1) == width,
                    "dequantize: expected uint8 wire rows of ", width, " bytes (", f, " features at ", bits,
                    " bits), got ", wire.sizes(), " ", wire.scalar_type());
  TORCH_CHECK_VALUE(wire.device().is_cpu(), "dequantize: wire must be on the CPU");
  const auto w = wire.contiguous();
  const int64_t n = w.size(0);
  auto out = torch::empty({n, f}, w.options().dtype(at::kFloat));
  if (n == 0 || f == 0) return out;
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  over_rows(n, f, [&](int64_t r0, int64_t r1) {
    switch (bits) {
      case 1: decode_rows<1>(wp, r0, r1, f, width, compact, op); break;
      case 2: decode_rows<2>(wp, r0, r1, f, width, compact, op); break;
      case 4: decode_rows<4>(wp, r0, r1, f, width, compact, op); break;
      default: decode_rows<8>(wp, r0, r1, f, width, compact, op); break;
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("quantize", &quantize, "per-row min-max quantization into wire rows", pybind11::arg("rows"),
        pybind11::arg("bits"), pybind11::arg("stochastic"), pybind11::arg("k0"), pybind11::arg("k1"),
        pybind11::arg("compact") = false);
  m.def("dequantize", &dequantize, "wire rows back to float32 rows", pybind11::arg("wire"), pybind11::arg("bits"),
        pybind11::arg("num_features"), pybind11::arg("compact") = false);
}
