// CPU kernels for sparse x dense neighbour aggregation over a destination-sorted CSR.
//
// Layout: rowptr[N_dst + 1] (int64), col[E] (int32 or int64, source node of each
// CSR edge), optional weight[E] in CSR order, x[N_src, F] row-major.
// out[r, :] = reduce_{e in row r} weight[e] * x[col[e], :]
//
// Design (why):
//  * Rows are destination-clustered, so every output row is produced by exactly one
//    task and written once - no atomics, no zero-fill pass over the output.
//  * The inner loop keeps a block of FB output features in a fixed-size local array
//    that the compiler keeps in vector registers (FB=128 fp32 = 8 zmm / 16 ymm), so the
//    output row is reused from registers across all edges of the row.
//  * Gathered source rows are prefetched a few edges ahead: the gather is latency
//    bound (random 512 B rows), and prefetching keeps enough misses in flight.
//  * 2-D parallelism: row blocks balanced by (nnz + rows) via binary search on
//    rowptr, times feature groups when there are too few row blocks (tiny or
//    extremely skewed graphs). Dynamic scheduling absorbs the remaining imbalance.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__linux__)
#include <sys/mman.h>
#include <map>
#include <mutex>
#define LFG_HAVE_POOL 1
#endif

// ---------------------------------------------------------------- output pool
// Large outputs (N x F, hundreds of MiB) would otherwise be fresh mmaps from the default
// allocator on every call, and first-touch page faults then cost as much as the
// aggregation itself. Outputs are therefore taken from a small pool of recycled,
// 2 MiB-aligned buffers advised for transparent huge pages; a buffer returns to the pool
// when its tensor dies (training reuses the same shapes every step). Bounded in size.
namespace pool {
#ifdef LFG_HAVE_POOL
constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kMinPooled = size_t(8) << 20;
size_t max_pooled() {
  static size_t v = [] {
    const char* env = std::getenv("LIGHTNING_FULLGRAPH_POOL_MB");
    return (env ? static_cast<size_t>(std::atoll(env)) : size_t(2048)) << 20;
  }();
  return v;
}
struct Block { void* base; size_t mapped; };
std::mutex mu;
std::multimap<size_t, Block> free_blocks;  // keyed by usable (aligned) size
size_t pooled = 0;

void release(void* aligned, size_t usable, Block b) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (pooled + usable <= max_pooled()) {
      (void)aligned;
      free_blocks.emplace(usable, b);
      pooled += usable;
      return;
    }
  }
  munmap(b.base, b.mapped);
}

torch::Tensor empty(at::IntArrayRef sizes, const torch::TensorOptions& opts) {
  int64_t numel = 1;
  for (auto d : sizes) numel *= d;
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(opts.dtype()));
  if (bytes < kMinPooled || max_pooled() == 0) return torch::empty(sizes, opts);
  const size_t usable = (bytes + kHuge - 1) / kHuge * kHuge;
  Block b{nullptr, 0};
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = free_blocks.find(usable);
    if (it != free_blocks.end()) {
      b = it->second;
      free_blocks.erase(it);
      pooled -= usable;
    }
  }
  if (!b.base) {
    // A miss means the shapes changed (new graph or width): drop idle buffers of other
    // sizes instead of letting them pile up next to the new one.
    std::vector<Block> stale;
    {
      std::lock_guard<std::mutex> g(mu);
      for (auto& kv : free_blocks) stale.push_back(kv.second);
      free_blocks.clear();
      pooled = 0;
    }
    for (auto& sb : stale) munmap(sb.base, sb.mapped);
    b.mapped = usable + kHuge;
    b.base = mmap(nullptr, b.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b.base == MAP_FAILED) return torch::empty(sizes, opts);
#ifdef MADV_HUGEPAGE
    madvise(b.base, b.mapped, MADV_HUGEPAGE);
#endif
  }
  const uintptr_t raw = reinterpret_cast<uintptr_t>(b.base);
  void* aligned = reinterpret_cast<void*>((raw + kHuge - 1) / kHuge * kHuge);
  return torch::from_blob(aligned, sizes, [usable, b](void* p) { release(p, usable, b); }, opts);
}

void clear() {
  std::lock_guard<std::mutex> g(mu);
  for (auto& kv : free_blocks) munmap(kv.second.base, kv.second.mapped);
  free_blocks.clear();
  pooled = 0;
}
#else
torch::Tensor empty(at::IntArrayRef sizes, const torch::TensorOptions& opts) { return torch::empty(sizes, opts); }
void clear() {}
#endif
}  // namespace pool

namespace {

// Edges to prefetch ahead. Measured on a 2-core EPYC (1M nodes/16M edges): ~8 KiB in
// flight per core is best for 512 B rows (16 edges); narrow rows want more edges (32).
// -1 = this automatic choice; set_prefetch_distance() overrides it for tuning.
int64_t g_prefetch = -1;
inline int64_t prefetch_distance(int64_t row_bytes) {
  if (g_prefetch >= 0) return g_prefetch;
  return row_bytes >= 256 ? 16 : 32;
}

// Row splits with approximately equal cost rowptr[r] + r (non-zeros plus a per-row
// overhead), found by binary search since that cost is strictly increasing in r.
std::vector<int64_t> balanced_splits(const int64_t* rowptr, int64_t n, int64_t chunks) {
  chunks = std::max<int64_t>(1, std::min<int64_t>(chunks, std::max<int64_t>(n, 1)));
  std::vector<int64_t> splits(chunks + 1, 0);
  const int64_t total = rowptr[n] + n;
  for (int64_t k = 1; k < chunks; ++k) {
    const int64_t target = total * k / chunks;
    int64_t lo = splits[k - 1], hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (rowptr[mid] + mid < target) lo = mid + 1; else hi = mid;
    }
    splits[k] = lo;
  }
  splits[chunks] = n;
  return splits;
}

int num_threads() { return std::max(1, at::get_num_threads()); }

// Feature block widths tried from widest to narrowest; the widest that fits is used.
template <typename scalar_t>
constexpr int max_block() { return 512 / static_cast<int>(sizeof(scalar_t)); }  // 8 cache lines

template <typename scalar_t>
inline void prefetch_row(const scalar_t* p, int width) {
  constexpr int per_line = 64 / sizeof(scalar_t);
  for (int k = 0; k < width; k += per_line) __builtin_prefetch(p + k, 0, 1);
}

// ---------------------------------------------------------------- sum / mean
template <typename scalar_t, typename index_t, int FB, bool HAS_W, bool MEAN>
void sum_rows(const int64_t* __restrict rowptr, const index_t* __restrict col,
              const scalar_t* __restrict w, const scalar_t* __restrict x,
              scalar_t* __restrict out, int64_t F, int64_t r0, int64_t r1, int64_t f0,
              int64_t nnz, int64_t pf_width) {
  const int64_t pd = prefetch_distance(pf_width * static_cast<int64_t>(sizeof(scalar_t)));
  for (int64_t r = r0; r < r1; ++r) {
    alignas(64) scalar_t acc[FB];
#pragma GCC unroll 16
    for (int k = 0; k < FB; ++k) acc[k] = scalar_t(0);
    const int64_t e0 = rowptr[r], e1 = rowptr[r + 1];
    for (int64_t e = e0; e < e1; ++e) {
      if (pf_width > 0 && e + pd < nnz)
        prefetch_row(x + static_cast<int64_t>(col[e + pd]) * F + f0, static_cast<int>(pf_width));
      const scalar_t* __restrict xr = x + static_cast<int64_t>(col[e]) * F + f0;
      if (HAS_W) {
        const scalar_t we = w[e];
#pragma omp simd
        for (int k = 0; k < FB; ++k) acc[k] += we * xr[k];
      } else {
#pragma omp simd
        for (int k = 0; k < FB; ++k) acc[k] += xr[k];
      }
    }
    scalar_t* __restrict o = out + r * F + f0;
    if (MEAN) {
      const scalar_t inv = e1 > e0 ? scalar_t(1) / scalar_t(e1 - e0) : scalar_t(0);
#pragma omp simd
      for (int k = 0; k < FB; ++k) o[k] = acc[k] * inv;
    } else {
#pragma omp simd
      for (int k = 0; k < FB; ++k) o[k] = acc[k];
    }
  }
}

// Runtime-width tail (F not a multiple of the smallest block): scalar but rare.
template <typename scalar_t, typename index_t>
void sum_rows_tail(const int64_t* rowptr, const index_t* col, const scalar_t* w,
                   const scalar_t* x, scalar_t* out, int64_t F, int64_t r0, int64_t r1,
                   int64_t f0, int64_t width, bool mean) {
  for (int64_t r = r0; r < r1; ++r) {
    scalar_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t e0 = rowptr[r], e1 = rowptr[r + 1];
    for (int64_t e = e0; e < e1; ++e) {
      const scalar_t* xr = x + static_cast<int64_t>(col[e]) * F + f0;
      const scalar_t we = w ? w[e] : scalar_t(1);
      for (int64_t k = 0; k < width; ++k) acc[k] += we * xr[k];
    }
    const scalar_t inv = (mean && e1 > e0) ? scalar_t(1) / scalar_t(e1 - e0) : scalar_t(1);
    for (int64_t k = 0; k < width; ++k) out[r * F + f0 + k] = acc[k] * inv;
  }
}

template <typename scalar_t, typename index_t, int FB>
void sum_dispatch_flags(const int64_t* rowptr, const index_t* col, const scalar_t* w,
                        const scalar_t* x, scalar_t* out, int64_t F, int64_t r0, int64_t r1,
                        int64_t f0, bool mean, int64_t nnz, int64_t pf) {
  if (w) {
    if (mean) sum_rows<scalar_t, index_t, FB, true, true>(rowptr, col, w, x, out, F, r0, r1, f0, nnz, pf);
    else sum_rows<scalar_t, index_t, FB, true, false>(rowptr, col, w, x, out, F, r0, r1, f0, nnz, pf);
  } else {
    if (mean) sum_rows<scalar_t, index_t, FB, false, true>(rowptr, col, w, x, out, F, r0, r1, f0, nnz, pf);
    else sum_rows<scalar_t, index_t, FB, false, false>(rowptr, col, w, x, out, F, r0, r1, f0, nnz, pf);
  }
}

// A feature segment [f_begin, f_end) is processed with the widest block that fits.
// tiled: rows come in small tiles and the first block prefetches the whole segment of
// each source row, so later blocks find the rest of the row in cache (wide F).
template <typename scalar_t, typename index_t>
void sum_segment_rows(const int64_t* rowptr, const index_t* col, const scalar_t* w,
                      const scalar_t* x, scalar_t* out, int64_t F, int64_t r0, int64_t r1,
                      int64_t f_begin, int64_t f_end, bool mean, int64_t nnz, bool tiled) {
  constexpr int B = max_block<scalar_t>();
  int64_t f0 = f_begin;
  while (f0 < f_end) {
    const int64_t left = f_end - f0;
    const int64_t blk = left >= B ? B : left >= B / 2 ? B / 2 : left >= B / 4 ? B / 4
                      : left >= B / 8 ? B / 8 : left >= B / 16 ? B / 16 : 0;
    const int64_t pf = tiled ? (f0 == f_begin ? f_end - f_begin : 0) : blk;
    if (blk == B) sum_dispatch_flags<scalar_t, index_t, B>(rowptr, col, w, x, out, F, r0, r1, f0, mean, nnz, pf);
    else if (blk == B / 2) sum_dispatch_flags<scalar_t, index_t, B / 2>(rowptr, col, w, x, out, F, r0, r1, f0, mean, nnz, pf);
    else if (blk == B / 4) sum_dispatch_flags<scalar_t, index_t, B / 4>(rowptr, col, w, x, out, F, r0, r1, f0, mean, nnz, pf);
    else if (blk == B / 8) sum_dispatch_flags<scalar_t, index_t, B / 8>(rowptr, col, w, x, out, F, r0, r1, f0, mean, nnz, pf);
    else if (blk == B / 16) sum_dispatch_flags<scalar_t, index_t, B / 16>(rowptr, col, w, x, out, F, r0, r1, f0, mean, nnz, pf);
    else {
      const int64_t width = std::min<int64_t>(left, 8);
      sum_rows_tail<scalar_t, index_t>(rowptr, col, w, x, out, F, r0, r1, f0, width, mean);
      f0 += width;
      continue;
    }
    f0 += blk;
  }
}

template <typename scalar_t, typename index_t>
void sum_segment(const int64_t* rowptr, const index_t* col, const scalar_t* w,
                 const scalar_t* x, scalar_t* out, int64_t F, int64_t r0, int64_t r1,
                 int64_t f_begin, int64_t f_end, bool mean, int64_t nnz) {
  constexpr int B = max_block<scalar_t>();
  if (f_end - f_begin <= B) {
    sum_segment_rows<scalar_t, index_t>(rowptr, col, w, x, out, F, r0, r1, f_begin, f_end, mean, nnz, false);
    return;
  }
  constexpr int64_t kRowTile = 16;  // ~16 rows x 16 edges x 1 KiB source rows stay in L2
  for (int64_t rt = r0; rt < r1; rt += kRowTile)
    sum_segment_rows<scalar_t, index_t>(rowptr, col, w, x, out, F, rt, std::min(r1, rt + kRowTile), f_begin,
                                        f_end, mean, nnz, true);
}

// Task grid: row chunks x feature groups. Feature groups only when row chunks alone
// cannot feed all threads (few rows, or a handful of hub rows holding most edges).
struct Grid {
  std::vector<int64_t> splits;
  int64_t fgroups;
  int64_t fwidth;
};

template <typename scalar_t>
Grid make_grid(const int64_t* rowptr, int64_t n, int64_t F) {
  const int nt = num_threads();
  Grid g;
  g.splits = balanced_splits(rowptr, n, static_cast<int64_t>(nt) * 16);
  const int64_t chunks = static_cast<int64_t>(g.splits.size()) - 1;
  constexpr int64_t B = max_block<scalar_t>() / 4;  // feature groups are multiples of 32 fp32
  int64_t max_groups = std::max<int64_t>(1, (F + B - 1) / B);
  // A hub row cannot be split across row chunks; if one row alone exceeds a thread's
  // fair share, split the features instead so the hub's work spreads over threads.
  int64_t max_row = 0;
  for (int64_t r = 0; r < n; ++r) max_row = std::max<int64_t>(max_row, rowptr[r + 1] - rowptr[r]);
  const bool hub = max_row * 2 * nt > rowptr[n] && nt > 1;
  g.fgroups = (chunks >= 4 * nt && !hub) ? 1
              : std::min<int64_t>(max_groups, hub ? 2 * nt : (4 * nt + chunks - 1) / chunks);
  g.fwidth = ((F + g.fgroups - 1) / g.fgroups + B - 1) / B * B;
  g.fgroups = std::max<int64_t>(1, (F + g.fwidth - 1) / g.fwidth);
  return g;
}

void check_csr(const torch::Tensor& rowptr, const torch::Tensor& col, const torch::Tensor& x) {
  TORCH_CHECK(rowptr.device().is_cpu() && col.device().is_cpu() && x.device().is_cpu(),
              "lightning_fullgraph cpp kernels need CPU tensors");
  TORCH_CHECK(rowptr.scalar_type() == torch::kInt64, "rowptr must be int64");
  TORCH_CHECK(col.scalar_type() == torch::kInt32 || col.scalar_type() == torch::kInt64,
              "col must be int32 or int64");
  TORCH_CHECK(x.dim() == 2, "x must be 2-D [N_src, F]");
  TORCH_CHECK(rowptr.is_contiguous() && col.is_contiguous() && x.is_contiguous(),
              "inputs must be contiguous");
}

}  // namespace

torch::Tensor csr_sum(torch::Tensor rowptr, torch::Tensor col, c10::optional<torch::Tensor> weight,
                      torch::Tensor x, bool mean) {
  check_csr(rowptr, col, x);
  const int64_t n = rowptr.numel() - 1, F = x.size(1), nnz = col.numel();
  auto out = pool::empty({n, F}, x.options());
  if (n == 0 || F == 0) return out;
  torch::Tensor w;
  if (weight.has_value() && weight->defined()) {
    w = weight->to(x.scalar_type()).contiguous();
    TORCH_CHECK(w.numel() == nnz, "weight must have one entry per edge");
  }
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "csr_sum", [&] {
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "csr_sum_idx", [&] {
      const int64_t* rp = rowptr.data_ptr<int64_t>();
      const index_t* cp = col.data_ptr<index_t>();
      const scalar_t* wp = w.defined() ? w.data_ptr<scalar_t>() : nullptr;
      const scalar_t* xp = x.data_ptr<scalar_t>();
      scalar_t* op = out.data_ptr<scalar_t>();
      Grid g = make_grid<scalar_t>(rp, n, F);
      const int64_t chunks = static_cast<int64_t>(g.splits.size()) - 1;
      const int64_t tasks = chunks * g.fgroups;
_Pragma("omp parallel for schedule(dynamic, 1)")
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t c = t / g.fgroups, fg = t % g.fgroups;
        const int64_t fb = fg * g.fwidth, fe = std::min<int64_t>(F, fb + g.fwidth);
        sum_segment<scalar_t, index_t>(rp, cp, wp, xp, op, F, g.splits[c], g.splits[c + 1],
                                       fb, fe, mean, nnz);
      }
    });
  });
  return out;
}

// ---------------------------------------------------------------- max
// Returns (out, arg): arg[r, f] is the CSR position of the first edge attaining the max
// (or -1 for rows without edges, whose output is 0 like PyG's scatter 'max').
namespace {
// Branch-free select so the compiler vectorises the compare/blend over FB lanes.
template <typename scalar_t, typename index_t, int FB>
void max_rows(const int64_t* __restrict rowptr, const index_t* __restrict col,
              const scalar_t* __restrict w, const scalar_t* __restrict x,
              scalar_t* __restrict out, int64_t* __restrict arg, int64_t F, int64_t r0,
              int64_t r1, int64_t f0, int64_t nnz) {
  const int64_t pd = prefetch_distance(FB * sizeof(scalar_t));
  for (int64_t r = r0; r < r1; ++r) {
    alignas(64) scalar_t acc[FB];
    alignas(64) int64_t am[FB];
    for (int k = 0; k < FB; ++k) { acc[k] = -std::numeric_limits<scalar_t>::infinity(); am[k] = -1; }
    const int64_t e0 = rowptr[r], e1 = rowptr[r + 1];
    for (int64_t e = e0; e < e1; ++e) {
      if (e + pd < nnz)
        prefetch_row(x + static_cast<int64_t>(col[e + pd]) * F + f0, FB);
      const scalar_t* __restrict xr = x + static_cast<int64_t>(col[e]) * F + f0;
      const scalar_t we = w ? w[e] : scalar_t(1);
#pragma omp simd
      for (int k = 0; k < FB; ++k) {
        const scalar_t v = we * xr[k];
        // '>' keeps the first maximum (ties: earliest CSR position).
        const bool take = v > acc[k] || am[k] < 0;
        acc[k] = take ? v : acc[k];
        am[k] = take ? e : am[k];
      }
    }
    for (int k = 0; k < FB; ++k) {
      out[r * F + f0 + k] = am[k] < 0 ? scalar_t(0) : acc[k];
      arg[r * F + f0 + k] = am[k];
    }
  }
}

template <typename scalar_t, typename index_t>
void max_rows_tail(const int64_t* rowptr, const index_t* col, const scalar_t* w, const scalar_t* x,
                   scalar_t* out, int64_t* arg, int64_t F, int64_t r0, int64_t r1, int64_t f0,
                   int64_t width) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t k = 0; k < width; ++k) {
      scalar_t best = 0;
      int64_t am = -1;
      for (int64_t e = rowptr[r]; e < rowptr[r + 1]; ++e) {
        const scalar_t v = (w ? w[e] : scalar_t(1)) * x[static_cast<int64_t>(col[e]) * F + f0 + k];
        if (am < 0 || v > best) { best = v; am = e; }
      }
      out[r * F + f0 + k] = best;
      arg[r * F + f0 + k] = am;
    }
  }
}
}  // namespace

std::vector<torch::Tensor> csr_max(torch::Tensor rowptr, torch::Tensor col,
                                   c10::optional<torch::Tensor> weight, torch::Tensor x) {
  check_csr(rowptr, col, x);
  const int64_t n = rowptr.numel() - 1, F = x.size(1);
  auto out = pool::empty({n, F}, x.options());
  auto arg = pool::empty({n, F}, x.options().dtype(torch::kInt64));
  if (n == 0 || F == 0) return {out, arg};
  torch::Tensor w;
  if (weight.has_value() && weight->defined()) {
    w = weight->to(x.scalar_type()).contiguous();
    TORCH_CHECK(w.numel() == col.numel(), "weight must have one entry per edge");
  }
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "csr_max", [&] {
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "csr_max_idx", [&] {
      const int64_t* rp = rowptr.data_ptr<int64_t>();
      const index_t* cp = col.data_ptr<index_t>();
      const scalar_t* wp = w.defined() ? w.data_ptr<scalar_t>() : nullptr;
      const scalar_t* xp = x.data_ptr<scalar_t>();
      scalar_t* op = out.data_ptr<scalar_t>();
      int64_t* ap = arg.data_ptr<int64_t>();
      constexpr int FB = 32;
      Grid g = make_grid<scalar_t>(rp, n, F);
      const int64_t chunks = static_cast<int64_t>(g.splits.size()) - 1;
      const int64_t tasks = chunks * g.fgroups;
_Pragma("omp parallel for schedule(dynamic, 1)")
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t c = t / g.fgroups, fg = t % g.fgroups;
        const int64_t fb = fg * g.fwidth, fe = std::min<int64_t>(F, fb + g.fwidth);
        int64_t f0 = fb;
        for (; f0 + FB <= fe; f0 += FB)
          max_rows<scalar_t, index_t, FB>(rp, cp, wp, xp, op, ap, F, g.splits[c], g.splits[c + 1], f0,
                                           col.numel());
        for (; f0 + 8 <= fe; f0 += 8)
          max_rows<scalar_t, index_t, 8>(rp, cp, wp, xp, op, ap, F, g.splits[c], g.splits[c + 1], f0,
                                          col.numel());
        if (f0 < fe)
          max_rows_tail<scalar_t, index_t>(rp, cp, wp, xp, op, ap, F, g.splits[c], g.splits[c + 1], f0,
                                           fe - f0);
      }
    });
  });
  return {out, arg};
}

// ---------------------------------------------------------------- edge dot (SDDMM)
// out[e] = <a[r, :], b[col[e], :]> for every CSR edge e of row r; the gradient of a
// per-edge weight for sum/mean aggregation (a = grad_out, b = x).
torch::Tensor csr_edge_dot(torch::Tensor rowptr, torch::Tensor col, torch::Tensor a,
                           torch::Tensor b) {
  check_csr(rowptr, col, b);
  TORCH_CHECK(a.is_contiguous() && a.dim() == 2 && a.size(1) == b.size(1), "bad shapes");
  const int64_t n = rowptr.numel() - 1, F = b.size(1), nnz = col.numel();
  auto out = torch::empty({nnz}, b.options());
  if (nnz == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(b.scalar_type(), "csr_edge_dot", [&] {
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "csr_edge_dot_idx", [&] {
      const int64_t* rp = rowptr.data_ptr<int64_t>();
      const index_t* cp = col.data_ptr<index_t>();
      const scalar_t* ap = a.data_ptr<scalar_t>();
      const scalar_t* bp = b.data_ptr<scalar_t>();
      scalar_t* op = out.data_ptr<scalar_t>();
      auto splits = balanced_splits(rp, n, static_cast<int64_t>(num_threads()) * 16);
      const int64_t pd = prefetch_distance(F * static_cast<int64_t>(sizeof(scalar_t)));
      const int64_t chunks = static_cast<int64_t>(splits.size()) - 1;
_Pragma("omp parallel for schedule(dynamic, 1)")
      for (int64_t c = 0; c < chunks; ++c) {
        for (int64_t r = splits[c]; r < splits[c + 1]; ++r) {
          const scalar_t* __restrict ar = ap + r * F;
          for (int64_t e = rp[r]; e < rp[r + 1]; ++e) {
            if (e + pd < nnz)
              prefetch_row(bp + static_cast<int64_t>(cp[e + pd]) * F,
                           static_cast<int>(std::min<int64_t>(F, 1024)));
            const scalar_t* __restrict br = bp + static_cast<int64_t>(cp[e]) * F;
            scalar_t s = 0;
_Pragma("omp simd reduction(+ : s)")
            for (int64_t k = 0; k < F; ++k) s += ar[k] * br[k];
            op[e] = s;
          }
        }
      }
    });
  });
  return out;
}

// ---------------------------------------------------------------- counting sort
// Stable permutation sorting `keys` (values in [0, n)) in O(E + n): builds the CSR
// permutation without a comparison sort (argsort of 16M keys costs seconds).
torch::Tensor counting_sort_perm(torch::Tensor keys, int64_t n) {
  TORCH_CHECK(keys.device().is_cpu() && keys.dim() == 1, "keys must be a 1-D CPU tensor");
  keys = keys.to(torch::kInt64).contiguous();
  const int64_t e = keys.numel();
  const int64_t* k = keys.data_ptr<int64_t>();
  std::vector<int64_t> offset(n + 1, 0);
  for (int64_t i = 0; i < e; ++i) {
    TORCH_CHECK(k[i] >= 0 && k[i] < n, "key out of range");
    ++offset[k[i] + 1];
  }
  for (int64_t i = 0; i < n; ++i) offset[i + 1] += offset[i];
  auto perm = torch::empty({e}, keys.options());
  int64_t* p = perm.data_ptr<int64_t>();
  for (int64_t i = 0; i < e; ++i) p[offset[k[i]]++] = i;
  return perm;
}

void set_prefetch_distance(int64_t d) { g_prefetch = d < 0 ? -1 : d; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_prefetch_distance", &set_prefetch_distance, "edges prefetched ahead (tuning)");
  m.def("clear_pool", &pool::clear, "release pooled output buffers");
  m.def("counting_sort_perm", &counting_sort_perm, "stable counting-sort permutation");
  m.def("csr_sum", &csr_sum, "CSR sum/mean aggregation");
  m.def("csr_max", &csr_max, "CSR max aggregation with arg-max");
  m.def("csr_edge_dot", &csr_edge_dot, "per-edge dot product (SDDMM)");
}
