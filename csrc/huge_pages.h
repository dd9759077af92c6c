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

// [large allocations served, bytes of them], counted since the process started.
std::vector<int64_t> stats();

}  // namespace huge_pages
