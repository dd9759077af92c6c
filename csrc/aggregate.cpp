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
#include "huge_pages.h"
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>
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
//
// An idle buffer is memory no tensor uses, and it may sit there through the step's peak. So a
// size is pooled only while it pays: a buffer that was dropped unused (a request of another
// size came first) counts against its size, a reuse for it; a size with more of the former
// than of the latter is not kept anymore.  Measured on a partitioned 2-layer GCN (1M nodes,
// P = 4): its aggregations alternate between two sizes, one buffer in three was reused, and
// the idle one held 19-27 MiB through the backward's peak; repeated calls of one size (the
// kernels' benchmark, layers of equal width) are reused every time.
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
int64_t hits = 0, misses = 0;  // pooled-size requests served from / not from the pool
struct Record { int64_t reused = 0, dropped = 0; };
std::map<size_t, Record> history;  // by usable size; reset by clear()

void release(void* aligned, size_t usable, Block b) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (history.size() > 256) history.clear();  // many shapes come and go: start over
    const Record& r = history[usable];
    // Not while the block cache is on: empty() does not take from the pool then.
    if (r.dropped <= r.reused && pooled + usable <= max_pooled() && !huge_pages::caching()) {
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
  // With the huge-page allocator's block cache on, it reuses these outputs too (see
  // huge_pages.h): two caches would each keep blocks the other's rule cannot see.
  if (bytes < kMinPooled || max_pooled() == 0 || huge_pages::caching())
    return torch::empty(sizes, opts);
  const size_t usable = (bytes + kHuge - 1) / kHuge * kHuge;
  Block b{nullptr, 0};
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = free_blocks.find(usable);
    if (it != free_blocks.end()) {
      b = it->second;
      free_blocks.erase(it);
      pooled -= usable;
      ++hits;
      ++history[usable].reused;
    } else {
      ++misses;
    }
  }
  if (!b.base) {
    // A miss means the shapes changed (new graph or width): drop idle buffers of other
    // sizes instead of letting them pile up next to the new one.
    std::vector<Block> stale;
    {
      std::lock_guard<std::mutex> g(mu);
      for (auto& kv : free_blocks) {
        stale.push_back(kv.second);
        ++history[kv.first].dropped;
      }
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
  history.clear();
  pooled = 0;
}

// [hits, misses, idle bytes, idle buffers, byte limit]
std::vector<int64_t> stats() {
  std::lock_guard<std::mutex> g(mu);
  return {hits, misses, static_cast<int64_t>(pooled), static_cast<int64_t>(free_blocks.size()),
          static_cast<int64_t>(max_pooled())};
}
#else
torch::Tensor empty(at::IntArrayRef sizes, const torch::TensorOptions& opts) { return torch::empty(sizes, opts); }
void clear() {}
std::vector<int64_t> stats() { return {0, 0, 0, 0, 0}; }
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

// ---------------------------------------------------------------- element types
// Sums accumulate in acc_t: double for double inputs, float otherwise, so bfloat16 rows
// (mixed precision) are summed in float32 and rounded once, when the row is stored.
// bfloat16 is the upper half of a float32: loading is a shift, which vectorises; storing
// rounds to nearest even (NaN stays NaN), branch-free so that it vectorises too.
template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

inline float load(float v) { return v; }
inline double load(double v) { return v; }
inline float load(c10::BFloat16 v) {
  const uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <typename out_t, typename acc_t> inline out_t store(acc_t v) { return static_cast<out_t>(v); }
template <> inline c10::BFloat16 store<c10::BFloat16, float>(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  c10::BFloat16 out;
  out.x = static_cast<uint16_t>(v != v ? 0x7FC0u : rounded);
  return out;
}

// Feature block widths tried from widest to narrowest; the widest that fits is used.
// Sized by the accumulator (512 B: 8 zmm registers), so a bfloat16 block spans 256 B.
template <typename scalar_t>
constexpr int max_block() { return 512 / static_cast<int>(sizeof(typename Acc<scalar_t>::type)); }

template <typename scalar_t>
inline void prefetch_row(const scalar_t* p, int width) {
  constexpr int per_line = 64 / sizeof(scalar_t);
  for (int k = 0; k < width; k += per_line) __builtin_prefetch(p + k, 0, 1);
}

// ---------------------------------------------------------------- sum / mean
// x holds scalar_t, out gets out_t (scalar_t, or float for bfloat16 inputs whose weights
// are float: PyG's message weight * x_j is promoted then), w holds acc_t.
// WMODE: 0 no weights, 1 w[e], 2 w[wperm[e]] -- backward reads the forward's CSR-order
// weights through the transposed CSR's positions instead of a separate gather pass that
// permutes them first: one random 4-8 B read per edge, in flight beside the row it scales.
// STORE = false: the row-read floor (csr_row_read below): out is a [threads, F] acc_t buffer and
// each row's sums are added to the calling thread's row of it instead of being stored.
template <typename scalar_t, typename out_t, typename index_t, int FB, int WMODE, bool MEAN, bool STORE = true>
void sum_rows(const int64_t* __restrict rowptr, const index_t* __restrict col,
              const typename Acc<scalar_t>::type* __restrict w, const index_t* __restrict wperm,
              const scalar_t* __restrict x, out_t* __restrict out, int64_t F, int64_t r0,
              int64_t r1, int64_t f0, int64_t nnz, int64_t pf_width) {
  using acc_t = typename Acc<scalar_t>::type;
  const int64_t pd = prefetch_distance(pf_width * static_cast<int64_t>(sizeof(scalar_t)));
  int thread = 0;
#ifdef _OPENMP
  if constexpr (!STORE) thread = omp_get_thread_num();
#endif
  for (int64_t r = r0; r < r1; ++r) {
    alignas(64) acc_t acc[FB];
#pragma GCC unroll 16
    for (int k = 0; k < FB; ++k) acc[k] = acc_t(0);
    const int64_t e0 = rowptr[r], e1 = rowptr[r + 1];
    for (int64_t e = e0; e < e1; ++e) {
      if (pf_width > 0 && e + pd < nnz) {
        prefetch_row(x + static_cast<int64_t>(col[e + pd]) * F + f0, static_cast<int>(pf_width));
        if (WMODE == 2) __builtin_prefetch(w + wperm[e + pd], 0, 1);
      }
      const scalar_t* __restrict xr = x + static_cast<int64_t>(col[e]) * F + f0;
      if (WMODE != 0) {
        const acc_t we = WMODE == 2 ? w[wperm[e]] : w[e];
#pragma omp simd
        for (int k = 0; k < FB; ++k) acc[k] += we * load(xr[k]);
      } else {
#pragma omp simd
        for (int k = 0; k < FB; ++k) acc[k] += load(xr[k]);
      }
    }
    if constexpr (!STORE) {
      out_t* __restrict sink = out + static_cast<int64_t>(thread) * F + f0;
#pragma omp simd
      for (int k = 0; k < FB; ++k) sink[k] += acc[k];
      continue;
    }
    out_t* __restrict o = out + r * F + f0;
    if (MEAN) {
      const acc_t inv = e1 > e0 ? acc_t(1) / acc_t(e1 - e0) : acc_t(0);
#pragma omp simd
      for (int k = 0; k < FB; ++k) o[k] = store<out_t, acc_t>(acc[k] * inv);
    } else {
#pragma omp simd
      for (int k = 0; k < FB; ++k) o[k] = store<out_t, acc_t>(acc[k]);
    }
  }
}

// Runtime-width tail (F not a multiple of the smallest block): scalar but rare.
template <typename scalar_t, typename out_t, typename index_t>
void sum_rows_tail(const int64_t* rowptr, const index_t* col, const typename Acc<scalar_t>::type* w,
                   const index_t* wperm, const scalar_t* x, out_t* out, int64_t F, int64_t r0,
                   int64_t r1, int64_t f0, int64_t width, bool mean) {
  using acc_t = typename Acc<scalar_t>::type;
  for (int64_t r = r0; r < r1; ++r) {
    acc_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t e0 = rowptr[r], e1 = rowptr[r + 1];
    for (int64_t e = e0; e < e1; ++e) {
      const scalar_t* xr = x + static_cast<int64_t>(col[e]) * F + f0;
      const acc_t we = w ? (wperm ? w[wperm[e]] : w[e]) : acc_t(1);
      for (int64_t k = 0; k < width; ++k) acc[k] += we * load(xr[k]);
    }
    const acc_t inv = (mean && e1 > e0) ? acc_t(1) / acc_t(e1 - e0) : acc_t(1);
    for (int64_t k = 0; k < width; ++k) out[r * F + f0 + k] = store<out_t, acc_t>(acc[k] * inv);
  }
}

template <typename scalar_t, typename out_t, typename index_t, int FB, bool STORE = true>
void sum_dispatch_flags(const int64_t* rowptr, const index_t* col, const typename Acc<scalar_t>::type* w,
                        const index_t* wperm, const scalar_t* x, out_t* out, int64_t F, int64_t r0,
                        int64_t r1, int64_t f0, bool mean, int64_t nnz, int64_t pf) {
  if constexpr (!STORE) {  // the floor: unweighted sums only
    sum_rows<scalar_t, out_t, index_t, FB, 0, false, false>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, nnz, pf);
    return;
  }
  // Mean is never weighted through a permutation (only backward's plain sums are).
  if (w && wperm) {
    sum_rows<scalar_t, out_t, index_t, FB, 2, false>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, nnz, pf);
  } else if (w) {
    if (mean) sum_rows<scalar_t, out_t, index_t, FB, 1, true>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, nnz, pf);
    else sum_rows<scalar_t, out_t, index_t, FB, 1, false>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, nnz, pf);
  } else {
    if (mean) sum_rows<scalar_t, out_t, index_t, FB, 0, true>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, nnz, pf);
    else sum_rows<scalar_t, out_t, index_t, FB, 0, false>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, nnz, pf);
  }
}

// A feature segment [f_begin, f_end) is processed with the widest block that fits.
// tiled: rows come in small tiles and the first block prefetches the whole segment of
// each source row, so later blocks find the rest of the row in cache (wide F).
template <typename scalar_t, typename out_t, typename index_t, bool STORE = true>
void sum_segment_rows(const int64_t* rowptr, const index_t* col, const typename Acc<scalar_t>::type* w,
                      const index_t* wperm, const scalar_t* x, out_t* out, int64_t F, int64_t r0,
                      int64_t r1, int64_t f_begin, int64_t f_end, bool mean, int64_t nnz, bool tiled) {
  constexpr int B = max_block<scalar_t>();
  int64_t f0 = f_begin;
  while (f0 < f_end) {
    const int64_t left = f_end - f0;
    const int64_t blk = left >= B ? B : left >= B / 2 ? B / 2 : left >= B / 4 ? B / 4
                      : left >= B / 8 ? B / 8 : left >= B / 16 ? B / 16 : 0;
    const int64_t pf = tiled ? (f0 == f_begin ? f_end - f_begin : 0) : blk;
    if (blk == B) sum_dispatch_flags<scalar_t, out_t, index_t, B, STORE>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, mean, nnz, pf);
    else if (blk == B / 2) sum_dispatch_flags<scalar_t, out_t, index_t, B / 2, STORE>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, mean, nnz, pf);
    else if (blk == B / 4) sum_dispatch_flags<scalar_t, out_t, index_t, B / 4, STORE>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, mean, nnz, pf);
    else if (blk == B / 8) sum_dispatch_flags<scalar_t, out_t, index_t, B / 8, STORE>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, mean, nnz, pf);
    else if (blk == B / 16) sum_dispatch_flags<scalar_t, out_t, index_t, B / 16, STORE>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, mean, nnz, pf);
    else {
      const int64_t width = std::min<int64_t>(left, 8);
      if constexpr (STORE)  // (the floor takes F % 8 == 0 only, so it never gets here)
        sum_rows_tail<scalar_t, out_t, index_t>(rowptr, col, w, wperm, x, out, F, r0, r1, f0, width, mean);
      f0 += width;
      continue;
    }
    f0 += blk;
  }
}

template <typename scalar_t, typename out_t, typename index_t, bool STORE = true>
void sum_segment(const int64_t* rowptr, const index_t* col, const typename Acc<scalar_t>::type* w,
                 const index_t* wperm, const scalar_t* x, out_t* out, int64_t F, int64_t r0,
                 int64_t r1, int64_t f_begin, int64_t f_end, bool mean, int64_t nnz) {
  constexpr int B = max_block<scalar_t>();
  if (f_end - f_begin <= B) {
    sum_segment_rows<scalar_t, out_t, index_t, STORE>(rowptr, col, w, wperm, x, out, F, r0, r1, f_begin, f_end, mean,
                                                      nnz, false);
    return;
  }
  constexpr int64_t kRowTile = 16;  // ~16 rows x 16 edges x 1 KiB source rows stay in L2
  for (int64_t rt = r0; rt < r1; rt += kRowTile)
    sum_segment_rows<scalar_t, out_t, index_t, STORE>(rowptr, col, w, wperm, x, out, F, rt,
                                                      std::min(r1, rt + kRowTile), f_begin, f_end, mean, nnz, true);
}

// Task grid: row chunks x feature groups. Feature groups only when row chunks alone
// cannot feed all threads (few rows, or a handful of hub rows holding most edges).
struct Grid {
  std::vector<int64_t> splits;
  int64_t fgroups;
  int64_t fwidth;
};

template <typename scalar_t>
Grid make_grid(const int64_t* rowptr, int64_t n, int64_t F, int64_t max_row) {
  const int nt = num_threads();
  Grid g;
  g.splits = balanced_splits(rowptr, n, static_cast<int64_t>(nt) * 16);
  const int64_t chunks = static_cast<int64_t>(g.splits.size()) - 1;
  constexpr int64_t B = max_block<scalar_t>() / 4;  // feature groups are multiples of 32 fp32
  int64_t max_groups = std::max<int64_t>(1, (F + B - 1) / B);
  // A hub row cannot be split across row chunks; if one row alone exceeds a thread's
  // fair share, split the features instead so the hub's work spreads over threads.
  // (max_row, the largest row length, comes from the validation pass over rowptr.)
  const bool hub = max_row * 2 * nt > rowptr[n] && nt > 1;
  g.fgroups = (chunks >= 4 * nt && !hub) ? 1
              : std::min<int64_t>(max_groups, hub ? 2 * nt : (4 * nt + chunks - 1) / chunks);
  g.fwidth = ((F + g.fgroups - 1) / g.fgroups + B - 1) / B * B;
  g.fgroups = std::max<int64_t>(1, (F + g.fwidth - 1) / g.fwidth);
  return g;
}

// Runs fn(r0, r1, f_begin, f_end) for every (row chunk, feature group) task of the grid,
// dynamically scheduled over the OpenMP threads.
template <typename Fn>
void for_each_task(const Grid& g, int64_t F, const Fn& fn) {
  const int64_t chunks = static_cast<int64_t>(g.splits.size()) - 1;
  const int64_t tasks = chunks * g.fgroups;
_Pragma("omp parallel for schedule(dynamic, 1)")
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t c = t / g.fgroups, fg = t % g.fgroups;
    const int64_t fb = fg * g.fwidth, fe = std::min<int64_t>(F, fb + g.fwidth);
    fn(g.splits[c], g.splits[c + 1], fb, fe);
  }
}

// ---------------------------------------------------------------- validation
// Every kernel reads x[col[e]] for e in [rowptr[r], rowptr[r + 1]) without bounds checks,
// so a CSR that breaks an invariant would read (or, for edge_dot, write) out of bounds.
// Each op therefore validates its CSR first: O(1) shape checks, then one OpenMP region
// over rowptr (min reduction of the first decreasing position, max reduction of the row
// length, which the task grid needs anyway) and col (min/max of the values). That reads
// the index arrays once: 8 B per row + 4 or 8 B per edge, next to the E * F * sizeof(scalar)
// bytes of the gather itself; pairs validated before and unchanged since are not read
// again (vcache below). Only on a violation is col scanned again, serially, for the first
// offending position named in the error.
void check_inputs(const char* op, const torch::Tensor& rowptr, const torch::Tensor& col,
                  const torch::Tensor& x) {
  TORCH_CHECK(rowptr.device().is_cpu() && col.device().is_cpu() && x.device().is_cpu(),
              op, ": lightning_fullgraph cpp kernels need CPU tensors");
  TORCH_CHECK_VALUE(rowptr.scalar_type() == torch::kInt64, op, ": rowptr must be int64, got ",
                    rowptr.scalar_type());
  TORCH_CHECK_VALUE(col.scalar_type() == torch::kInt32 || col.scalar_type() == torch::kInt64, op,
                    ": col must be int32 or int64, got ", col.scalar_type());
  TORCH_CHECK_VALUE(rowptr.dim() == 1 && col.dim() == 1, op, ": rowptr and col must be 1-D, got ",
                    rowptr.dim(), "-D and ", col.dim(), "-D");
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": x must be 2-D [N_src, F], got ", x.dim(), "-D");
  TORCH_CHECK_VALUE(rowptr.is_contiguous() && col.is_contiguous() && x.is_contiguous(), op,
                    ": inputs must be contiguous");
}

torch::Tensor checked_weight(const char* op, const c10::optional<torch::Tensor>& weight, int64_t nnz,
                             const torch::TensorOptions& like) {
  if (!weight.has_value() || !weight->defined()) return torch::Tensor();
  TORCH_CHECK(weight->device().is_cpu(), op, ": lightning_fullgraph cpp kernels need CPU tensors (weight)");
  TORCH_CHECK_VALUE(weight->numel() == nnz, op, ": weight must have one entry per edge: nnz = col.numel() = ", nnz,
                    ", got weight.numel() = ", weight->numel());
  return weight->to(c10::typeMetaToScalarType(like.dtype())).contiguous();
}

// Checks rowptr[0] == 0, rowptr[N] == nnz, rowptr non-decreasing and col in [0, n_src)
// in one parallel region (one fork/join): a min reduction of the first decreasing
// position and a max reduction of the row length over rowptr, min/max reductions of the
// values over col. Returns the largest row length (used by make_grid); col's min/max go
// to lo_out/hi_out.
template <typename index_t>
int64_t validate_pass(const char* op, const int64_t* rp, int64_t n, const index_t* cp, int64_t nnz, int64_t n_src,
                      int64_t& lo_out, int64_t& hi_out) {
  TORCH_CHECK_VALUE(rp[0] == 0, op, ": invalid CSR: rowptr[0] must be 0, got ", rp[0]);
  TORCH_CHECK_VALUE(rp[n] == nnz, op, ": invalid CSR: rowptr[-1] = rowptr[", n, "] must equal nnz = col.numel() = ",
                    nnz, ", got ", rp[n]);
  int64_t first_bad = n, max_row = 0;
  index_t lo = std::numeric_limits<index_t>::max(), hi = std::numeric_limits<index_t>::min();
  // Below ~1 MiB of indices one thread reads them faster than a fork/join costs.
  const bool parallel = n + nnz > (int64_t(1) << 18) && num_threads() > 1;
#pragma omp parallel if (parallel)
  {
    // (plain 'omp for': the loops auto-vectorise; 'omp for simd' measured 2.5x slower here)
#pragma omp for reduction(min : first_bad) reduction(max : max_row) nowait
    for (int64_t i = 0; i < n; ++i) {
      // unsigned difference: no overflow on garbage input (only trusted when no row is bad)
      const int64_t d = static_cast<int64_t>(static_cast<uint64_t>(rp[i + 1]) - static_cast<uint64_t>(rp[i]));
      first_bad = std::min(first_bad, rp[i + 1] < rp[i] ? i : n);
      max_row = std::max(max_row, d);
    }
#pragma omp for reduction(min : lo) reduction(max : hi) nowait
    for (int64_t e = 0; e < nnz; ++e) {
      lo = std::min(lo, cp[e]);
      hi = std::max(hi, cp[e]);
    }
  }  // the region's closing barrier completes both reductions
  TORCH_CHECK_VALUE(first_bad == n, op, ": invalid CSR: rowptr must be non-decreasing; first violation at rowptr[",
                    first_bad, "] = ", first_bad < n ? rp[first_bad] : 0, " > rowptr[", first_bad + 1, "] = ",
                    first_bad < n ? rp[first_bad + 1] : 0);
  lo_out = nnz > 0 ? static_cast<int64_t>(lo) : 0;
  hi_out = nnz > 0 ? static_cast<int64_t>(hi) : -1;
  if (nnz == 0 || (lo >= 0 && static_cast<int64_t>(hi) < n_src)) return max_row;
  int64_t first = 0;  // error path only: the first offending position
  while (first < nnz && cp[first] >= 0 && static_cast<int64_t>(cp[first]) < n_src) ++first;
  TORCH_CHECK_INDEX(false, op, ": invalid CSR: col entries must lie in [0, N_src) = [0, ", n_src,
                    ") where N_src = rows of the source features; first offending position col[",
                    first, "] = ", static_cast<int64_t>(cp[first]), " (col min ", lo_out, ", max ", hi_out, ")");
  return max_row;
}

int64_t validate_csr_uncached(const char* op, const torch::Tensor& rowptr, const torch::Tensor& col, int64_t n_src,
                              int64_t& lo, int64_t& hi) {
  TORCH_CHECK_VALUE(rowptr.numel() >= 1, op, ": invalid CSR: rowptr must have N_dst + 1 >= 1 entries, got 0");
  int64_t max_row = 0;
  AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "validate_csr", [&] {
    max_row = validate_pass<index_t>(op, rowptr.data_ptr<int64_t>(), rowptr.numel() - 1, col.data_ptr<index_t>(),
                                     col.numel(), n_src, lo, hi);
  });
  return max_row;
}

// Already-validated (rowptr, col) pairs, so that training, which passes the same CSR
// tensors every step, does not re-read the index arrays on every call. A pair is
// recognised by the identity of both tensors (TensorImpl address, held through a weak
// reference so that no other tensor can get that address while the entry exists, without
// keeping the tensor's memory alive), their data pointer, numel, dtype and *version
// counter*, which every in-place op bumps, also through views. Any difference means the
// tensor changed (or is another tensor) and it is validated again. Writes PyTorch does
// not track (through .numpy(), .data, DLPack or raw pointers) are not seen;
// set_validation_cache_size(0) validates on every call. Inference tensors have no
// version counter and are never cached.
namespace vcache {
using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
struct Key {
  WeakImpl impl;
  const void* data;
  int64_t numel, version;
  c10::ScalarType dtype;
  explicit Key(const torch::Tensor& t)
      : impl(t.getIntrusivePtr()), data(t.data_ptr()), numel(t.numel()), version(t._version()),
        dtype(t.scalar_type()) {}
  bool matches(const torch::Tensor& t) const {
    // While `impl` is held (even expired) no other TensorImpl can live at its address.
    return impl._unsafe_get_target() == t.unsafeGetTensorImpl() && !impl.expired() && data == t.data_ptr() &&
           numel == t.numel() && dtype == t.scalar_type() && version == t._version();
  }
};
struct Entry {
  Key rowptr, col;
  int64_t lo, hi, max_row;
};
std::mutex mu;
// Most recently used last. Never destroyed: releasing TensorImpl references during static
// destruction at exit (after Python is gone) is not worth the risk.
std::vector<Entry>& entries = *new std::vector<Entry>();
size_t capacity = 8;
int64_t hits = 0, misses = 0;

bool cacheable(const torch::Tensor& rowptr, const torch::Tensor& col) {
  std::lock_guard<std::mutex> g(mu);
  return capacity > 0 && !rowptr.is_inference() && !col.is_inference();
}

// Largest row length of an unchanged validated pair whose columns lie in [0, n_src), or -1.
int64_t lookup(const torch::Tensor& rowptr, const torch::Tensor& col, int64_t n_src) {
  std::lock_guard<std::mutex> g(mu);
  for (size_t i = entries.size(); i-- > 0;) {
    Entry& e = entries[i];
    if (e.rowptr.impl.expired() || e.col.impl.expired()) {
      entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (e.rowptr.matches(rowptr) && e.col.matches(col)) {
      if (e.lo < 0 || e.hi >= n_src) { ++misses; return -1; }  // fewer source rows now: validate (and raise)
      const int64_t max_row = e.max_row;
      ++hits;
      std::rotate(entries.begin() + static_cast<std::ptrdiff_t>(i), entries.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                  entries.end());
      return max_row;
    }
  }
  ++misses;
  return -1;
}

void insert(Key rowptr, Key col, int64_t lo, int64_t hi, int64_t max_row) {
  std::lock_guard<std::mutex> g(mu);
  if (capacity == 0) return;
  while (entries.size() >= capacity) entries.erase(entries.begin());
  entries.push_back(Entry{std::move(rowptr), std::move(col), lo, hi, max_row});
}

std::vector<int64_t> info() {
  std::lock_guard<std::mutex> g(mu);
  return {hits, misses, static_cast<int64_t>(entries.size()), static_cast<int64_t>(capacity)};
}

void set_capacity(int64_t n) {
  std::lock_guard<std::mutex> g(mu);
  capacity = static_cast<size_t>(std::max<int64_t>(0, n));
  while (entries.size() > capacity) entries.erase(entries.begin());
}
}  // namespace vcache

// validate_csr_uncached, skipped for a pair already validated and unchanged since.
int64_t validate_csr(const char* op, const torch::Tensor& rowptr, const torch::Tensor& col, int64_t n_src) {
  int64_t lo, hi;
  if (!vcache::cacheable(rowptr, col)) return validate_csr_uncached(op, rowptr, col, n_src, lo, hi);
  const int64_t hit = vcache::lookup(rowptr, col, n_src);
  if (hit >= 0) return hit;
  // Keys (versions) are taken before the data is read: a write racing with the
  // validation leaves an outdated version in the key, so the pair is checked again.
  vcache::Key krp(rowptr), kcol(col);
  const int64_t max_row = validate_csr_uncached(op, rowptr, col, n_src, lo, hi);
  vcache::insert(std::move(krp), std::move(kcol), lo, hi, max_row);
  return max_row;
}

}  // namespace

namespace {
template <typename scalar_t, typename out_t>
void run_csr_sum(const torch::Tensor& rowptr, const torch::Tensor& col, const torch::Tensor& w,
                 const torch::Tensor& wperm, const torch::Tensor& x, torch::Tensor& out, bool mean,
                 int64_t max_row) {
  using acc_t = typename Acc<scalar_t>::type;
  const int64_t n = rowptr.numel() - 1, F = x.size(1), nnz = col.numel();
  AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "csr_sum_idx", [&] {
    const int64_t* rp = rowptr.data_ptr<int64_t>();
    const index_t* cp = col.data_ptr<index_t>();
    const acc_t* wp = w.defined() ? w.data_ptr<acc_t>() : nullptr;
    const index_t* pp = wperm.defined() ? wperm.data_ptr<index_t>() : nullptr;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    out_t* op = out.data_ptr<out_t>();
    for_each_task(make_grid<scalar_t>(rp, n, F, max_row), F,
                  [&](int64_t r0, int64_t r1, int64_t fb, int64_t fe) {
                    sum_segment<scalar_t, out_t, index_t>(rp, cp, wp, pp, xp, op, F, r0, r1, fb, fe, mean, nnz);
                  });
  });
}
}  // namespace

// x: float32, float64 or bfloat16 (summed in float32). promote: a bfloat16 x gives a
// float32 output (what PyG computes when the edge weights are float32); otherwise the
// output has x's dtype. Weights are read in the accumulation type. weight_perm: edge e is
// weighted by weight[weight_perm[e]] (int, col's dtype, values trusted to lie in
// [0, weight.numel()): the caller validates them, as take_values' callers do); not with mean.
torch::Tensor csr_sum(torch::Tensor rowptr, torch::Tensor col, c10::optional<torch::Tensor> weight,
                      torch::Tensor x, bool mean, bool promote,
                      c10::optional<torch::Tensor> weight_perm) {
  check_inputs("csr_sum", rowptr, col, x);
  const auto st = x.scalar_type();
  TORCH_CHECK_VALUE(st == torch::kFloat || st == torch::kDouble || st == torch::kBFloat16,
                    "csr_sum: x must be float32, float64 or bfloat16, got ", st);
  const bool reduced = st == torch::kBFloat16;
  const auto acc = reduced ? torch::kFloat : st;
  torch::Tensor w = checked_weight("csr_sum", weight, col.numel(), x.options().dtype(acc));
  torch::Tensor wperm;
  if (weight_perm.has_value() && weight_perm->defined()) {
    TORCH_CHECK_VALUE(w.defined() && !mean, "csr_sum: weight_perm needs a weight and a sum (not mean)");
    TORCH_CHECK_VALUE(weight_perm->device().is_cpu() && weight_perm->dim() == 1 &&
                          weight_perm->numel() == col.numel() && weight_perm->scalar_type() == col.scalar_type(),
                      "csr_sum: weight_perm must be a 1-D CPU tensor of col's dtype with one entry per edge");
    wperm = weight_perm->contiguous();
  }
  const int64_t max_row = validate_csr("csr_sum", rowptr, col, x.size(0));
  const int64_t n = rowptr.numel() - 1, F = x.size(1);
  auto out = pool::empty({n, F}, x.options().dtype(reduced && promote ? torch::kFloat : st));
  if (n == 0 || F == 0) return out;
  if (st == torch::kFloat) run_csr_sum<float, float>(rowptr, col, w, wperm, x, out, mean, max_row);
  else if (st == torch::kDouble) run_csr_sum<double, double>(rowptr, col, w, wperm, x, out, mean, max_row);
  else if (promote) run_csr_sum<c10::BFloat16, float>(rowptr, col, w, wperm, x, out, mean, max_row);
  else run_csr_sum<c10::BFloat16, c10::BFloat16>(rowptr, col, w, wperm, x, out, mean, max_row);
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
  check_inputs("csr_max", rowptr, col, x);
  torch::Tensor w = checked_weight("csr_max", weight, col.numel(), x.options());
  const int64_t max_row = validate_csr("csr_max", rowptr, col, x.size(0));
  const int64_t n = rowptr.numel() - 1, F = x.size(1);
  auto out = pool::empty({n, F}, x.options());
  auto arg = pool::empty({n, F}, x.options().dtype(torch::kInt64));
  if (n == 0 || F == 0) return {out, arg};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "csr_max", [&] {
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "csr_max_idx", [&] {
      const int64_t* rp = rowptr.data_ptr<int64_t>();
      const index_t* cp = col.data_ptr<index_t>();
      const scalar_t* wp = w.defined() ? w.data_ptr<scalar_t>() : nullptr;
      const scalar_t* xp = x.data_ptr<scalar_t>();
      scalar_t* op = out.data_ptr<scalar_t>();
      int64_t* ap = arg.data_ptr<int64_t>();
      constexpr int FB = 32;
      const int64_t nnz = col.numel();
      for_each_task(make_grid<scalar_t>(rp, n, F, max_row), F,
                    [&](int64_t r0, int64_t r1, int64_t fb, int64_t fe) {
                      int64_t f0 = fb;
                      for (; f0 + FB <= fe; f0 += FB)
                        max_rows<scalar_t, index_t, FB>(rp, cp, wp, xp, op, ap, F, r0, r1, f0, nnz);
                      for (; f0 + 8 <= fe; f0 += 8)
                        max_rows<scalar_t, index_t, 8>(rp, cp, wp, xp, op, ap, F, r0, r1, f0, nnz);
                      if (f0 < fe)
                        max_rows_tail<scalar_t, index_t>(rp, cp, wp, xp, op, ap, F, r0, r1, f0, fe - f0);
                    });
    });
  });
  return {out, arg};
}

// ---------------------------------------------------------------- edge dot (SDDMM)
// out[e] = <a[r, :], b[col[e], :]> for every CSR edge e of row r; the gradient of a
// per-edge weight for sum/mean aggregation (a = grad_out, b = x).
torch::Tensor csr_edge_dot(torch::Tensor rowptr, torch::Tensor col, torch::Tensor a,
                           torch::Tensor b) {
  check_inputs("csr_edge_dot", rowptr, col, b);
  TORCH_CHECK(a.device().is_cpu(), "csr_edge_dot: lightning_fullgraph cpp kernels need CPU tensors");
  TORCH_CHECK_VALUE(a.dim() == 2 && a.is_contiguous() && a.scalar_type() == b.scalar_type(),
                    "csr_edge_dot: a must be a contiguous 2-D tensor of b's dtype");
  validate_csr("csr_edge_dot", rowptr, col, b.size(0));
  TORCH_CHECK_VALUE(a.size(0) == rowptr.numel() - 1 && a.size(1) == b.size(1),
                    "csr_edge_dot: a must be [N_dst, F] = [rowptr.numel() - 1, b.size(1)] = [", rowptr.numel() - 1,
                    ", ", b.size(1), "], got [", a.size(0), ", ", a.size(1), "]");
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

// ---------------------------------------------------------------- row-read floor
// csr_sum without its output: the same task grid, feature blocks, tiles and prefetching read
// every edge's source row in CSR order, and each row's sums are added to a [threads, F] buffer
// that stays in cache instead of being written out. Its time is the floor under csr_sum in this
// order on this machine (csr_sum adds only the output rows, each written once). Benchmarks time it
// beside csr_sum (benchmarks/kernels.py, benchmarks/layers.py); training never calls it.
torch::Tensor csr_row_read(torch::Tensor rowptr, torch::Tensor col, torch::Tensor x) {
  check_inputs("csr_row_read", rowptr, col, x);
  const auto st = x.scalar_type();
  TORCH_CHECK_VALUE(st == torch::kFloat || st == torch::kDouble || st == torch::kBFloat16,
                    "csr_row_read: x must be float32, float64 or bfloat16, got ", st);
  TORCH_CHECK_VALUE(x.size(1) % 8 == 0, "csr_row_read: the feature width must be a multiple of 8, got ", x.size(1));
  const int64_t max_row = validate_csr("csr_row_read", rowptr, col, x.size(0));
  const int64_t n = rowptr.numel() - 1, F = x.size(1), nnz = col.numel();
  int threads = num_threads();
#ifdef _OPENMP
  threads = std::max(threads, omp_get_max_threads());  // one sink row per thread the grid can use
#endif
  const auto acc = st == torch::kDouble ? torch::kDouble : torch::kFloat;
  auto sums = torch::zeros({threads, F}, x.options().dtype(acc));
  if (n == 0 || F == 0) return sums;
  AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "csr_row_read_idx", [&] {
    const int64_t* rp = rowptr.data_ptr<int64_t>();
    const index_t* cp = col.data_ptr<index_t>();
    auto run = [&](auto* xp, auto* sp) {
      using scalar_t = std::remove_const_t<std::remove_pointer_t<decltype(xp)>>;
      using acc_t = std::remove_pointer_t<decltype(sp)>;
      for_each_task(make_grid<scalar_t>(rp, n, F, max_row), F, [&](int64_t r0, int64_t r1, int64_t fb, int64_t fe) {
        sum_segment<scalar_t, acc_t, index_t, false>(rp, cp, nullptr, nullptr, xp, sp, F, r0, r1, fb, fe, false, nnz);
      });
    };
    if (st == torch::kFloat) run(x.data_ptr<float>(), sums.data_ptr<float>());
    else if (st == torch::kDouble) run(x.data_ptr<double>(), sums.data_ptr<double>());
    else run(x.data_ptr<c10::BFloat16>(), sums.data_ptr<float>());
  });
  return sums;
}

// ---------------------------------------------------------------- permuted values
// out[i] = values[perm[i]]: per-edge weights from input order to CSR order (forward; backward
// reads them through the transposed CSR's positions inside csr_sum instead). A permutation of
// E scalars is a random 4-8 B read per edge, each a cache miss once the values exceed the L3:
// torch's index_select does them one at a time (~80 ms for 8M on 2 cores), prefetching a few
// dozen ahead keeps enough misses in flight to halve that. perm is trusted to lie in
// [0, values.numel()): callers validate it (the CSR builder makes it).
torch::Tensor take_values(torch::Tensor values, torch::Tensor perm) {
  TORCH_CHECK(values.device().is_cpu() && perm.device().is_cpu(), "take_values: CPU tensors expected");
  TORCH_CHECK_VALUE(values.dim() == 1 && perm.dim() == 1, "take_values: values and perm must be 1-D");
  TORCH_CHECK_VALUE(perm.scalar_type() == torch::kInt32 || perm.scalar_type() == torch::kInt64,
                    "take_values: perm must be int32 or int64");
  values = values.contiguous();
  perm = perm.contiguous();
  const int64_t n = perm.numel();
  auto out = torch::empty({n}, values.options());
  if (n == 0) return out;
  constexpr int64_t kAhead = 32;  // measured: 16-64 alike, 0 is 1.2x slower
  AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "take_values", [&] {
    AT_DISPATCH_INDEX_TYPES(perm.scalar_type(), "take_values_idx", [&] {
      const scalar_t* __restrict v = values.data_ptr<scalar_t>();
      const index_t* __restrict p = perm.data_ptr<index_t>();
      scalar_t* __restrict o = out.data_ptr<scalar_t>();
      at::parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          if (i + kAhead < e) __builtin_prefetch(v + p[i + kAhead], 0, 0);
          o[i] = v[p[i]];
        }
      });
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

// The validation pass of the ops on its own, never cached (tests, overhead
// measurement); returns the largest row length.
int64_t check_csr(torch::Tensor rowptr, torch::Tensor col, int64_t num_src) {
  check_inputs("check_csr", rowptr, col, torch::empty({0, 0}));
  int64_t lo, hi;
  return validate_csr_uncached("check_csr", rowptr, col, num_src, lo, hi);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_prefetch_distance", &set_prefetch_distance, "edges prefetched ahead (tuning)");
  m.def("clear_pool", &pool::clear, "release pooled output buffers");
  m.def("pool_stats", &pool::stats, "[hits, misses, idle bytes, idle buffers, byte limit] of the output pool");
  m.def("install_huge_pages", &huge_pages::install, "huge-page CPU allocator for tensors of >= threshold bytes");
  m.def("uninstall_huge_pages", &huge_pages::uninstall, "torch's default CPU allocator back");
  m.def("huge_pages_installed", &huge_pages::installed, "whether the huge-page allocator is installed");
  m.def("huge_pages_stats", &huge_pages::stats,
        "[large allocations, their bytes, filled from the cache, live peak, live + cached peak] "
        "so far, [cached bytes, ranges] now, bytes filled from the cache so far");
  m.def("huge_pages_set_cache_limit", &huge_pages::set_cache_limit,
        "keep freed large blocks for reuse, up to this many bytes");
  m.def("_huge_pages_move_by_huge_page", &huge_pages::move_by_huge_page,
        "tests only: move cached pages 2 MiB at a time");
  m.def("huge_pages_trim", &huge_pages::trim, "unmap cached blocks beyond this many bytes");
  m.def("counting_sort_perm", &counting_sort_perm, "stable counting-sort permutation");
  m.def("set_validation_cache_size", &vcache::set_capacity,
        "number of validated (rowptr, col) pairs remembered (0: validate on every call)");
  m.def("validation_cache_info", &vcache::info, "[hits, misses, size, capacity] of the validation cache");
  m.def("check_csr", &check_csr, "validate a CSR (rowptr, col, N_src); returns the largest row length");
  m.def("csr_sum", &csr_sum, "CSR sum/mean aggregation", py::arg("rowptr"), py::arg("col"), py::arg("weight"),
        py::arg("x"), py::arg("mean"), py::arg("promote") = false, py::arg("weight_perm") = py::none());
  m.def("csr_max", &csr_max, "CSR max aggregation with arg-max");
  m.def("csr_edge_dot", &csr_edge_dot, "per-edge dot product (SDDMM)");
  m.def("take_values", &take_values, "values[perm] for 1-D values (prefetching gather)");
  m.def("csr_row_read", &csr_row_read,
        "read every edge's source row as csr_sum does, write only [threads, F] sums (the gather's floor)");
}
