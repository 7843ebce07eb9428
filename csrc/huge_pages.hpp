// Transparent huge pages for large arrays that are read at random.
//
// A BFS over a million-node graph reads to[e], os[u] and score rows at random across tens of
// megabytes; with 4 KiB pages nearly every such read also misses the TLB, and the page walks
// (few may run at once) cap how many reads overlap. Linux backs a range advised with
// MADV_HUGEPAGE by 2 MiB pages (needed when THP is in "madvise" mode, the common default).
// Advice only: where it is refused, nothing changes but speed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace colgraph {

// Advises the 2 MiB-aligned part of [data, data + bytes). Call it before the range is first
// written; with `populated` the pages already written are also collapsed into huge pages now
// (MADV_COLLAPSE, Linux >= 6.1), which copies them once.
void advise_huge_pages(const void* data, size_t bytes, bool populated);

}  // namespace colgraph
