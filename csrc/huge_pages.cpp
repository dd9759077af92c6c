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

// Freed mappings kept for reuse (see set_cache_limit), oldest first: a reused block is
// resident already, so the tensor placed there costs no page faults.  A miss first unmaps
// cached blocks (oldest first) worth the new block's length, so cached and live blocks
// together never exceed the most the live ones ever took: the cache does not raise the
// process's peak, it keeps its memory between steps instead.
std::list<std::pair<size_t, void*>> g_free;
size_t g_free_bytes = 0;
std::atomic<size_t> g_free_limit{0};
std::atomic<int64_t> g_reused{0};
// Bytes of our blocks live now, their peak, and the peak of live + cached (under g_mu):
// what the cache's rule keeps equal (stats()).
size_t g_live = 0, g_live_peak = 0, g_total_peak = 0;
void note_live(int64_t delta) {
  g_live += delta;
  g_live_peak = std::max(g_live_peak, g_live);
  g_total_peak = std::max(g_total_peak, g_live + g_free_bytes);
}

// Under g_mu: the newest cached block of exactly `len` bytes, or nullptr; on a miss, the
// cached blocks to unmap (oldest first) so that the new mapping adds nothing to the total.
void* take_cached(size_t len, std::vector<std::pair<size_t, void*>>& evicted) {
  for (auto it = g_free.rbegin(); it != g_free.rend(); ++it) {
    if (it->first != len) continue;
    void* data = it->second;
    g_free.erase(std::next(it).base());
    g_free_bytes -= len;
    g_reused.fetch_add(1, std::memory_order_relaxed);
    return data;
  }
  size_t freed = 0;
  while (freed < len && !g_free.empty()) {
    evicted.push_back(g_free.front());
    freed += g_free.front().first;
    g_free_bytes -= g_free.front().first;
    g_free.pop_front();
  }
  return nullptr;
}

void* map_aligned(size_t n) {
  const size_t len = (n + kPage - 1) / kPage * kPage;
  std::vector<std::pair<size_t, void*>> evicted;
  {
    std::lock_guard<std::mutex> g(g_mu);
    // The same length: training repeats its tensors' sizes every step.
    if (void* cached = take_cached(len, evicted)) {
      g_mapped.emplace(cached, len);
      note_live(len);
      return cached;
    }
  }
  for (auto& [bytes, data] : evicted) munmap(data, bytes);
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
  std::lock_guard<std::mutex> g(g_mu);
  g_mapped.emplace(data, len);
  note_live(len);
  return data;
}

// Frees both kinds of block: our mappings (found by address) and, for anything else, the
// default allocator's (raw_deallocate may hand us a small block of the fallback).
void release(void* data) {
  size_t len = 0;
  bool kept = false;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_mapped.find(data);
    if (it != g_mapped.end()) {
      len = it->second;
      g_mapped.erase(it);
      note_live(-static_cast<int64_t>(len));
      // Kept only while ours is the allocator: otherwise nothing would ever reuse it.
      if (g_free_bytes + len <= g_free_limit.load(std::memory_order_relaxed) && installed()) {
        g_free.emplace_back(len, data);
        g_free_bytes += len;
        kept = true;
      }
    }
  }
  if (len == 0) {
    c10::GetDefaultCPUAllocator()->raw_deleter()(data);
    return;
  }
  c10::profiledCPUMemoryReporter().Delete(data);
  if (!kept) munmap(data, len);
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
          static_cast<int64_t>(g_free.size())};
#else
  return {g_count.load(), g_bytes.load(), 0, 0, 0, 0, 0};
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
  std::vector<std::pair<void*, size_t>> out;
  {
    std::lock_guard<std::mutex> g(g_mu);
    // Oldest first, as on a miss.
    while (!g_free.empty() && g_free_bytes > static_cast<size_t>(std::max<int64_t>(keep, 0))) {
      out.emplace_back(g_free.front().second, g_free.front().first);
      g_free_bytes -= g_free.front().first;
      g_free.pop_front();
    }
  }
  for (auto& [data, len] : out) munmap(data, len);
#endif
}

}  // namespace huge_pages
