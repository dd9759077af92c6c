// Transparent huge pages for large CPU tensors (see huge_pages.h).
//
// A random-row gather (every aggregation on a graph without locality) misses the TLB on
// almost every row when the rows sit in 4 KiB pages: measured here, the forward of a sum
// over 1M nodes / 16M edges at F = 128 takes 0.64 s in 4 KiB pages and 0.50 s in 2 MiB
// ones.  torch can allocate large tensors in huge pages itself, but only when
// THP_MEM_ALLOC_ENABLE=1 is in the environment before its first allocation, i.e. before
// `import torch`, which a library cannot arrange.  This allocator does it at run time: it
// is torch's default CPU allocator for small sizes; a large block is a mapping of its own,
// 2 MiB-aligned and advised for huge pages, unmapped when freed.
//
// Why mappings and not posix_memalign: glibc serves blocks below its (dynamic, up to
// 32 MiB) mmap threshold from its heap and keeps them there when freed.  Training frees and
// reallocates tensors of many sizes every step, and the heap then held ~95 MiB of free but
// resident memory at a GCN rank's peak (measured with mallinfo2): memory no tensor used.
// A mapping goes back to the kernel at once.  Every block records its length, so the
// deleter (ours, in this library, which is never unloaded) works after uninstall() too.
#include "huge_pages.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <list>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

// Transparent huge pages are a Linux feature; elsewhere install() changes nothing.
#if defined(__linux__)
#include <sys/mman.h>
#define LFG_HAVE_THP 1
#endif

namespace huge_pages {
namespace {

constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kPage = size_t(4) << 10;

std::atomic<int64_t> g_count{0};
std::atomic<int64_t> g_bytes{0};

#ifdef LFG_HAVE_THP
// Length of every live mapping we handed out, by address (the deleter gets the address only).
std::mutex g_mu;
std::unordered_map<void*, size_t> g_mapped;

// Resident pages kept for reuse (see set_cache_limit): the 2 MiB-aligned whole huge pages of
// freed blocks, as ranges [address, address + bytes), oldest first.  A new block is mapped
// fresh and its whole huge pages are then filled with cached ones: mremap() moves the page
// tables, not the data, so the block starts resident and costs no page faults (on this
// kind of machine a fresh page costs more system time than the kernel spends zeroing it).
// Any cached range can fill any block: training's tensor lengths repeat, but not at the
// same moments, and a cache of whole blocks of one length each missed most of the time.
// Only an empty cache leaves fresh pages in a block's huge part, so cached and live bytes
// together never exceed the most the live ones ever took (plus the tails below 2 MiB that
// live blocks map fresh): the cache does not raise the process's peak, it keeps its memory
// between steps instead.
struct Range {
  uintptr_t addr;
  size_t bytes;
};
std::vector<Range> g_free;
size_t g_free_bytes = 0;
std::atomic<size_t> g_free_limit{0};
std::atomic<int64_t> g_reused{0};
std::atomic<int64_t> g_reused_bytes{0};
// Bytes of our blocks live now, their peak, and the peak of live + cached (under g_mu):
// what the cache's rule keeps equal (stats()).
size_t g_live = 0, g_live_peak = 0, g_total_peak = 0;
void note_live(int64_t delta) {
  g_live += delta;
  g_live_peak = std::max(g_live_peak, g_live);
  g_total_peak = std::max(g_total_peak, g_live + g_free_bytes);
}

// Replaces [dst, dst + bytes) with fresh anonymous memory advised for huge pages: what a
// failed move leaves there (mremap may have unmapped the destination before failing).
void map_fresh_at(uintptr_t dst, size_t bytes) {
  void* at = reinterpret_cast<void*>(dst);
  if (mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
      == at)
    madvise(at, bytes, MADV_HUGEPAGE);
}

// Tests set it to take the 2 MiB-at-a-time path of move_pages() on every kernel.
std::atomic<bool> g_move_by_huge_page{false};

// Moves the pages of [src, src + bytes) to dst (both 2 MiB-aligned, bytes a multiple of
// 2 MiB).  A range may span several mappings (a block filled from several cached ranges
// is one mapping per piece), and before Linux 6.17 one mremap() cannot cross them, so a
// failed whole move is retried 2 MiB at a time (every piece boundary is 2 MiB-aligned).
// Returns the bytes moved from the start of the range; the rest of [dst, dst + bytes) is
// fresh memory.
size_t move_pages(uintptr_t src, uintptr_t dst, size_t bytes) {
  auto move = [](uintptr_t from, uintptr_t to, size_t n) {
    return mremap(reinterpret_cast<void*>(from), n, n, MREMAP_MAYMOVE | MREMAP_FIXED,
                  reinterpret_cast<void*>(to)) != MAP_FAILED;
  };
  if (!g_move_by_huge_page.load(std::memory_order_relaxed) && move(src, dst, bytes))
    return bytes;
  map_fresh_at(dst, bytes);
  size_t done = 0;
  for (; done < bytes; done += kHuge) {
    if (!move(src + done, dst + done, kHuge)) {
      map_fresh_at(dst + done, bytes - done);
      break;
    }
  }
  return done;
}

// Under g_mu: fills [data, data + len) with cached pages, from its start, as far as the cache
// and the block's whole huge pages go.  Best fit first (the smallest range that covers the
// rest), else the largest range; a range is split and its remainder stays cached.  Ranges
// that could not be moved are returned in `stuck` for unmapping.
void fill_from_cache(uintptr_t data, size_t len, std::vector<Range>& stuck) {
  const size_t want = len / kHuge * kHuge;
  size_t off = 0;
  while (off < want && !g_free.empty()) {
    const size_t rest = want - off;
    size_t pick = 0;
    bool fits = false;
    for (size_t i = 0; i < g_free.size(); ++i) {
      const size_t b = g_free[i].bytes;
      const bool f = b >= rest;
      if ((f && (!fits || b < g_free[pick].bytes)) || (!f && !fits && b > g_free[pick].bytes)) {
        pick = i;
        fits = f;
      }
    }
    Range& r = g_free[pick];
    const size_t take = std::min(r.bytes, rest);
    const size_t moved = move_pages(r.addr, data + off, take);
    g_free_bytes -= take;
    off += moved;
    if (moved < take) stuck.push_back({r.addr + moved, take - moved});
    r.addr += take;
    r.bytes -= take;
    if (r.bytes == 0) g_free.erase(g_free.begin() + static_cast<std::ptrdiff_t>(pick));
    if (moved < take) break;  // the rest of the block stays fresh
  }
  if (off > 0) {
    g_reused.fetch_add(1, std::memory_order_relaxed);
    g_reused_bytes.fetch_add(static_cast<int64_t>(off), std::memory_order_relaxed);
  }
}

void* map_aligned(size_t n) {
  const size_t len = (n + kPage - 1) / kPage * kPage;
  void* base = mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                    -1, 0);
  if (base == MAP_FAILED) return nullptr;
  // Keep the 2 MiB-aligned part only: huge pages need aligned 2 MiB ranges.
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  const uintptr_t a = (b + kHuge - 1) / kHuge * kHuge;
  if (a > b) munmap(base, a - b);
  const size_t tail = (b + len + kHuge) - (a + len);
  if (tail) munmap(reinterpret_cast<void*>(a + len), tail);
  void* data = reinterpret_cast<void*>(a);
  madvise(data, len, MADV_HUGEPAGE);  // advice only: a refusal leaves 4 KiB pages
  std::vector<Range> stuck;
  {
    std::lock_guard<std::mutex> g(g_mu);
    // Training repeats its tensors' sizes every step: resident pages freed by the last
    // step make this block's pages.
    if (!g_free.empty()) fill_from_cache(a, len, stuck);
    g_mapped.emplace(data, len);
    note_live(len);
  }
  for (const Range& r : stuck) munmap(reinterpret_cast<void*>(r.addr), r.bytes);
  return data;
}

// Frees both kinds of block: our mappings (found by address) and, for anything else, the
// default allocator's (raw_deallocate may hand us a small block of the fallback).
void release(void* data) {
  size_t len = 0;
  size_t kept = 0;  // bytes from the block's start kept in the cache
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_mapped.find(data);
    if (it != g_mapped.end()) {
      len = it->second;
      g_mapped.erase(it);
      note_live(-static_cast<int64_t>(len));
      // Its whole huge pages are kept, up to the limit, and only while ours is the
      // allocator (nothing else would reuse them); the rest is unmapped below.
      const size_t limit = g_free_limit.load(std::memory_order_relaxed);
      if (limit > g_free_bytes && installed()) {
        kept = std::min(len, limit - g_free_bytes) / kHuge * kHuge;
        if (kept > 0) {
          g_free.push_back({reinterpret_cast<uintptr_t>(data), kept});
          g_free_bytes += kept;
        }
      }
    }
  }
  if (len == 0) {
    c10::GetDefaultCPUAllocator()->raw_deleter()(data);
    return;
  }
  c10::profiledCPUMemoryReporter().Delete(data);
  if (kept < len) munmap(static_cast<char*>(data) + kept, len - kept);
}
#endif

class HugePageAllocator final : public c10::Allocator {
 public:
  std::atomic<size_t> threshold{kHuge};

  c10::DataPtr allocate(size_t n) override {
    c10::Allocator* fallback = c10::GetDefaultCPUAllocator();
#ifndef LFG_HAVE_THP
    return fallback->allocate(n);  // never installed there (see install())
#else
    if (n < threshold.load(std::memory_order_relaxed)) return fallback->allocate(n);
    void* data = map_aligned(n);
    if (data == nullptr) {
      c10::profiledCPUMemoryReporter().OutOfMemory(n);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "lightning_fullgraph huge-page allocator: not "
                       "enough memory: you tried to allocate ", n, " bytes.");
    }
    c10::profiledCPUMemoryReporter().New(data, n);
    g_count.fetch_add(1, std::memory_order_relaxed);
    g_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
#endif
  }

  c10::DeleterFnPtr raw_deleter() const override {
#ifdef LFG_HAVE_THP
    return &release;
#else
    return c10::GetDefaultCPUAllocator()->raw_deleter();
#endif
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

// Static lifetime: torch keeps a raw pointer to the CPU allocator in every storage.
HugePageAllocator g_allocator;

}  // namespace

bool install(int64_t threshold) {
  TORCH_CHECK(threshold >= 0, "huge-page threshold must be >= 0, got ", threshold);
#ifndef LFG_HAVE_THP
  return false;
#endif
  g_allocator.threshold.store(static_cast<size_t>(threshold));
  c10::Allocator* now = c10::GetAllocator(c10::DeviceType::CPU);
  if (now == &g_allocator) return true;
  // Someone else's allocator (a profiling or caching one; torch's own THP_MEM_ALLOC_ENABLE
  // path lives inside the default allocator) is not replaced: its frees might not match.
  if (now != c10::GetDefaultCPUAllocator()) return false;
  // Small blocks (the default allocator's) are released by its raw deleter: it must have one.
  if (c10::GetDefaultCPUAllocator()->raw_deleter() == nullptr) return false;
  // Torch's default CPU allocator is registered with priority 0; equal priority replaces.
  c10::SetAllocator(c10::DeviceType::CPU, &g_allocator, 0);
  return c10::GetAllocator(c10::DeviceType::CPU) == &g_allocator;
}

bool uninstall() {
  if (c10::GetAllocator(c10::DeviceType::CPU) != &g_allocator) return false;
  c10::SetAllocator(c10::DeviceType::CPU, c10::GetDefaultCPUAllocator(), 0);
  trim(0);  // cached blocks would never be handed out again
  return true;
}

bool installed() { return c10::GetAllocator(c10::DeviceType::CPU) == &g_allocator; }

void move_by_huge_page(bool on) {
#ifdef LFG_HAVE_THP
  g_move_by_huge_page.store(on);
#endif
}

bool caching() {
#ifdef LFG_HAVE_THP
  return g_free_limit.load(std::memory_order_relaxed) > 0 && installed();
#else
  return false;
#endif
}

std::vector<int64_t> stats() {
#ifdef LFG_HAVE_THP
  std::lock_guard<std::mutex> g(g_mu);
  return {g_count.load(),
          g_bytes.load(),
          g_reused.load(),
          static_cast<int64_t>(g_live_peak),
          static_cast<int64_t>(g_total_peak),
          static_cast<int64_t>(g_free_bytes),
          static_cast<int64_t>(g_free.size()),
          g_reused_bytes.load()};
#else
  return {g_count.load(), g_bytes.load(), 0, 0, 0, 0, 0, 0};
#endif
}

void set_cache_limit(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "huge-page cache limit must be >= 0, got ", bytes);
#ifdef LFG_HAVE_THP
  g_free_limit.store(static_cast<size_t>(bytes));
  trim(bytes);
#endif
}

void trim(int64_t keep) {
#ifdef LFG_HAVE_THP
  std::vector<Range> out;
  {
    std::lock_guard<std::mutex> g(g_mu);
    // Oldest first; a range is cut (its end unmapped) rather than given back whole when
    // that is enough.
    const size_t target = static_cast<size_t>(std::max<int64_t>(keep, 0));
    while (!g_free.empty() && g_free_bytes > target) {
      Range& r = g_free.front();
      const size_t over = (g_free_bytes - target + kHuge - 1) / kHuge * kHuge;
      const size_t cut = std::min(r.bytes, over);
      out.push_back({r.addr + r.bytes - cut, cut});
      r.bytes -= cut;
      g_free_bytes -= cut;
      if (r.bytes == 0) g_free.erase(g_free.begin());
    }
  }
  for (const Range& r : out) munmap(reinterpret_cast<void*>(r.addr), r.bytes);
#endif
}

}  // namespace huge_pages
