// Transparent huge pages for large CPU tensors (see huge_pages.h).
//
// A random-row gather (every aggregation on a graph without locality) misses the TLB on
// almost every row when the rows sit in 4 KiB pages: measured here, the forward of a sum
// over 1M nodes / 16M edges at F = 128 takes 0.64 s in 4 KiB pages and 0.50 s in 2 MiB
// ones.  torch can allocate large tensors in huge pages itself, but only when
// THP_MEM_ALLOC_ENABLE=1 is in the environment before its first allocation, i.e. before
// `import torch`, which a library cannot arrange.  This allocator does the same at run
// time: it is torch's default CPU allocator for small sizes, and for large ones the same
// posix_memalign + free pair with a 2 MiB alignment and MADV_HUGEPAGE advice.  Every block
// it hands out is released by the default allocator's own deleter, so a tensor allocated
// while it is installed may outlive it.
#include "huge_pages.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>

// Transparent huge pages are a Linux feature; elsewhere install() changes nothing.
#if defined(__linux__)
#include <sys/mman.h>
#define LFG_HAVE_THP 1
#endif

namespace huge_pages {
namespace {

constexpr size_t kHuge = size_t(2) << 20;

std::atomic<int64_t> g_count{0};
std::atomic<int64_t> g_bytes{0};

class HugePageAllocator final : public c10::Allocator {
 public:
  std::atomic<size_t> threshold{kHuge};

  c10::DataPtr allocate(size_t n) override {
    c10::Allocator* fallback = c10::GetDefaultCPUAllocator();
#ifndef LFG_HAVE_THP
    return fallback->allocate(n);  // never installed there (see install())
#else
    if (n < threshold.load(std::memory_order_relaxed)) return fallback->allocate(n);
    void* data = nullptr;
    if (posix_memalign(&data, kHuge, n) != 0 || data == nullptr) {
      c10::profiledCPUMemoryReporter().OutOfMemory(n);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "lightning_fullgraph huge-page allocator: not "
                       "enough memory: you tried to allocate ", n, " bytes.");
    }
    madvise(data, n, MADV_HUGEPAGE);  // advice only: a refusal leaves 4 KiB pages
    c10::profiledCPUMemoryReporter().New(data, n);
    g_count.fetch_add(1, std::memory_order_relaxed);
    g_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
    // The default allocator's deleter: reports the free to the profiler, then free().
    return {data, data, fallback->raw_deleter(), c10::Device(c10::DeviceType::CPU)};
#endif
  }

  c10::DeleterFnPtr raw_deleter() const override {
    // Both kinds of block are released by it (free() of posix_memalign'd memory).
    return c10::GetDefaultCPUAllocator()->raw_deleter();
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
  // Our blocks are released by the default allocator's raw deleter: it must have one.
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
