// Transparent huge pages for large CPU tensors: a CPU allocator installed at run time.
#pragma once

#include <cstdint>
#include <vector>

namespace huge_pages {

// Makes torch's CPU allocations of at least `threshold` bytes 2 MiB-aligned mappings of their
// own, advised for transparent huge pages and unmapped when freed (smaller ones stay with
// torch's default allocator).  Returns whether ours is now the CPU allocator: false if another component
// replaced torch's default allocator (then nothing is changed).
bool install(int64_t threshold);

// Gives torch's default CPU allocator back (tensors already allocated keep their deleter).
// Returns whether ours was installed.
bool uninstall();

bool installed();

// [large allocations served, bytes of them, of them filled (in part) from the cache, most
// bytes live at once, most bytes live and cached at once] counted since the process started,
// then [bytes, ranges] in the cache now, then the bytes filled from the cache so far.
std::vector<int64_t> stats();

// The whole huge pages of freed large blocks are kept, resident, up to `bytes` in all, and
// fill the next large blocks (0, the default: every block is unmapped when freed); lowering
// the limit unmaps what exceeds it.
void set_cache_limit(int64_t bytes);

// Tests only: whether the cache moves pages 2 MiB at a time, the path a move crossing
// mappings takes on kernels before Linux 6.17.
void move_by_huge_page(bool on);

// Unmaps cached pages (oldest first) until at most `keep` bytes stay cached.
void trim(int64_t keep);

// Whether freed blocks are kept (a limit above 0) and the allocator is installed: then the
// kernels' own output pool steps aside, so that one cache, with one rule, holds them all.
bool caching();

}  // namespace huge_pages
