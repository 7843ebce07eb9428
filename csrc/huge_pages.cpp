#include "huge_pages.hpp"

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace colgraph {

void advise_huge_pages(const void* data, size_t bytes, bool populated) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (data == nullptr || end <= begin) return;
  void* start = reinterpret_cast<void*>(begin);
  if (madvise(start, end - begin, MADV_HUGEPAGE) != 0) return;
  if (populated) {
    constexpr int kCollapse = 25;  // MADV_COLLAPSE; older headers lack the name, older kernels reject it
    madvise(start, end - begin, kCollapse);
  }
#else
  (void)data, (void)bytes, (void)populated;
#endif
}

}  // namespace colgraph
