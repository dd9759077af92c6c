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

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

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
  std::lock_guard<std::mutex> g(g_mu);
  g_mapped.emplace(data, len);
  return data;
}

// Frees both kinds of block: our mappings (found by address) and, for anything else, the
// default allocator's (raw_deallocate may hand us a small block of the fallback).
void release(void* data) {
  size_t len = 0;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_mapped.find(data);
    if (it != g_mapped.end()) {
      len = it->second;
      g_mapped.erase(it);
    }
  }
  if (len == 0) {
    c10::GetDefaultCPUAllocator()->raw_deleter()(data);
    return;
  }
  c10::profiledCPUMemoryReporter().Delete(data);
  munmap(data, len);
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
  return true;
}

bool installed() { return c10::GetAllocator(c10::DeviceType::CPU) == &g_allocator; }

std::vector<int64_t> stats() { return {g_count.load(), g_bytes.load()}; }

}  // namespace huge_pages
